// Hugging Face: the checkpoint's own names (transformers' modeling_<arch>.py,
// frameworks/architectures.cc), on one rank ("hf") or in plain tensor-parallel
// row/column shards ("hf:tp=N": column-parallel weights cut by rows,
// row-parallel ones by columns, the vocabulary by rows, heads as vLLM's
// QKVParallelLinear cuts them). For tests and checkpoint export. An FP8
// checkpoint (quantization_config) is stored as it is: block-scaled linear
// weights with their `weight_scale_inv`. gpt-oss: the experts' biases as the
// checkpoint fuses them (gate_up_proj_bias [E, 2I], gate and up alternating;
// down_proj_bias [E, H]); the experts' weights, which the checkpoint holds
// transposed ([E, H, 2I], [E, I, H]), under the model spec's per-expert
// [out, in] names (a layout does not transpose), said in the notes.
#include <set>

#include "frameworks/layout_builder.h"
#include "runtime/error.h"

namespace reshard::init {
namespace {

using nlohmann::ordered_json;

ordered_json MakeHf(const Arch& a, const std::string& model, Settings& s, Notes& notes) {
  const int64_t tp = s.tp;
  const bool kv_replicated = HeadsOverTp(a, s, "a plain HF TP split", notes);
  const QuantFormat q = QuantOf(a, "");  // the checkpoint's own format
  for (const auto& t : a.tensors) {
    const Cut c = CutOf(t.role);
    if (c == Cut::replicate || c == Cut::vocab || c == Cut::expert_whole) continue;
    const int dim = (c == Cut::row || c == Cut::expert_row) ? 1 : 0;
    const bool replicated_kv = kv_replicated && (t.role == Role::k || t.role == Role::v || t.role == Role::k_bias ||
                                                 t.role == Role::v_bias || t.role == Role::k_odd);
    const int64_t per = replicated_kv ? t.shape[dim] / a.kv_heads : t.shape[dim] / tp;
    if (!replicated_kv && t.shape[dim] % tp != 0)
      FailTp(s, "a plain HF TP split splits it evenly over TP; " + t.name + " dim " + S(dim) + " is " + S(t.shape[dim]));
    // The checkpoint's block scales cut with their weights: each rank's slice
    // a whole number of blocks (the rule vLLM's quantization/fp8.py
    // validate_fp8_block_shape states, and says so).
    if (!q.kind.empty() && q.block_rows > 0 && IsQuantized(t.role) && tp > 1) {
      const int64_t block = dim == 0 ? q.block_rows : q.block_cols;
      if (per % block != 0)
        FailTp(s, "vLLM refuses block-quantized weights whose per-rank slice is not a whole number of " + S(block) +
                      "-blocks (quantization/fp8.py validate_fp8_block_shape): " + t.name + " dim " + S(dim) + " is " +
                      S(t.shape[dim]) + " / " + S(tp) + " = " + S(per));
    }
  }
  Builder b;
  b.AddMesh("dense", {{"tp", tp}});
  const VocabSplit vocab = SplitVocab(a.vocab, 0, tp);
  if (a.vocab % tp != 0) FailTp(s, "a plain HF TP split needs vocab_size (" + S(a.vocab) + ") divisible by tp");

  for (const auto& t : a.tensors) {
    const Cut c = CutOf(t.role);
    std::vector<std::pair<std::string, ordered_json>> axes;
    if (IsExpert(t.role)) {
      if (c != Cut::expert_whole) axes.push_back({"tp", Shard(c == Cut::expert_row ? 1 : 0)});
    } else {
      AddTpAxis(t, kv_replicated, a.kv_heads, vocab, axes);
    }
    b.Place(t, "dense", axes);
    // gpt-oss: the checkpoint's fused expert biases (the expert dim kept in the buffer).
    const std::string experts = t.name.substr(0, t.name.find(".{expert}."));
    if (t.role == Role::expert_gate_bias) {
      b.Buffer({{"name", experts + ".gate_up_proj_bias"},
                {"parts", {t.name, Find(a, Role::expert_up_bias)->name}},
                {"interleave", {{"dim", 0}, {"groups", t.shape[0]}}}});
      continue;
    }
    if (t.role == Role::expert_down_bias) {
      b.Buffer({{"name", experts + ".down_proj_bias"}, {"parts", {t.name}}});
      continue;
    }
    // The checkpoint's tensors the spec splits (Qwen3-Next, Llama 4), fused back.
    if (InCheckpointFusion(a, t)) {
      if (ordered_json rule = CheckpointFusion(a, t); !rule.is_null()) b.Buffer(rule);
      continue;
    }
    // Buffers keep the HF names (default_buffers); a rule only for quantized storage.
    if (q.kind.empty() || !IsQuantized(t.role)) continue;
    b.Buffer({{"name", t.name}, {"parts", {t.name}}, {"quant", QuantJson(q, t.name)}});
  }
  std::string lname = "hf";
  if (tp > 1) lname += "-tp" + S(tp);
  if (!q.kind.empty()) lname += "-" + q.kind;
  if (a.experts_transposed) {
    const ArchTensor* g = Find(a, Role::expert_gate);
    const std::string fused = g->name.substr(0, g->name.find(".{expert}."));
    notes.push_back(s.option + ": the experts' weights are written per expert as [out, in] (" + g->name +
                    ", ...): the " + a.model_type + " checkpoint holds them transposed and fused (" + fused +
                    ".gate_up_proj [" + S(a.experts) + ", " + S(a.hidden) + ", 2 x " + S(g->shape[0]) + "] " +
                    (a.interleaved_gate_up ? "with gate and up in alternate columns"
                                           : "with gate in the first " + S(g->shape[0]) + " columns, up in the rest") +
                    ", down_proj [" + S(a.experts) + ", " + S(g->shape[0]) + ", " + S(a.hidden) +
                    "]), which a layout cannot express (no transposes)" +
                    (Find(a, Role::expert_gate_bias)
                         ? "; the experts' biases are the checkpoint's gate_up_proj_bias and down_proj_bias"
                         : "") +
                    (a.mxfp4_release ? "; the release's MXFP4 experts (*_blocks, *_scales) are not written: this is "
                                       "the BF16 form"
                                     : ""));
  }
  const std::string note = "Hugging Face checkpoint names" + std::string(tp > 1 ? ", plain TP row/column shards" : "") +
                           (q.kind.empty() ? "" : ", FP8 block-scaled linear weights as the checkpoint stores them") +
                           (a.experts_transposed ? ", experts' weights per expert [out, in] (the checkpoint holds "
                                                   "them transposed)"
                                                 : "") +
                           "; generated by reshard init";
  return b.Finish(lname, model, tp, true, note);
}

void Set(Settings& s, const std::string& key, const std::string& value) {
  if (key == "tp") s.tp = PositiveInt(s, key, value);
}

}  // namespace

const FrameworkDef& HfFramework() {
  static const FrameworkDef def{"hf", "hf[:tp=N]", {"tp"}, {}, {}, true, Set, MakeHf};
  return def;
}

}  // namespace reshard::init
