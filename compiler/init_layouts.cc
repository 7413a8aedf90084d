// What Megatron-Core 0.19 and vLLM 0.33 hold on each rank for a tensor role:
// buffer names, dtypes, fusions, and how each parallel dimension cuts it.
// Sources (Megatron-LM core_r0.19, vLLM v0.33):
//  - Megatron names: megatron/core/models/gpt/gpt_layer_specs.py
//    (get_gpt_layer_with_transformer_engine_spec: linear_qkv with the fused
//    input norm `linear_qkv.layer_norm_weight`, dense MLPs' fused
//    `linear_fc1.layer_norm_weight`, MoE layers' separate `pre_mlp_layernorm`;
//    get_gpt_layer_local_spec: separate `input_layernorm`/`pre_mlp_layernorm`),
//    megatron/core/transformer/moe/experts.py (TEGroupedMLP's
//    `linear_fc1.weight{j}`, SequentialMLP's `local_experts.{j}.linear_fc1`),
//    megatron/core/transformer/moe/router.py (TopKRouter `weight`, the fp32
//    `expert_bias` buffer), megatron/core/transformer/multi_latent_attention.py
//    (MLASelfAttention: linear_q_down_proj, linear_q_up_proj, linear_kv_down_proj,
//    linear_kv_up_proj, q_layernorm / kv_layernorm).
//  - Megatron linear_qkv row order: attention.py SelfAttention.get_query_key_value_tensors
//    views the output as [groups, (heads/groups + 2) * head_dim]: q heads, k, v per group.
//  - Megatron ranks: megatron/core/parallel_state.py RankGenerator, order
//    "tp-cp-ep-dp-pp" (dense: tp fastest) and for experts tp=etp fastest, then
//    ep, then expert-dp, then pp.
//  - Megatron vocab: megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding
//    (multiple of make_vocab_size_divisible_by x TP), split evenly by
//    tensor_parallel/layers.py VocabParallelEmbedding (padding on the last ranks).
//  - vLLM: model_executor/layers/linear.py QKVParallelLinear (KV heads replicated
//    when TP exceeds them: divide(tp_size, total_num_kv_heads)),
//    MergedColumnParallelLinear (gate_up_proj), vocab_parallel_embedding.py
//    (DEFAULT_VOCAB_PADDING_SIZE = 64, padded vocab split evenly over TP),
//    fused_moe/config.py FusedMoEParallelConfig (without EP, experts' intermediate
//    dim sharded over DP x TP; with EP, ep_rank = dp_rank x TP + tp_rank, experts
//    contiguous; uneven counts: fused_moe/expert_map_manager.py determine_expert_map,
//    linear placement, the first ranks one more), fused_moe/routed_experts.py
//    RoutedExperts (owns w13_weight / w2_weight and their scales, held as
//    `routed_experts` by the FusedMoE layer / MoERunner built as `experts`),
//    models/deepseek_v2.py DeepseekV2MLAAttention (fused_qkv_a_proj with q LoRA,
//    kv_a_proj_with_mqa without), quantization/fp8.py (block scales
//    `weight_scale_inv`, the per-rank slice a multiple of the block:
//    validate_fp8_block_shape), quantization/compressed_tensors/schemes/
//    compressed_tensors_w8a8_fp8.py (per-channel `weight_scale` [rows, 1]; after
//    loading the weight parameter is a transposed view of the [rows, cols] storage).
//  Both sides are checked against per-rank dumps derived from this source
//  (tests/data/recorded/*/SOURCES.md, tests/recorded_dumps_test.cc).
#include "compiler/init_layouts.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "runtime/error.h"

namespace reshard::init {
namespace {

using nlohmann::ordered_json;

std::string S(int64_t x) { return std::to_string(x); }

[[noreturn]] void Fail(const Settings& s, const std::string& what) {
  throw Error(s.option + " '" + s.text + "': " + what);
}

// --- settings ---------------------------------------------------------------------

const std::vector<std::string>& Allowed(Framework fw) {
  static const std::vector<std::string> megatron = {"tp", "pp", "dp", "cp", "ep", "etp", "vpp", "pp-layers",
                                                    "grouped-gemm", "spec", "vocab-divisible", "fp32-norms"};
  static const std::vector<std::string> vllm = {"tp", "pp", "dp", "ep", "engines", "quant"};
  static const std::vector<std::string> hf = {"tp"};
  return fw == Framework::megatron ? megatron : fw == Framework::vllm ? vllm : hf;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out;
}

int64_t PositiveInt(const Settings& s, const std::string& key, const std::string& value) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || x < 1)
    Fail(s, "'" + key + "' expects a positive integer, got '" + value + "'");
  return x;
}

// Role classes: how a tensor is cut by tensor parallelism in every framework.
enum class Cut { replicate, column, row, vocab, expert_column, expert_row };

Cut CutOf(Role r) {
  switch (r) {
    case Role::embed: case Role::lm_head: return Cut::vocab;
    case Role::q: case Role::k: case Role::v: case Role::q_bias: case Role::k_bias: case Role::v_bias:
    case Role::mla_q: case Role::mla_q_b: case Role::mla_kv_b: case Role::gate: case Role::up:
    case Role::shared_gate: case Role::shared_up:
      return Cut::column;
    case Role::o: case Role::down: case Role::shared_down: return Cut::row;
    case Role::expert_gate: case Role::expert_up: return Cut::expert_column;
    case Role::expert_down: return Cut::expert_row;
    default: return Cut::replicate;
  }
}

bool IsNorm(Role r) {
  return r == Role::input_norm || r == Role::post_norm || r == Role::final_norm || r == Role::q_norm ||
         r == Role::k_norm || r == Role::mla_q_a_norm || r == Role::mla_kv_a_norm;
}

bool IsExpert(Role r) { return r == Role::expert_gate || r == Role::expert_up || r == Role::expert_down; }

// Linear weights a quantized inference checkpoint stores in FP8: every linear of
// the decoder layers except the router (vLLM builds gates with quant_config=None).
bool IsQuantized(Role r) {
  switch (r) {
    case Role::q: case Role::k: case Role::v: case Role::o: case Role::mla_q: case Role::mla_q_a:
    case Role::mla_q_b: case Role::mla_kv_a: case Role::mla_kv_b: case Role::gate: case Role::up: case Role::down:
    case Role::expert_gate: case Role::expert_up: case Role::expert_down: case Role::shared_gate:
    case Role::shared_up: case Role::shared_down:
      return true;
    default: return false;
  }
}

const ArchTensor* Find(const Arch& a, Role r) {
  for (const auto& t : a.tensors)
    if (t.role == r) return &t;
  return nullptr;
}

// Replaces the last occurrence of `from` in `name` by `to`.
std::string Rename(std::string name, const std::string& from, const std::string& to) {
  auto at = name.rfind(from);
  if (at == std::string::npos) throw Error("internal: '" + from + "' not in '" + name + "'");
  return name.replace(at, from.size(), to);
}

// --- the layout being built -------------------------------------------------------------

struct Axis {
  std::string name;
  int64_t size;
};

class Builder {
 public:
  void AddMesh(const std::string& name, std::vector<Axis> axes) {
    std::vector<Axis> kept;
    for (auto& ax : axes)
      if (ax.size > 1) kept.push_back(ax);
    if (kept.empty()) kept.push_back(axes.back());
    meshes_.push_back({name, kept});
  }
  bool HasAxis(const std::string& mesh, const std::string& axis) const {
    for (const auto& m : meshes_)
      if (m.first == mesh)
        for (const auto& ax : m.second)
          if (ax.name == axis) return true;
    return false;
  }
  // A placement rule for one tensor family: axis -> spec, on `mesh`; axes of
  // size one (left out of the mesh) are dropped.
  void Place(const ArchTensor& t, const std::string& mesh, const std::vector<std::pair<std::string, ordered_json>>& axes) {
    ordered_json p;
    p["match"] = t.name;
    p["mesh"] = mesh;
    for (const auto& [axis, spec] : axes)
      if (HasAxis(mesh, axis)) p[axis] = spec;
    placements_.push_back(p);
  }
  void Buffer(ordered_json b) { buffers_.push_back(std::move(b)); }

  ordered_json Finish(const std::string& name, const std::string& model, int64_t ranks, bool default_buffers,
                      const std::string& notes) {
    ordered_json j;
    j["format"] = "reshard.layout/1";
    j["name"] = name;
    j["model"] = model;
    if (!notes.empty()) j["notes"] = notes;
    j["ranks"] = ranks;
    ordered_json meshes = ordered_json::object();
    for (const auto& [n, axes] : meshes_) {
      ordered_json list = ordered_json::array();
      for (const auto& ax : axes) list.push_back({ax.name, ax.size});
      meshes[n] = list;
    }
    j["meshes"] = meshes;
    j["placements"] = placements_;
    if (default_buffers) j["default_buffers"] = true;
    j["buffers"] = buffers_.is_null() ? ordered_json::array() : buffers_;
    return j;
  }

 private:
  std::vector<std::pair<std::string, std::vector<Axis>>> meshes_;
  ordered_json placements_ = ordered_json::array(), buffers_ = ordered_json::array();
};

ordered_json Shard(int64_t dim) { return {{"shard", dim}}; }

// The vocabulary padded to `multiple` and split evenly over `n` ranks: the
// placement of the vocab dim and, when there is padding, the padded buffer rows.
struct VocabSplit {
  ordered_json axis;             // null when n == 1
  int64_t padded = 0, per_rank = 0;
};
VocabSplit SplitVocab(int64_t vocab, int64_t multiple, int64_t n) {
  VocabSplit v;
  v.padded = multiple > 0 ? (vocab + multiple - 1) / multiple * multiple : vocab;
  v.per_rank = v.padded / n;
  if (n > 1) {
    v.axis = Shard(0);
    if (v.padded != vocab) {
      ordered_json sizes = ordered_json::array();
      for (int64_t r = 0; r < n; ++r) sizes.push_back(std::clamp<int64_t>(vocab - r * v.per_rank, 0, v.per_rank));
      v.axis["sizes"] = sizes;
    }
  }
  return v;
}

// --- Megatron-Core ------------------------------------------------------------------------

// With virtual pipeline stages (vpp > 1) every rank holds vpp model chunks,
// each a GPTModel whose layers count from 0 (TransformerBlock builds its
// layers with local numbers; get_transformer_layer_offset places them); the
// layout names chunk c's parameters "model{c}." as Megatron's checkpoints
// do (checkpointing.py: state_dict['model%d' % i]), and frameworks bind each
// chunk under that prefix. The embedding lives in chunk 0, the output layer
// and final norm in the last chunk.
struct MegatronNames {
  bool te;
  int64_t vpp = 1;
  std::string Chunk(const std::string& c) const { return vpp > 1 ? "model" + c + "." : ""; }
  std::string Layer() const {
    return vpp > 1 ? Chunk("{layer.chunk}") + "decoder.layers.{layer.in_chunk}." : "decoder.layers.{layer.local}.";
  }
  std::string operator()(const Arch& a, Role r, bool grouped) const {
    const std::string L = Layer();
    switch (r) {
      case Role::embed: return Chunk("0") + "embedding.word_embeddings.weight";
      case Role::lm_head: return Chunk(S(vpp - 1)) + "output_layer.weight";
      case Role::final_norm: return Chunk(S(vpp - 1)) + "decoder.final_layernorm.weight";
      case Role::input_norm:
        return L + (te && !a.mla ? "self_attention.linear_qkv.layer_norm_weight" : "input_layernorm.weight");
      case Role::q: case Role::k: case Role::v: return L + "self_attention.linear_qkv.weight";
      case Role::q_bias: case Role::k_bias: case Role::v_bias: return L + "self_attention.linear_qkv.bias";
      case Role::o: return L + "self_attention.linear_proj.weight";
      case Role::q_norm: return L + "self_attention.q_layernorm.weight";
      case Role::k_norm: return L + "self_attention.k_layernorm.weight";
      case Role::mla_q: return L + "self_attention.linear_q_proj.weight";
      case Role::mla_q_a: return L + "self_attention.linear_q_down_proj.weight";
      case Role::mla_q_a_norm:
        return L + (te ? "self_attention.linear_q_up_proj.layer_norm_weight" : "self_attention.q_layernorm.weight");
      case Role::mla_q_b: return L + "self_attention.linear_q_up_proj.weight";
      case Role::mla_kv_a: return L + "self_attention.linear_kv_down_proj.weight";
      case Role::mla_kv_a_norm:
        return L + (te ? "self_attention.linear_kv_up_proj.layer_norm_weight" : "self_attention.kv_layernorm.weight");
      case Role::mla_kv_b: return L + "self_attention.linear_kv_up_proj.weight";
      // TE spec: a dense layer fuses its pre-MLP norm into linear_fc1
      // (TELayerNormColumnParallelLinear); MoE layers keep a separate TENorm.
      // A model with both gets two rules narrowed by layer range (MakeMegatron).
      case Role::post_norm:
        return L + (te && a.experts == 0 ? "mlp.linear_fc1.layer_norm_weight" : "pre_mlp_layernorm.weight");
      case Role::gate: case Role::up: return L + "mlp.linear_fc1.weight";
      case Role::down: return L + "mlp.linear_fc2.weight";
      case Role::router: return L + "mlp.router.weight";
      case Role::router_bias: return L + "mlp.router.expert_bias";
      case Role::expert_gate: case Role::expert_up:
        return L + (grouped ? "mlp.experts.linear_fc1.weight{expert.local}" : "mlp.experts.local_experts.{expert.local}.linear_fc1.weight");
      case Role::expert_down:
        return L + (grouped ? "mlp.experts.linear_fc2.weight{expert.local}" : "mlp.experts.local_experts.{expert.local}.linear_fc2.weight");
      case Role::shared_gate: case Role::shared_up: return L + "mlp.shared_experts.linear_fc1.weight";
      case Role::shared_down: return L + "mlp.shared_experts.linear_fc2.weight";
    }
    return "";
  }
};

// Megatron's local spec builds MLA's down projections as ColumnParallelLinear
// (gather_output=False: sharded over TP); the TE spec as TELinear with
// parallel_mode="duplicated" (replicated). multi_latent_attention.py MLASelfAttention.__init__.
Cut MegatronCut(Role r, bool te) {
  if (!te && (r == Role::mla_q_a || r == Role::mla_kv_a)) return Cut::column;
  return CutOf(r);
}

ordered_json MakeMegatron(const Arch& a, const std::string& model, Settings& s, std::vector<std::string>& notes) {
  const int64_t tp = s.tp, pp = s.pp, cp = s.cp, ep = s.ep;
  if (s.etp == 0) s.etp = tp;  // Megatron: expert_tensor_parallel_size defaults to tensor_model_parallel_size
  const int64_t etp = s.etp;
  if (a.experts == 0 && (ep > 1 || s.grouped_gemm)) Fail(s, "the model has no experts; leave out ep and grouped-gemm");
  if (s.fp32_norms && s.te) Fail(s, "fp32-norms needs spec=local: the TE spec's norms take params_dtype");
  if (s.grouped_gemm && !s.te)
    Fail(s, "grouped-gemm needs spec=te: Megatron-Core's local spec has only the legacy GroupedMLP (weight1/weight2), "
            "which reshard init does not describe");
  const int64_t dense_width = tp * cp;
  if (s.dp == 0) {  // the smallest data-parallel size the expert grid fits in
    const int64_t lcm = std::lcm(dense_width, ep * etp);
    s.dp = lcm / dense_width;
  }
  const int64_t dp = s.dp;
  if ((dense_width * dp) % (ep * etp) != 0)
    Fail(s, "Megatron-Core needs expert_model_parallel_size x expert_tensor_parallel_size (" + S(ep) + " x " + S(etp) +
                ") to divide tensor x context x data parallel size (" + S(tp) + " x " + S(cp) + " x " + S(dp) + ")");
  const int64_t edp = dense_width * dp / (ep * etp);
  // TransformerConfig.__post_init__: heads and query groups over TP.
  if (a.heads % tp != 0)
    Fail(s, "Megatron-Core needs num_attention_heads (" + S(a.heads) + ") divisible by tensor_model_parallel_size (" + S(tp) + ")");
  const bool fused_shard = !a.mla && tp > a.kv_heads;
  if (fused_shard && tp % a.kv_heads != 0)
    Fail(s, "Megatron-Core splits linear_qkv evenly when TP exceeds num_query_groups; TP " + S(tp) +
                " must then be a multiple of num_key_value_heads (" + S(a.kv_heads) + ")");
  if (a.experts > 0 && a.experts % ep != 0)
    Fail(s, "Megatron-Core needs num_moe_experts (" + S(a.experts) + ") divisible by expert_model_parallel_size (" + S(ep) + ")");
  for (const auto& t : a.tensors) {
    const Cut c = MegatronCut(t.role, s.te);
    const bool expert = c == Cut::expert_column || c == Cut::expert_row;
    const int64_t n = expert ? etp : tp;
    const int dim = (c == Cut::row || c == Cut::expert_row) ? 1 : 0;
    if (c != Cut::replicate && c != Cut::vocab && t.shape[dim] % n != 0)
      Fail(s, "Megatron-Core splits " + t.name + " dim " + S(dim) + " (" + S(t.shape[dim]) + ") evenly over " +
                  (expert ? "expert_tensor_parallel_size" : "tensor_model_parallel_size") + " (" + S(n) + ")");
  }
  // Pipeline stages: even split, or the sizes given (first/last stage sizes
  // as decoder_first/last_pipeline_num_layers make them).
  ordered_json pp_axis;
  if (pp > 1) {
    pp_axis = {{"shard", "layer"}};
    if (!s.pp_layers.empty()) {
      if (s.vpp > 1) Fail(s, "give either vpp or pp-layers, not both");
      if (static_cast<int64_t>(s.pp_layers.size()) != pp)
        Fail(s, "pp-layers lists " + S(s.pp_layers.size()) + " stages, pp is " + S(pp));
      const int64_t sum = std::accumulate(s.pp_layers.begin(), s.pp_layers.end(), int64_t{0});
      if (sum != a.layers) Fail(s, "pp-layers sum to " + S(sum) + ", the model has " + S(a.layers) + " layers");
      pp_axis["sizes"] = s.pp_layers;
    } else if (a.layers % (pp * s.vpp) != 0) {
      Fail(s, "Megatron-Core splits num_layers (" + S(a.layers) + ") evenly over pipeline stages" +
                  (s.vpp > 1 ? " x virtual stages (" + S(pp * s.vpp) + ")" : " (" + S(pp) + ")") +
                  "; give the stage sizes with pp-layers=N,N,...");
    } else if (s.vpp > 1) {
      pp_axis["cyclic"] = a.layers / (pp * s.vpp);
    }
  } else if (s.vpp > 1 || !s.pp_layers.empty()) {
    Fail(s, "vpp and pp-layers need pp > 1");
  }
  const int64_t ranks = pp * dp * cp * tp;
  Builder b;
  b.AddMesh("dense", {{"pp", pp}, {"dp", dp}, {"cp", cp}, {"tp", tp}});
  if (a.experts > 0) b.AddMesh("expert", {{"pp", pp}, {"edp", edp}, {"ep", ep}, {"etp", etp}});

  const MegatronNames name{s.te, s.vpp};
  const VocabSplit vocab = SplitVocab(a.vocab, s.vocab_divisible * tp, tp);
  if (s.vocab_divisible == 0 && a.vocab % tp != 0)
    Fail(s, "Megatron-Core's VocabParallelEmbedding splits the vocabulary (" + S(a.vocab) +
                ") evenly over TP; without padding (vocab-divisible=0) TP must divide it");
  if (vocab.padded != a.vocab) {
    const int64_t last_real = a.vocab - (tp - 1) * vocab.per_rank;
    notes.push_back(s.option + ": Megatron pads the vocabulary " + S(a.vocab) + " -> " + S(vocab.padded) + " (" +
                    S(vocab.per_rank) + " rows per TP rank; the last rank holds " + S(std::max<int64_t>(last_real, 0)) +
                    " real rows)");
  }
  if (fused_shard)
    notes.push_back(s.option + ": TP " + S(tp) + " exceeds " + S(a.kv_heads) +
                    " query groups: linear_qkv is split evenly by rows of the interleaved matrix");
  // Tied embeddings at PP > 1: GPTModel allocates output_layer.weight on the
  // last stage (ColumnParallelLinear's skip_weight_param_allocation is
  // pre_process && share_embeddings_and_output_weights, gpt_model.py) and
  // keeps it equal to the embedding (setup_embeddings_and_output_layer): a
  // second copy of the same tensor, written by a refit like the first.
  const bool tied_copy = a.tied && pp > 1;
  if (a.mtp_layers > 0)
    notes.push_back(s.option + ": the checkpoint's " + S(a.mtp_layers) + " MTP layer(s) (num_nextn_predict_layers) are "
                    "not in the layout: train without --mtp-num-layers, or refit them separately (vLLM's main model "
                    "skips them when loading)");
  if (tied_copy)
    notes.push_back(s.option + ": tied embeddings: the last stage holds output_layer.weight, a copy of the embedding");

  std::set<std::string> fused_done;
  for (const auto& t : a.tensors) {
    const Cut c = MegatronCut(t.role, s.te);
    std::vector<std::pair<std::string, ordered_json>> axes;
    const bool layered = t.layers != Layers::none;
    if (layered && !pp_axis.is_null()) axes.push_back({"pp", pp_axis});
    if (t.role == Role::embed) axes.push_back({"pp", {{"at", tied_copy ? ordered_json{0, -1} : ordered_json(0)}}});
    if (t.role == Role::lm_head || t.role == Role::final_norm) axes.push_back({"pp", {{"at", -1}}});
    const bool qkv = t.role == Role::q || t.role == Role::k || t.role == Role::v || t.role == Role::q_bias ||
                     t.role == Role::k_bias || t.role == Role::v_bias;
    if (IsExpert(t.role)) {
      axes.push_back({"ep", {{"shard", "expert"}}});
      axes.push_back({"etp", Shard(c == Cut::expert_row ? 1 : 0)});
      b.Place(t, "expert", axes);
    } else {
      if (c == Cut::column && !(qkv && fused_shard)) axes.push_back({"tp", Shard(0)});
      if (c == Cut::row) axes.push_back({"tp", Shard(1)});
      if (c == Cut::vocab && !vocab.axis.is_null()) axes.push_back({"tp", vocab.axis});
      b.Place(t, "dense", axes);
    }
    // Buffers: fused families once, at their first part.
    const std::string buf = name(a, t.role, s.grouped_gemm);
    if (!fused_done.insert(buf).second) continue;
    ordered_json rule = {{"name", buf}};
    if (qkv) {
      const bool bias = t.role == Role::q_bias;
      const Role r0 = bias ? Role::q_bias : Role::q;
      const Role r1 = bias ? Role::k_bias : Role::k;
      const Role r2 = bias ? Role::v_bias : Role::v;
      rule["parts"] = {Find(a, r0)->name, Find(a, r1)->name, Find(a, r2)->name};
      rule["interleave"] = {{"dim", 0}, {"groups", a.kv_heads}};
      if (fused_shard) rule["shard"] = "tp";
    } else if (t.role == Role::gate || t.role == Role::expert_gate || t.role == Role::shared_gate) {
      const Role up = t.role == Role::gate ? Role::up : t.role == Role::expert_gate ? Role::expert_up : Role::shared_up;
      rule["parts"] = {t.name, Find(a, up)->name};
      rule["concat"] = 0;
    } else {
      rule["parts"] = {t.name};
    }
    if (c == Cut::vocab && vocab.padded != a.vocab) rule["shape"] = {vocab.per_rank, a.hidden};
    // Megatron's get_model wraps the model in Float16Module under --bf16 (what
    // RL training runs): every parameter bf16. A bare GPTModel keeps the local
    // spec's norms (torch.nn.RMSNorm, built without params_dtype) in float32:
    // fp32-norms says so. The router's expert_bias buffer is float32 either way
    // (router.py registers it so); the model spec's HF dtype covers it.
    if (s.fp32_norms && IsNorm(t.role)) rule["dtype"] = "fp32";
    if (t.role == Role::embed && tied_copy) {
      rule["at"] = {{"pp", 0}};
      ordered_json copy = rule;
      copy["name"] = name.Chunk(S(s.vpp - 1)) + "output_layer.weight";
      copy["at"] = {{"pp", -1}};
      b.Buffer(rule);
      b.Buffer(copy);
      continue;
    }
    if (t.role == Role::post_norm && s.te && a.experts > 0 && a.first_moe > 0) {
      ordered_json dense = rule;
      dense["name"] = name.Layer() + "mlp.linear_fc1.layer_norm_weight";
      dense["range"] = {{"layer", {0, a.first_moe}}};
      rule["range"] = {{"layer", {a.first_moe, a.layers}}};
      b.Buffer(dense);
    }
    b.Buffer(rule);
  }
  std::string lname = "megatron";
  for (auto [k, v] : std::vector<std::pair<std::string, int64_t>>{{"tp", tp}, {"pp", pp}, {"dp", dp}, {"cp", cp},
                                                                  {"ep", ep}, {"etp", a.experts ? etp : 1}, {"vpp", s.vpp}})
    if (v > 1) lname += "-" + k + S(v);
  lname += s.te ? "-te" : "-local";
  if (s.grouped_gemm) lname += "-grouped";
  return b.Finish(lname, model, ranks, false,
                  std::string("Megatron-Core 0.19 ") + (s.te ? "TE" : "local (non-TE)") + " layer spec" +
                      (a.experts ? (s.grouped_gemm ? ", TEGroupedMLP experts" : ", SequentialMLP experts") : "") +
                      "; generated by reshard init");
}

// --- vLLM and plain HF -----------------------------------------------------------------------

struct QuantFormat {
  std::string kind;              // "", "fp8-block", "fp8-channel", "mxfp8"
  int64_t block_rows = 0, block_cols = 0;
  std::string scale_suffix;      // appended to the weight buffer's name
};

ordered_json QuantJson(const QuantFormat& q, const std::string& buffer) {
  if (q.kind == "fp8-block")
    return {{"format", "fp8_e4m3"}, {"scale", "block"}, {"block", {q.block_rows, q.block_cols}},
            {"scale_name", buffer + q.scale_suffix}};
  if (q.kind == "fp8-channel") return {{"format", "fp8_e4m3"}, {"scale", "channel"}, {"scale_name", buffer + q.scale_suffix}};
  return {{"format", "mxfp8"}, {"scale_name", buffer + q.scale_suffix}};
}

// The vLLM fused buffer name of a role, from the HF name (vLLM's stacked_params_mapping).
std::string VllmName(const Arch& a, const ArchTensor& t) {
  switch (t.role) {
    case Role::q: case Role::k: case Role::v: return Rename(Find(a, Role::q)->name, "q_proj.weight", "qkv_proj.weight");
    case Role::q_bias: case Role::k_bias: case Role::v_bias:
      return Rename(Find(a, Role::q_bias)->name, "q_proj.bias", "qkv_proj.bias");
    case Role::gate: case Role::up: return Rename(Find(a, Role::gate)->name, "gate_proj.weight", "gate_up_proj.weight");
    case Role::shared_gate: case Role::shared_up:
      return Rename(Find(a, Role::shared_gate)->name, "gate_proj.weight", "gate_up_proj.weight");
    case Role::mla_q_a: case Role::mla_kv_a:
      if (Find(a, Role::mla_q_a)) return Rename(Find(a, Role::mla_q_a)->name, "q_a_proj.weight", "fused_qkv_a_proj.weight");
      return t.name;
    case Role::expert_gate: case Role::expert_up: case Role::expert_down: {
      // FusedMoE's weights live in its `routed_experts` submodule (fused_moe/routed_experts.py
      // RoutedExperts; see tests/data/recorded/vllm-moe-*/SOURCES.md).
      const std::string prefix = t.name.substr(0, t.name.find(".{expert}."));
      return prefix + (t.role == Role::expert_down ? ".routed_experts.w2_weight" : ".routed_experts.w13_weight");
    }
    default: return t.name;
  }
}

ordered_json MakeServing(const Arch& a, const std::string& model, Settings& s, std::vector<std::string>& notes) {
  const bool vllm = s.fw == Framework::vllm;
  const int64_t tp = s.tp, dp = std::max<int64_t>(s.dp, 1), engines = s.engines;
  s.dp = dp;
  const char* who = vllm ? "vLLM" : "a plain HF TP split";
  // QKVParallelLinear / ColumnParallelLinear: heads over TP; KV heads either
  // divide over TP or are replicated TP / kv_heads times.
  if (a.heads % tp != 0)
    Fail(s, std::string(who) + " needs num_attention_heads (" + S(a.heads) + ") divisible by tensor_parallel_size (" + S(tp) + ")");
  const bool kv_replicated = !a.mla && tp > a.kv_heads;
  if (kv_replicated && tp % a.kv_heads != 0)
    Fail(s, std::string(who) + " replicates KV heads when TP exceeds them: tensor_parallel_size (" + S(tp) +
                ") must be a multiple of num_key_value_heads (" + S(a.kv_heads) + ")");
  if (kv_replicated)
    notes.push_back(s.option + ": TP " + S(tp) + " > " + S(a.kv_heads) + " KV heads: each KV head replicated on " +
                    S(tp / a.kv_heads) + " ranks");
  if (!vllm && (dp > 1 || engines > 1)) Fail(s, "hf takes only tp");
  const bool ep = vllm && s.vllm_ep;
  // vLLM pipeline stages (distributed/utils.py get_pp_indices): num_layers /
  // pp each, the remainder one more on the stages before the last, from the
  // second-to-last backwards; the embedding on the first stage, the final norm
  // and lm_head on the last (PPMissingLayer elsewhere).
  const int64_t pp = s.pp;
  std::vector<int64_t> pp_sizes;
  if (pp > 1) {
    if (pp > a.layers) Fail(s, "pp (" + S(pp) + ") exceeds the model's " + S(a.layers) + " layers");
    if (ep) Fail(s, "pp with ep is not described by reshard init yet (write the layout by hand)");
    if (a.tied)
      Fail(s, "pp with tied embeddings is not described by reshard init yet (vLLM ties lm_head on the last stage)");
    pp_sizes.assign(pp, a.layers / pp);
    for (int64_t i = 2; i < a.layers % pp + 2; ++i) pp_sizes[pp - i] += 1;
    std::string list;
    for (int64_t n : pp_sizes) list += (list.empty() ? "" : ",") + S(n);
    notes.push_back(s.option + ": vLLM splits the " + S(a.layers) + " layers over " + S(pp) + " pipeline stages as " +
                    list + " (get_pp_indices; VLLM_PP_LAYER_PARTITION changes it), layer names stay global");
  }
  if (ep && a.experts == 0) Fail(s, "the model has no experts; leave out ep");
  const int64_t moe_width = ep ? 1 : (vllm ? dp * tp : tp);  // who splits each expert's intermediate dim
  const int64_t ep_size = dp * tp;
  // vLLM's sequence-parallel MoE (config/parallel.py
  // ParallelConfig.use_sequence_parallel_moe: the default all2all_backend
  // "allgather_reducescatter", EP, TP > 1 and DP > 1) builds the shared
  // experts with disable_tp=is_sequence_parallel (models/deepseek_v2.py
  // DeepseekV2MLP): each rank holds them whole. Seen on real vLLM 0.33 ranks
  // (tests/vllm, case vllm-mla-fp8-tp2-dp2-ep).
  const bool shared_whole = vllm && ep && tp > 1 && dp > 1;
  auto is_shared = [](Role r) { return r == Role::shared_gate || r == Role::shared_up || r == Role::shared_down; };
  if (shared_whole && Find(a, Role::shared_gate))
    notes.push_back(s.option + ": EP with TP " + S(tp) + " and DP " + S(dp) +
                    ": vLLM runs the MoE sequence-parallel and holds the shared experts whole on every rank");
  // Quantized storage: asked for, or the checkpoint's own format.
  QuantFormat q;
  std::string qkind = s.quant;
  if (qkind.empty() && a.fp8_block) qkind = "fp8-block";
  if (qkind == "none") qkind.clear();
  if (!qkind.empty()) {
    q.kind = qkind;
    if (qkind == "fp8-block") {
      q.block_rows = a.fp8_block ? a.fp8_block->first : 128;
      q.block_cols = a.fp8_block ? a.fp8_block->second : 128;
      q.scale_suffix = "_scale_inv";
    } else if (qkind == "fp8-channel") {
      q.scale_suffix = "_scale";
    } else {
      q.block_rows = 1, q.block_cols = 32, q.scale_suffix = "_scale";
    }
  }
  for (const auto& t : a.tensors) {
    const Cut c = CutOf(t.role);
    if (c == Cut::replicate || c == Cut::vocab || (shared_whole && is_shared(t.role))) continue;
    const bool expert = c == Cut::expert_column || c == Cut::expert_row;
    const int64_t n = expert ? moe_width : tp;
    const int dim = (c == Cut::row || c == Cut::expert_row) ? 1 : 0;
    const bool replicated_kv = kv_replicated && (t.role == Role::k || t.role == Role::v || t.role == Role::k_bias ||
                                                 t.role == Role::v_bias);
    const int64_t per = replicated_kv ? t.shape[dim] / a.kv_heads : t.shape[dim] / n;
    if (!replicated_kv && t.shape[dim] % n != 0)
      Fail(s, std::string(who) + (expert && n != tp ? " shards each expert's intermediate dim over DP x TP (" + S(n) +
                                                          ") when data parallel runs without expert parallelism; "
                                                    : " splits it evenly over TP; ") +
                  t.name + " dim " + S(dim) + " is " + S(t.shape[dim]));
    // quantization/fp8.py validate_fp8_block_shape: each rank's slice of a
    // block-quantized weight is a whole number of blocks.
    if (!q.kind.empty() && q.block_rows > 0 && IsQuantized(t.role) && n > 1) {
      const int64_t block = dim == 0 ? q.block_rows : q.block_cols;
      if (per % block != 0)
        Fail(s, "vLLM refuses block-quantized weights whose per-rank slice is not a whole number of " + S(block) +
                    "-blocks (quantization/fp8.py validate_fp8_block_shape): " + t.name + " dim " + S(dim) + " is " +
                    S(t.shape[dim]) + " / " + S(n) + " = " + S(per));
    }
  }
  if (ep && a.experts % ep_size != 0)
    notes.push_back(s.option + ": " + S(a.experts) + " experts over EP " + S(ep_size) +
                    ": the first ranks hold one more (vLLM's linear expert placement)");

  const int64_t ranks = engines * dp * pp * tp;
  Builder b;
  if (vllm && pp > 1) {  // parallel_state.py initialize_model_parallel: ranks ordered (dp, pp, tp)
    b.AddMesh("dense", {{"engine", engines}, {"dp", dp}, {"pp", pp}, {"tp", tp}});
  } else if (vllm) {
    b.AddMesh("dense", {{"engine", engines}, {"dp", dp}, {"tp", tp}});
    if (ep) b.AddMesh("expert", {{"engine", engines}, {"ep", ep_size}});
  } else {
    b.AddMesh("dense", {{"tp", tp}});
  }
  const VocabSplit vocab = SplitVocab(a.vocab, vllm ? 64 : 0, tp);
  if (!vllm && a.vocab % tp != 0) Fail(s, "a plain HF TP split needs vocab_size (" + S(a.vocab) + ") divisible by tp");
  if (vllm && vocab.padded % tp != 0)
    Fail(s, "vLLM's VocabParallelEmbedding splits the vocabulary padded to a multiple of 64 (" + S(vocab.padded) +
                ") evenly over TP (" + S(tp) + ")");
  if (vocab.padded != a.vocab)
    notes.push_back(s.option + ": vLLM pads the vocabulary " + S(a.vocab) + " -> " + S(vocab.padded) + " (" +
                    S(vocab.per_rank) + " rows per TP rank)");

  std::set<std::string> done;
  for (const auto& t : a.tensors) {
    const Cut c = CutOf(t.role);
    std::vector<std::pair<std::string, ordered_json>> axes;
    const bool kv = t.role == Role::k || t.role == Role::v || t.role == Role::k_bias || t.role == Role::v_bias;
    if (pp > 1) {
      if (t.layers != Layers::none) axes.push_back({"pp", {{"shard", "layer"}, {"sizes", pp_sizes}}});
      if (t.role == Role::embed) axes.push_back({"pp", {{"at", 0}}});
      if (t.role == Role::lm_head || t.role == Role::final_norm) axes.push_back({"pp", {{"at", -1}}});
    }
    if (IsExpert(t.role)) {
      const int dim = c == Cut::expert_row ? 1 : 0;
      if (ep) {
        ordered_json e = {{"shard", "expert"}};
        if (a.experts % ep_size != 0) {
          ordered_json sizes = ordered_json::array();
          for (int64_t r = 0; r < ep_size; ++r) sizes.push_back(a.experts / ep_size + (r < a.experts % ep_size));
          e["sizes"] = sizes;
        }
        axes.push_back({"ep", e});
        b.Place(t, "expert", axes);
      } else {
        if (vllm) axes.push_back({"dp", Shard(dim)});
        axes.push_back({"tp", Shard(dim)});
        b.Place(t, "dense", axes);
      }
    } else if (shared_whole && is_shared(t.role)) {
      b.Place(t, "dense", axes);  // whole on every rank
    } else {
      if (c == Cut::column) {
        ordered_json ax = Shard(0);
        if (kv && kv_replicated) ax["parts"] = a.kv_heads;
        axes.push_back({"tp", ax});
      }
      if (c == Cut::row) axes.push_back({"tp", Shard(1)});
      if (c == Cut::vocab && !vocab.axis.is_null()) axes.push_back({"tp", vocab.axis});
      b.Place(t, "dense", axes);
    }
    const std::string buf = vllm ? VllmName(a, t) : t.name;
    if (!done.insert(buf).second) continue;
    ordered_json rule = {{"name", buf}};
    if (buf != t.name) {  // fused by vLLM: [q; k; v], [gate; up], [q_a; kv_a]
      if (t.role == Role::q || t.role == Role::q_bias) {
        const bool bias = t.role == Role::q_bias;
        rule["parts"] = {t.name, Find(a, bias ? Role::k_bias : Role::k)->name, Find(a, bias ? Role::v_bias : Role::v)->name};
        rule["concat"] = 0;
      } else if (t.role == Role::gate || t.role == Role::shared_gate || t.role == Role::expert_gate) {
        const Role up = t.role == Role::gate ? Role::up : t.role == Role::shared_gate ? Role::shared_up : Role::expert_up;
        rule["parts"] = {t.name, Find(a, up)->name};
        rule["concat"] = 0;
      } else if (t.role == Role::mla_q_a) {
        rule["parts"] = {t.name, Find(a, Role::mla_kv_a)->name};
        rule["concat"] = 0;
      } else {
        rule["parts"] = {t.name};
      }
    } else {
      rule["parts"] = {t.name};
    }
    const bool quantized = !q.kind.empty() && IsQuantized(t.role);
    if (quantized) rule["quant"] = QuantJson(q, buf);
    // compressed_tensors_w8a8_fp8.py process_weights_after_loading: a
    // per-channel FP8 linear's weight becomes a transposed view of its
    // [rows, cols] storage (what CUTLASS's scaled_mm reads); the fused
    // experts keep theirs (seen on real vLLM 0.33 ranks: tests/data/recorded/
    // vllm-moe-tp2-fp8-channel, strides [1, rows] on the linears only).
    const bool expert = t.role == Role::expert_gate || t.role == Role::expert_up || t.role == Role::expert_down;
    if (quantized && vllm && q.kind == "fp8-channel" && !expert) rule["held"] = "transposed";
    if (c == Cut::vocab && vocab.padded != a.vocab) rule["shape"] = {vocab.per_rank, a.hidden};
    // Buffers vLLM keeps under their HF names need no rule (default_buffers).
    if (buf == t.name && !quantized && !rule.contains("shape")) continue;
    b.Buffer(rule);
  }
  std::string lname = vllm ? "vllm" : "hf";
  if (tp > 1 || vllm) lname += "-tp" + S(tp);
  if (pp > 1) lname += "-pp" + S(pp);
  if (dp > 1) lname += "-dp" + S(dp);
  if (ep) lname += "-ep" + S(ep_size);
  if (engines > 1) lname += "-x" + S(engines);
  if (!q.kind.empty()) lname += "-" + q.kind;
  std::string note;
  if (vllm) {
    note = "vLLM 0.33";
    if (engines > 1) note += ", " + S(engines) + " independent engines";
    if (pp > 1) note += ", pipeline parallel " + S(pp);
    if (dp > 1) note += std::string(", built-in data parallel ") + S(dp) + (ep ? "" : " (experts' intermediate dim over DP x TP)");
    if (ep) note += ", expert parallel " + S(ep_size);
    if (!q.kind.empty()) note += ", " + q.kind + " linear weights";
    note += "; generated by reshard init";
  } else {
    note = "Hugging Face checkpoint names" + std::string(tp > 1 ? ", plain TP row/column shards" : "") +
           (q.kind.empty() ? "" : ", FP8 block-scaled linear weights as the checkpoint stores them") +
           "; generated by reshard init";
  }
  return b.Finish(lname, model, ranks, true, note);
}

}  // namespace

Settings ParseSettings(const std::string& text, const std::string& option) {
  Settings s;
  s.option = option;
  s.text = text;
  const auto colon = text.find(':');
  const std::string fw = text.substr(0, colon);
  if (fw == "megatron") s.fw = Framework::megatron;
  else if (fw == "vllm") s.fw = Framework::vllm;
  else if (fw == "hf") s.fw = Framework::hf;
  else
    throw Error(option + " '" + text + "': unknown framework '" + fw + "', expected megatron:..., vllm:... or hf[:tp=N]");
  if (colon == std::string::npos || colon + 1 == text.size()) {
    if (s.fw == Framework::hf) return s;
    Fail(s, "expected " + fw + ":key=value,... (" + Join(Allowed(s.fw)) + ")");
  }
  std::vector<std::string> items;
  std::string rest = text.substr(colon + 1), cur;
  for (char ch : rest + ",") {
    if (ch == ',') items.push_back(cur), cur.clear();
    else cur += ch;
  }
  std::set<std::string> seen;
  std::string list_key;  // pp-layers=3,4,4,...: bare numbers continue the list
  for (const std::string& item : items) {
    const auto eq = item.find('=');
    if (eq == std::string::npos && !list_key.empty() && !item.empty() &&
        std::all_of(item.begin(), item.end(), ::isdigit)) {
      s.pp_layers.push_back(PositiveInt(s, list_key, item));
      continue;
    }
    list_key.clear();
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    const auto& allowed = Allowed(s.fw);
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      Fail(s, "unknown option '" + key + "' for " + fw + ", expected one of " + Join(allowed));
    if (!seen.insert(key).second) Fail(s, "'" + key + "' given twice");
    const bool flag = key == "grouped-gemm" || key == "fp32-norms" || (key == "ep" && s.fw == Framework::vllm);
    if (flag && eq != std::string::npos) Fail(s, "'" + key + "' is a flag and takes no value");
    if (!flag && eq == std::string::npos) Fail(s, "'" + key + "' needs a value (" + key + "=...)");
    if (key == "tp") s.tp = PositiveInt(s, key, value);
    else if (key == "pp") s.pp = PositiveInt(s, key, value);
    else if (key == "dp") s.dp = PositiveInt(s, key, value);
    else if (key == "cp") s.cp = PositiveInt(s, key, value);
    else if (key == "ep" && s.fw == Framework::megatron) s.ep = PositiveInt(s, key, value);
    else if (key == "ep") s.vllm_ep = true;
    else if (key == "etp") s.etp = PositiveInt(s, key, value);
    else if (key == "vpp") s.vpp = PositiveInt(s, key, value);
    else if (key == "engines") s.engines = PositiveInt(s, key, value);
    else if (key == "grouped-gemm") s.grouped_gemm = true;
    else if (key == "fp32-norms") s.fp32_norms = true;
    else if (key == "pp-layers") s.pp_layers.push_back(PositiveInt(s, key, value)), list_key = key;
    else if (key == "spec") {
      if (value != "te" && value != "local") Fail(s, "'spec' expects te or local, got '" + value + "'");
      s.te = value == "te";
    } else if (key == "vocab-divisible") {
      if (value == "0") s.vocab_divisible = 0;
      else s.vocab_divisible = PositiveInt(s, key, value);
    } else if (key == "quant") {
      static const std::vector<std::string> kinds = {"none", "fp8-block", "fp8-channel", "mxfp8"};
      if (std::find(kinds.begin(), kinds.end(), value) == kinds.end())
        Fail(s, "'quant' expects one of " + Join(kinds) + ", got '" + value + "'");
      s.quant = value;
    }
  }
  return s;
}

ordered_json MakeLayout(const Arch& arch, const std::string& model_name, Settings s, std::vector<std::string>& notes) {
  if (s.fw == Framework::megatron) return MakeMegatron(arch, model_name, s, notes);
  return MakeServing(arch, model_name, s, notes);
}

}  // namespace reshard::init
