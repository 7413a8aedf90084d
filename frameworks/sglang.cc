// SGLang 0.5.23: what its ranks hold for each tensor role (names, fused
// buffers, FP8 block storage, how TP, attention DP, EP and shared-expert
// fusion cut it), and its settings
// "sglang:tp=8,ep=8,attn-dp=8,engines=2,shared-experts=fused|tp|replicated,dense-tp=1,dp-lm-head,quant=...".
// Sources (SGLang 0.5.23, paths under sglang/srt/):
//  - runtime_context.py derive_spawn_ranks / derive_attention_ranks: one
//    engine's world rank is its TP rank (pp 1); attention DP lives inside
//    the TP group (tp_rank = attn_dp_rank x attn_tp_size + attn_tp_rank,
//    attn_tp_size = tp / attn_dp), and so does expert parallelism
//    (moe_ep_rank = tp_rank // (tp / ep), moe_tp_rank = tp_rank % (tp / ep)).
//  - layers/linear.py QKVParallelLinear (KV heads replicated when the group
//    is wider than them), MergedColumnParallelLinear, RowParallelLinear,
//    _resolve_linear_group ("tp" is the whole TP group, "attn_tp" the
//    attention-TP group, "replicated" none); layers/vocab_parallel_embedding.py
//    VocabParallelEmbedding (the vocabulary padded to a multiple of 64, or of
//    64 x the group size when the padded size does not divide, split evenly).
//  - models/llama.py LlamaModel / LlamaAttention (the whole TP group; embed
//    and lm_head over it), models/qwen2_moe.py Qwen2MoeModel (embed_tokens
//    over the attention-TP group under DP attention), models/qwen3_moe.py
//    Qwen3MoeAttention (parallel_group="attn_tp"), Qwen3MoeSparseMoeBlock,
//    Qwen3MoeForCausalLM (lm_head over the whole TP group unless
//    enable_dp_lm_head: use_attn_tp_group).
//  - models/deepseek_v2.py DeepseekV2AttentionMLA (fused_qkv_a_proj_with_mqa
//    = [q_a_proj; kv_a_proj_with_mqa], a ReplicatedLinear, with q LoRA;
//    q_b_proj, kv_b_proj, o_proj over "attn_tp"), DeepseekV2DecoderLayer
//    (dense MLP over "tp", "replicated" when moe_dense_tp_size == 1:
//    layers/layer_boundary/layout.py is_dense_ffn_fully_dp), DeepseekV2MoE
//    (shared_experts over "tp", "replicated" under DeepEP-class all-to-all
//    backends or SGLANG_SHARED_EXPERT_TP1; none when fused), MoEGate
//    (e_score_correction_bias fp32), DeepseekV2ForCausalLM
//    shared_experts_fusion_disable_reason (fusion is SGLang's default only for
//    DeepseekV3ForCausalLM with 256 routed experts and one shared expert on
//    CUDA sm80+ at EP 1, or when --enforce-shared-experts-fusion).
//  - layers/moe/fused_moe_triton/layer.py FusedMoE (w13_weight [E_local, 2I /
//    moe_tp, H] and w2_weight [E_local, H, I / moe_tp]; E_local = E / ep,
//    asserting E % ep == 0; a fused shared expert in slot E_local of every
//    rank, cut over moe_tp like a routed one: _map_global_expert_id_to_local_expert_id).
//  - layers/quantization/fp8.py Fp8LinearMethod.validate_block_quant_shapes
//    (a TP-cut linear's slice, and every part of a merged one, whole blocks)
//    and Fp8MoEMethod.create_weights (each expert's intermediate slice whole
//    blocks): `weight_scale_inv`, `w13_weight_scale_inv`, `w2_weight_scale_inv`.
//  The tensors SGLang holds beyond the checkpoint (FP8 attention k_scale /
//  v_scale, MLA's w_kc / w_vc / w_scale): frameworks/sglang_engine.cc.
//  Checked against per-rank dumps of real SGLang 0.5.23 ranks
//  (tests/data/recorded/sglang-*, tests/recorded_dumps_test.cc).
#include <algorithm>
#include <set>

#include "compiler/spec.h"
#include "frameworks/layout_builder.h"
#include "runtime/error.h"

namespace reshard::init {
namespace {

using nlohmann::ordered_json;
using Axes = std::vector<std::pair<std::string, ordered_json>>;

const char* kSglang = "SGLang 0.5.23";

// The architectures whose SGLang model classes this file describes.
bool Described(const Arch& a) {
  return a.model_type == "llama" || a.model_type == "qwen2" || a.model_type == "qwen3" ||
         a.model_type == "qwen3_moe" || a.model_type == "deepseek_v3";
}

// Models whose attention (and input embedding) SGLang runs over the
// attention-TP group under DP attention (models/qwen3_moe.py parallel_group="attn_tp",
// models/qwen2_moe.py Qwen2MoeModel, models/deepseek_v2.py); llama.py, qwen2.py
// and qwen3.py use the whole TP group.
bool AttnDpModel(const Arch& a) { return a.model_type == "qwen3_moe" || a.model_type == "deepseek_v3"; }

bool IsShared(Role r) { return r == Role::shared_gate || r == Role::shared_up || r == Role::shared_down; }
bool IsAttention(Role r) {
  switch (r) {
    case Role::q: case Role::k: case Role::v: case Role::q_bias: case Role::k_bias: case Role::v_bias: case Role::o:
    case Role::mla_q: case Role::mla_q_b: case Role::mla_kv_b:
      return true;
    default: return false;
  }
}
bool IsKv(Role r) { return r == Role::k || r == Role::v || r == Role::k_bias || r == Role::v_bias; }
bool IsDense(Role r) { return r == Role::gate || r == Role::up || r == Role::down; }

// SGLang's buffer name of a role (each model's stacked_params_mapping and
// FusedMoE's parameters).
std::string SglangName(const Arch& a, const ArchTensor& t) {
  switch (t.role) {
    case Role::q: case Role::k: case Role::v: return Rename(Find(a, Role::q)->name, "q_proj.weight", "qkv_proj.weight");
    case Role::q_bias: case Role::k_bias: case Role::v_bias:
      return Rename(Find(a, Role::q_bias)->name, "q_proj.bias", "qkv_proj.bias");
    case Role::gate: case Role::up: return Rename(Find(a, Role::gate)->name, "gate_proj.weight", "gate_up_proj.weight");
    case Role::shared_gate: case Role::shared_up:
      return Rename(Find(a, Role::shared_gate)->name, "gate_proj.weight", "gate_up_proj.weight");
    case Role::mla_q_a: case Role::mla_kv_a:
      if (Find(a, Role::mla_q_a))
        return Rename(Find(a, Role::mla_q_a)->name, "q_a_proj.weight", "fused_qkv_a_proj_with_mqa.weight");
      return t.name;
    case Role::expert_gate: case Role::expert_up: case Role::expert_down: {
      const std::string prefix = t.name.substr(0, t.name.find(".{expert}."));
      return prefix + (t.role == Role::expert_down ? ".w2_weight" : ".w13_weight");
    }
    default: return t.name;
  }
}

// KV heads over a group of `n` ranks: divided, or replicated n / kv_heads
// times when n exceeds them (QKVParallelLinear; the models assert it).
bool KvReplicated(const Arch& a, const Settings& s, int64_t n, const std::string& group, Notes& notes) {
  if (a.heads % n != 0)
    FailTp(s, "SGLang needs num_attention_heads (" + S(a.heads) + ") divisible by the " + group + " size (" + S(n) +
                  ")");
  if (a.mla || n <= a.kv_heads) {
    if (!a.mla && a.kv_heads % n != 0)
      FailTp(s, "SGLang needs num_key_value_heads (" + S(a.kv_heads) + ") divisible by the " + group + " size (" +
                    S(n) + ") (layers/linear.py QKVParallelLinear)");
    return false;
  }
  if (n % a.kv_heads != 0)
    FailTp(s, "SGLang replicates KV heads when the " + group + " size (" + S(n) +
                  ") exceeds them: it must be a multiple of num_key_value_heads (" + S(a.kv_heads) + ")");
  notes.push_back(s.option + ": " + group + " " + S(n) + " > " + S(a.kv_heads) + " KV heads: each KV head replicated on " +
                  S(n / a.kv_heads) + " ranks");
  return true;
}

// fp8.py's message for a slice that is not whole blocks.
[[noreturn]] void FailBlock(const Settings& s, const std::string& what, int64_t size, const char* block_name,
                            int64_t block, const std::string& where, const std::string& tensor) {
  FailTp(s, "SGLang refuses it (" + where + "): \"" + what + " = " + S(size) + " is not divisible by weight quantization " +
                block_name + " = " + S(block) + ".\" (" + tensor + ")",
         true);
}

ordered_json MakeSglang(const Arch& a, const std::string& model, Settings& s, Notes& notes) {
  if (!Described(a))
    Fail(s, "reshard init describes SGLang engines for llama, qwen2, qwen3, qwen3_moe, deepseek_v3 and kimi_k2; '" +
                a.model_type + "' is not described yet");
  const int64_t tp = s.tp, ep = s.ep, attn_dp = s.attn_dp, engines = s.engines;
  if (tp % attn_dp != 0)
    Fail(s, "SGLang needs tp_size divisible by attn_dp_size (" + S(tp) + " % " + S(attn_dp) +
                " != 0; arg_groups/parallel_hook.py): attention DP groups split the TP group");
  if (attn_dp > 1 && !AttnDpModel(a))
    Fail(s, "reshard init describes attention DP for qwen3_moe, deepseek_v3 and kimi_k2 only; SGLang's " + a.model_type +
                " model runs its attention over the whole TP group");
  if (ep > 1 && a.experts == 0) Fail(s, "the model has no experts; leave out ep");
  if (tp % ep != 0)
    Fail(s, "SGLang runs expert parallelism inside the TP group (runtime_context.py derive_spawn_ranks: moe_ep_rank = "
            "tp_rank // (tp_size // ep_size)): ep (" + S(ep) + ") must divide tp (" + S(tp) + ")");
  if (a.experts > 0 && a.experts % ep != 0)
    Fail(s, "SGLang's FusedMoE asserts num_experts % ep_size == 0 (layers/moe/fused_moe_triton/layer.py FusedMoE: "
            "_num_global_routed % storage_ep_size == 0): " + S(a.experts) + " experts over ep " + S(ep));
  if (s.dense_tp > 1) Fail(s, "dense-tp takes 1 (moe_dense_tp_size 1: the dense MLP replicated); leave it out for tp");
  if (s.dense_tp == 1 && a.model_type != "deepseek_v3")
    Fail(s, "dense-tp=1 is read by SGLang's DeepSeek models only (models/deepseek_v2.py DeepseekV2DecoderLayer)");
  if (s.dp_lm_head && attn_dp == 1)
    Fail(s, "dp-lm-head splits lm_head over the attention-TP group: it needs attn-dp > 1");
  const int64_t attn_tp = tp / attn_dp, moe_tp = tp / ep;
  if (a.model_type == "qwen3_moe" && moe_tp > a.experts)
    Fail(s, "SGLang's Qwen3MoeSparseMoeBlock refuses a MoE TP size (tp / ep = " + S(moe_tp) +
                ") greater than the number of experts (" + S(a.experts) + ")");
  if (a.model_type == "deepseek_v3" && a.experts > 0 && tp > a.experts)
    Fail(s, "SGLang's DeepseekV2MoE refuses \"Tensor parallel size " + S(tp) + " is greater than the number of experts " +
                S(a.experts) + ".\" (models/deepseek_v2.py)");

  // Shared experts: fused into the routed experts' slot E_local, cut over the
  // whole TP group, or whole on every rank.
  const ArchTensor* shared = Find(a, Role::shared_gate);
  std::string se = s.shared_experts;
  if (!se.empty() && !shared) Fail(s, "the model has no shared experts; leave out shared-experts");
  if (shared && se.empty()) {
    // DeepseekV2ForCausalLM.shared_experts_fusion_disable_reason, on a GPU
    // (CUDA sm80+) with the default all-to-all backend and no SBO/TBO.
    const bool fused_default =
        a.experts == 256 && shared->shape[0] == Find(a, Role::expert_gate)->shape[0] && ep == 1;
    se = fused_default ? "fused" : "tp";
    if (fused_default)
      notes.push_back(s.option + ": SGLang fuses DeepSeek-V3/R1's shared expert into the routed experts by default "
                      "on CUDA sm80+ at EP 1 (models/deepseek_v2.py shared_experts_fusion_disable_reason): slot " +
                      S(a.experts) + " of w13_weight / w2_weight, split like a routed expert; shared-experts=tp for "
                      "an engine started with --disable-shared-experts-fusion");
  }
  const QuantFormat q = QuantOf(a, s.quant);
  if (!q.kind.empty() && q.kind != "fp8-block")
    Fail(s, "reshard init describes SGLang engines in BF16 or FP8 block scales (quant=none or fp8-block)");
  if (q.kind == "fp8-block" && !a.fp8_block)
    Fail(s, "SGLang serves FP8 block-quantized weights from an FP8 block checkpoint (quantization_config with "
            "weight_block_size); this config has none");
  if (se == "fused")
    Fail(s, "SGLang holds a fused shared expert in slot " + S(a.experts / ep) + " of every rank's w13_weight / "
            "w2_weight (layers/moe/fused_moe_triton/layer.py FusedMoE), a place reshard's layouts cannot name yet; "
            "start SGLang with --disable-shared-experts-fusion and write shared-experts=tp");

  const bool attn_group = AttnDpModel(a) && attn_dp > 1;  // attention over attn_tp
  const int64_t attn_n = attn_group ? attn_tp : tp;
  const bool kv_replicated = KvReplicated(a, s, attn_n, attn_group ? "attention TP" : "TP", notes);
  const int64_t dense_n = s.dense_tp == 1 ? 1 : tp;
  const int64_t shared_n = se == "replicated" ? 1 : tp;

  // What cuts each role, and the FP8 block checks of fp8.py on it.
  for (const auto& t : a.tensors) {
    const Cut c = CutOf(t.role);
    if (c == Cut::replicate || c == Cut::vocab || c == Cut::expert_whole) continue;
    if (IsShared(t.role) && se == "fused") continue;
    const bool expert = IsExpert(t.role);
    const int64_t n = expert ? moe_tp : IsAttention(t.role) ? attn_n : IsShared(t.role) ? shared_n
                                                                     : IsDense(t.role) ? dense_n : tp;
    const int dim = (c == Cut::row || c == Cut::expert_row) ? 1 : 0;
    const bool kv = kv_replicated && IsKv(t.role);
    const int64_t per = kv ? t.shape[dim] / a.kv_heads : t.shape[dim] / n;
    if (!kv && t.shape[dim] % n != 0)
      FailTp(s, "SGLang splits it evenly over " + S(n) + " ranks; " + t.name + " dim " + S(dim) + " is " +
                    S(t.shape[dim]));
    if (q.kind.empty() || !IsQuantized(t.role)) continue;
    if (expert) {  // Fp8MoEMethod.create_weights: the expert's intermediate slice
      const int64_t inter = per;
      if (inter % q.block_rows != 0)
        FailBlock(s, "The output_size of gate's and up's weight", inter, "block_n", q.block_rows,
                  "layers/quantization/fp8.py Fp8MoEMethod.create_weights", t.name);
      if (moe_tp > 1 && inter % q.block_cols != 0)
        FailBlock(s, "The input_size of down's weight", inter, "block_k", q.block_cols,
                  "layers/quantization/fp8.py Fp8MoEMethod.create_weights", t.name);
      continue;
    }
    // Fp8LinearMethod.validate_block_quant_shapes: a row-parallel slice whole
    // block_k; a column-parallel slice, or any part of a merged linear
    // (qkv_proj, gate_up_proj), whole block_n.
    const bool merged = t.role == Role::q || t.role == Role::k || t.role == Role::v || t.role == Role::gate ||
                        t.role == Role::up || t.role == Role::shared_gate || t.role == Role::shared_up;
    const std::string where = "layers/quantization/fp8.py Fp8LinearMethod.validate_block_quant_shapes";
    if (dim == 1 && n > 1 && per % q.block_cols != 0)
      FailBlock(s, "Weight input_size_per_partition", per, "block_k", q.block_cols, where, t.name);
    if (dim == 0 && (n > 1 || merged) && per % q.block_rows != 0)
      FailBlock(s, "Weight output_partition_size", per, "block_n", q.block_rows, where, t.name);
  }

  Builder b;
  // One engine: TP ranks in order; attention DP and EP split the same ranks
  // (attn_dp x attn_tp and ep x moe_tp, TP fastest inside each).
  b.AddMesh("tp", {{"engine", engines}, {"tp", tp}});
  b.AddMesh("attn", {{"engine", engines}, {"attn_dp", attn_dp}, {"attn_tp", attn_tp}});
  if (a.experts > 0) b.AddMesh("expert", {{"engine", engines}, {"ep", ep}, {"moe_tp", moe_tp}});

  // The vocabulary: the input embedding over the attention-TP group under DP
  // attention (Qwen2MoeModel, get_embedding_tp_kwargs), lm_head over the whole
  // TP group unless dp-lm-head; each padded to 64, or 64 x its group size.
  auto vocab_over = [&](int64_t n, const std::string& what) {
    int64_t multiple = 64;
    if (SplitVocab(a.vocab, 64, 1).padded % n != 0) multiple *= n;
    VocabSplit v = SplitVocab(a.vocab, multiple, n);
    if (v.padded != a.vocab)
      notes.push_back(s.option + ": SGLang pads the vocabulary of " + what + " " + S(a.vocab) + " -> " + S(v.padded) +
                      " (" + S(v.per_rank) + " rows per rank of " + S(n) + ")");
    return v;
  };
  const bool embed_attn = attn_group, head_attn = attn_group && s.dp_lm_head;
  const VocabSplit embed_vocab = vocab_over(embed_attn ? attn_tp : tp, "embed_tokens");
  const VocabSplit head_vocab = a.tied ? embed_vocab : vocab_over(head_attn ? attn_tp : tp, "lm_head");
  if (se == "tp" && shared && tp > 1)
    notes.push_back(s.option + ": the shared experts cut over the whole TP group (" + S(tp) + " ranks)" +
                    (attn_dp > 1 ? ", not the attention-TP group" : "") +
                    (ep > 1 ? "; under a DeepEP-class all-to-all backend SGLang holds them whole: shared-experts=replicated"
                            : ""));
  if (se == "replicated")
    notes.push_back(s.option + ": the shared experts whole on every rank (SGLang under DeepEP-class all-to-all "
                    "backends or SGLANG_SHARED_EXPERT_TP1: models/deepseek_v2.py DeepseekV2MoE)");
  if (s.dense_tp == 1)
    notes.push_back(s.option + ": dense-tp=1 (--moe-dense-tp-size 1): the dense layers' MLP whole on every rank");
  // layers/quantization/fp8.py Fp8LinearMethod.process_weights_after_loading:
  // with DeepGEMM on sm100 / sm120 (layers/deep_gemm_wrapper/configurer.py
  // DEEPGEMM_SCALE_UE8M0) the block scales are requantized to powers of two
  // in place (requant_block_scale_ue8m0_for_deepgemm); elsewhere they stay
  // the checkpoint's.
  if (q.kind == "fp8-block")
    notes.push_back(s.option + ": FP8 block scales as the checkpoint holds them (weight_scale_inv, fp32), what SGLang "
                    "keeps on Hopper; with DeepGEMM on Blackwell (sm100) it requantizes them to powers of two in place "
                    "(layers/quantization/fp8.py, requant_block_scale_ue8m0_for_deepgemm)");
  if (engines > 1)
    notes.push_back(s.option + ": engines=" + S(engines) + " is " + S(engines) + " independent SGLang engines of TP " +
                    S(tp) + " (--dp-size " + S(engines) + " starts them as data-parallel replicas), each holding the "
                    "whole model");

  // Placements.
  std::set<std::string> done;
  for (const auto& t : a.tensors) {
    const Cut c = CutOf(t.role);
    Axes axes;
    if (IsExpert(t.role)) {
      axes.push_back({"ep", {{"shard", "expert"}}});
      if (c != Cut::expert_whole) axes.push_back({"moe_tp", Shard(c == Cut::expert_row ? 1 : 0)});
      b.Place(t, "expert", axes);
    } else if (IsShared(t.role) && se == "fused") {
      // The shared expert in slot E_local of the experts' buffers, split over moe_tp like a routed expert.
      axes.push_back({"moe_tp", Shard(t.role == Role::shared_down ? 1 : 0)});
      b.Place(t, "expert", axes);
    } else if (t.role == Role::embed) {
      if (!embed_vocab.axis.is_null()) axes.push_back({embed_attn ? "attn_tp" : "tp", embed_vocab.axis});
      b.Place(t, embed_attn ? "attn" : "tp", axes);
    } else if (t.role == Role::lm_head) {
      if (!head_vocab.axis.is_null()) axes.push_back({head_attn ? "attn_tp" : "tp", head_vocab.axis});
      b.Place(t, head_attn ? "attn" : "tp", axes);
    } else if (IsAttention(t.role) && attn_group) {
      Axes tp_axes;
      AddTpAxis(t, kv_replicated, a.kv_heads, embed_vocab, tp_axes);
      for (auto& [axis, spec] : tp_axes) axes.push_back({"attn_tp", spec});
      b.Place(t, "attn", axes);
    } else if ((IsShared(t.role) && se == "replicated") || (IsDense(t.role) && s.dense_tp == 1)) {
      b.Place(t, "tp", axes);
    } else {
      AddTpAxis(t, kv_replicated, a.kv_heads, embed_vocab, axes);
      b.Place(t, "tp", axes);
    }
  }

  // Buffer rules.
  for (const auto& t : a.tensors) {
    const Cut c = CutOf(t.role);
    const bool quantized = !q.kind.empty() && IsQuantized(t.role);
    if (IsShared(t.role) && se == "fused") continue;  // in the experts' rules
    const std::string buf = SglangName(a, t);
    if (!done.insert(buf).second) continue;
    ordered_json rule = {{"name", buf}};
    if (t.role == Role::q || t.role == Role::q_bias) {
      const bool bias = t.role == Role::q_bias;
      rule["parts"] = {t.name, Find(a, bias ? Role::k_bias : Role::k)->name, Find(a, bias ? Role::v_bias : Role::v)->name};
      rule["concat"] = 0;
    } else if (t.role == Role::gate || t.role == Role::shared_gate || t.role == Role::expert_gate) {
      rule["parts"] = {t.name, Find(a, UpOf(t.role))->name};
      rule["concat"] = 0;
    } else if (t.role == Role::mla_q_a) {
      rule["parts"] = {t.name, Find(a, Role::mla_kv_a)->name};
      rule["concat"] = 0;
    } else {
      rule["parts"] = {t.name};
    }
    if (quantized) rule["quant"] = QuantJson(q, buf);
    const VocabSplit& v = t.role == Role::embed ? embed_vocab : head_vocab;
    if (c == Cut::vocab && v.padded != a.vocab) rule["shape"] = {v.per_rank, a.hidden};
    if (buf == t.name && !quantized && !rule.contains("shape")) continue;  // default buffers keep HF names
    b.Buffer(rule);
  }
  std::string lname = "sglang-tp" + S(tp);
  if (attn_dp > 1) lname += "-attn-dp" + S(attn_dp);
  if (ep > 1) lname += "-ep" + S(ep);
  if (engines > 1) lname += "-x" + S(engines);
  if (!q.kind.empty()) lname += "-" + q.kind;
  std::string note = kSglang;
  if (engines > 1) note += ", " + S(engines) + " independent engines";
  note += ", TP " + S(tp);
  if (attn_dp > 1) note += ", attention DP " + S(attn_dp) + " (attention TP " + S(attn_tp) + ")";
  if (ep > 1) note += ", expert parallel " + S(ep) + " (MoE TP " + S(moe_tp) + ")";
  if (shared) note += ", shared experts " + se;
  if (!q.kind.empty()) note += ", " + q.kind + " linear weights";
  note += "; generated by reshard init";
  return b.Finish(lname, model, engines * tp, true, note);
}

void Set(Settings& s, const std::string& key, const std::string& value) {
  if (key == "tp") s.tp = PositiveInt(s, key, value);
  else if (key == "ep") s.ep = PositiveInt(s, key, value);
  else if (key == "attn-dp") s.attn_dp = PositiveInt(s, key, value);
  else if (key == "engines") s.engines = PositiveInt(s, key, value);
  else if (key == "dense-tp") s.dense_tp = PositiveInt(s, key, value);
  else if (key == "dp-lm-head") s.dp_lm_head = true;
  else if (key == "shared-experts") {
    static const std::vector<std::string> kinds = {"fused", "tp", "replicated"};
    if (std::find(kinds.begin(), kinds.end(), value) == kinds.end())
      Fail(s, "'shared-experts' expects one of " + Join(kinds) + ", got '" + value + "'" + DidYouMean(value, kinds));
    s.shared_experts = value;
  } else if (key == "quant") {
    static const std::vector<std::string> kinds = {"none", "fp8-block"};
    if (std::find(kinds.begin(), kinds.end(), value) == kinds.end())
      Fail(s, "'quant' expects one of " + Join(kinds) + ", got '" + value + "'" + DidYouMeanSameKind(value, kinds));
    s.quant = value;
  }
}

}  // namespace

const FrameworkDef& SglangFramework() {
  static const FrameworkDef def{
      "sglang", "sglang:...",
      {"tp", "ep", "attn-dp", "engines", "shared-experts", "dense-tp", "dp-lm-head", "quant"}, {"dp-lm-head"}, {},
      false, Set, MakeSglang,
  };
  return def;
}

}  // namespace reshard::init
