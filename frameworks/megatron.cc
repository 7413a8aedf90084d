// Megatron-Core 0.19: what its ranks hold for each tensor role (buffer names,
// dtypes, fusions, and how TP, PP, CP, EP and expert TP cut it), and its
// settings "megatron:tp=4,pp=8,ep=16,...".
// Sources (Megatron-LM core_r0.19):
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
//  - GLM-4.5 (glm4_moe): a GPT with add_qkv_bias (linear_qkv.bias),
//    qk_layernorm (GLM-4.5 / 4.6), rotary_percent 0.5, moe_layer_freq with
//    first_k_dense_replace dense layers, shared experts
//    (moe_shared_expert_intermediate_size: mlp.shared_experts.linear_fc1 /
//    linear_fc2), the sigmoid router's fp32 expert_bias
//    (moe_router_enable_expert_bias); what Megatron-Bridge's GLM-4.5 provider sets.
//  - gpt-oss: add_bias_linear (linear_qkv.bias, linear_proj.bias, the
//    router's `bias`, the experts' linear_fc1.bias / linear_fc2.bias),
//    softmax_type "learnable" (transformer/dot_product_attention.py and
//    extensions/transformer_engine.py TEDotProductAttention, TE >= 2.8:
//    `core_attention.softmax_offset`, num_attention_heads / TP per rank),
//    window_size / window_attn_skip_freq, glu_linear_offset and
//    activation_func_clamp_value (transformer/mlp.py glu: `torch.chunk(x, 2)`,
//    so linear_fc1 is [gate; up] with moe_mlp_glu_interleave_size unset, the
//    default; the checkpoint's alternating rows are de-interleaved).
//  Checked against per-rank dumps derived from this source
//  (tests/data/recorded/*/SOURCES.md, tests/recorded_dumps_test.cc) and against
//  real Megatron-Core ranks (tests/data/megatron/).
#include <algorithm>
#include <numeric>
#include <set>

#include "frameworks/layout_builder.h"
#include "runtime/error.h"

namespace reshard::init {
namespace {

using nlohmann::ordered_json;

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
      case Role::q: case Role::k: case Role::v: case Role::q_odd: case Role::k_odd:
        return L + "self_attention.linear_qkv.weight";
      case Role::q_bias: case Role::k_bias: case Role::v_bias: return L + "self_attention.linear_qkv.bias";
      case Role::o: return L + "self_attention.linear_proj.weight";
      case Role::o_bias: return L + "self_attention.linear_proj.bias";
      case Role::sinks: return L + "self_attention.core_attention.softmax_offset";
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
      case Role::router_linear_bias: return L + "mlp.router.bias";
      case Role::expert_gate: case Role::expert_up:
        return L + (grouped ? "mlp.experts.linear_fc1.weight{expert.local}" : "mlp.experts.local_experts.{expert.local}.linear_fc1.weight");
      case Role::expert_down:
        return L + (grouped ? "mlp.experts.linear_fc2.weight{expert.local}" : "mlp.experts.local_experts.{expert.local}.linear_fc2.weight");
      case Role::expert_gate_bias: case Role::expert_up_bias:
        return L + (grouped ? "mlp.experts.linear_fc1.bias{expert.local}" : "mlp.experts.local_experts.{expert.local}.linear_fc1.bias");
      case Role::expert_down_bias:
        return L + (grouped ? "mlp.experts.linear_fc2.bias{expert.local}" : "mlp.experts.local_experts.{expert.local}.linear_fc2.bias");
      case Role::shared_gate: case Role::shared_up: return L + "mlp.shared_experts.linear_fc1.weight";
      case Role::shared_down: return L + "mlp.shared_experts.linear_fc2.weight";
      // Qwen3-Next (Megatron-Core 0.19 models/gpt/experimental_attention_variant_module_specs.py,
      // ssm/gated_delta_net/common.py _GDNBase): gated attention's linear_qkv
      // holds per query group its queries, their gates, k, v
      // (attention_output_gate); GatedDeltaNet's in_proj is one
      // ColumnParallelLinear of [q; k; v; z; b; a] (each TP-cut), conv1d
      // [q; k; v] channels, dt_bias and A_log per value head, out_norm one
      // value head; the shared expert's sigmoid gate is
      // shared_experts.gate_weight (moe_shared_expert_gate).
      case Role::q_gate: return L + "self_attention.linear_qkv.weight";
      case Role::lin_q: case Role::lin_k: case Role::lin_v: case Role::lin_z: case Role::lin_b: case Role::lin_a:
        return L + "self_attention.in_proj.weight";
      case Role::conv_q: case Role::conv_k: case Role::conv_v: return L + "self_attention.conv1d.weight";
      case Role::lin_dt_bias: return L + "self_attention.dt_bias";
      case Role::lin_a_log: return L + "self_attention.A_log";
      case Role::lin_norm: return L + "self_attention.out_norm.weight";
      case Role::lin_out: return L + "self_attention.out_proj.weight";
      case Role::shared_expert_gate: return L + "mlp.shared_experts.gate_weight";
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

// The offset a Megatron rank holds a norm's gamma with, against the HF
// checkpoint (layout "transform"). Qwen3-Next's norms are zero-centered in
// HF and vLLM (Qwen3NextRMSNorm: x * (1 + w)) but for the linear-attention
// out_norm (Qwen3NextRMSNormGated: x * w).
// - TE spec: Megatron-Bridge runs Qwen3-Next with
//   layernorm_zero_centered_gamma (TENorm and the fused layer_norm_weight
//   compute x * (1 + gamma): extensions/transformer_engine.py passes
//   zero_centered_gamma=config.layernorm_zero_centered_gamma), so the
//   zero-centered norms map 1:1 and out_norm holds w - 1 (Megatron-Bridge
//   qwen3_next_bridge.py, RMSNorm2ZeroCenteredRMSNormMapping): offset -1.
// - local spec: torch's RMSNorm cannot be zero-centered (WrappedTorchNorm
//   asserts not layernorm_zero_centered_gamma, transformer/torch_norm.py);
//   it computes x * gamma, so a rank equal to the HF model holds 1 + w in
//   every zero-centered norm (offset +1) and out_norm as it is.
float NormOffset(const Arch& a, Role r, bool te) {
  if (a.model_type != "qwen3_next" || !IsNorm(r)) return 0;
  if (te) return r == Role::lin_norm ? -1.0f : 0.0f;
  return r == Role::lin_norm ? 0.0f : 1.0f;
}

ordered_json MakeMegatron(const Arch& a, const std::string& model, Settings& s, std::vector<std::string>& notes) {
  const int64_t tp = s.tp, pp = s.pp, cp = s.cp, ep = s.ep;
  const bool etp_default = s.etp == 0;
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
    FailTp(s, "Megatron-Core needs num_attention_heads (" + S(a.heads) + ") divisible by tensor_model_parallel_size (" + S(tp) + ")");
  const bool fused_shard = !a.mla && tp > a.kv_heads;
  if (fused_shard && tp % a.kv_heads != 0)
    FailTp(s, "Megatron-Core splits linear_qkv evenly when TP exceeds num_query_groups; TP " + S(tp) +
                " must then be a multiple of num_key_value_heads (" + S(a.kv_heads) + ")");
  // transformer_config.py __post_init__: "Bias in Moe is only supported when ETP==1".
  if (Find(a, Role::expert_down_bias) && etp != 1)
    Fail(s, "Megatron-Core supports the experts' biases (add_bias_linear, " + a.model_type +
                ") only with expert_tensor_parallel_size 1 (transformer_config.py: \"Bias in Moe is only supported "
                "when ETP==1\"); etp is " + S(etp) + (etp_default ? " (Megatron's default: tp)" : "") +
                ", add etp=1");
  if (a.experts > 0 && a.experts % ep != 0)
    Fail(s, "Megatron-Core needs num_moe_experts (" + S(a.experts) + ") divisible by expert_model_parallel_size (" + S(ep) + ")");
  for (const auto& t : a.tensors) {
    const Cut c = MegatronCut(t.role, s.te);
    const bool expert = c == Cut::expert_column || c == Cut::expert_row;
    const int64_t n = expert ? etp : tp;
    const int dim = (c == Cut::row || c == Cut::expert_row) ? 1 : 0;
    if (c == Cut::replicate || c == Cut::vocab || c == Cut::expert_whole || t.shape[dim] % n == 0) continue;
    const std::string what = "Megatron-Core splits " + t.name + " dim " + S(dim) + " (" + S(t.shape[dim]) +
                             ") evenly over " +
                             (expert ? "expert_tensor_parallel_size" : "tensor_model_parallel_size") + " (" + S(n) + ")";
    if (expert && !etp_default) Fail(s, what);  // etp given: another TP leaves it as it is
    FailTp(s, what);
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
    FailTp(s, "Megatron-Core's VocabParallelEmbedding splits the vocabulary (" + S(a.vocab) +
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
  if (a.interleaved_gate_up)
    notes.push_back(s.option + ": " + a.model_type + " in Megatron-Core 0.19: add_bias_linear, softmax_type=\"learnable\" "
                    "(the sinks as self_attention.core_attention.softmax_offset" +
                    std::string(s.te ? ", TE >= 2.8" : "") + "); the experts' linear_fc1 is [gate; up] "
                    "(moe_mlp_glu_interleave_size unset, the default) while the checkpoint and vLLM alternate gate "
                    "and up rows: the plan reorders them");

  std::set<std::string> fused_done;
  for (const auto& t : a.tensors) {
    const Cut c = MegatronCut(t.role, s.te);
    std::vector<std::pair<std::string, ordered_json>> axes;
    const bool layered = t.layers != Layers::none;
    if (layered && !pp_axis.is_null()) axes.push_back({"pp", pp_axis});
    if (t.role == Role::embed) axes.push_back({"pp", {{"at", tied_copy ? ordered_json{0, -1} : ordered_json(0)}}});
    if (t.role == Role::lm_head || t.role == Role::final_norm) axes.push_back({"pp", {{"at", -1}}});
    const bool qkv = t.role == Role::q || t.role == Role::k || t.role == Role::v || t.role == Role::q_bias ||
                     t.role == Role::k_bias || t.role == Role::v_bias || t.role == Role::q_odd || t.role == Role::k_odd ||
                     t.role == Role::q_gate;
    if (IsExpert(t.role)) {
      axes.push_back({"ep", {{"shard", "expert"}}});
      if (c != Cut::expert_whole) axes.push_back({"etp", Shard(c == Cut::expert_row ? 1 : 0)});
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
      if (Find(a, Role::q_odd)) {
        // Llama 4: Megatron-Bridge runs it with rotary_interleaved, so q and k
        // keep HF's RoPE pairs: per query group, its heads' q rows alternating
        // even / odd, the k rows likewise, then v.
        rule["parts"] = {Find(a, Role::q)->name, Find(a, Role::q_odd)->name, Find(a, Role::k)->name,
                         Find(a, Role::k_odd)->name, Find(a, Role::v)->name};
        const int64_t half = a.head_dim / 2;
        rule["interleave"] = {{"dim", 0},
                              {"groups", a.kv_heads},
                              {"blocks", ordered_json::array({{{"parts", 2}, {"groups", a.heads / a.kv_heads * half}},
                                                              {{"parts", 2}, {"groups", half}},
                                                              {{"parts", 1}}})}};
      }
      if (Find(a, Role::q_gate) && !bias)  // Qwen3-Next: per query group [queries; gates; k; v]
        rule["parts"] = {Find(a, Role::q)->name, Find(a, Role::q_gate)->name, Find(a, Role::k)->name,
                         Find(a, Role::v)->name};
      if (fused_shard) rule["shard"] = "tp";
    } else if (t.role == Role::lin_q) {
      rule["parts"] = {t.name, Find(a, Role::lin_k)->name, Find(a, Role::lin_v)->name, Find(a, Role::lin_z)->name,
                       Find(a, Role::lin_b)->name, Find(a, Role::lin_a)->name};
      rule["concat"] = 0;
    } else if (t.role == Role::conv_q) {
      rule["parts"] = {t.name, Find(a, Role::conv_k)->name, Find(a, Role::conv_v)->name};
      rule["concat"] = 0;
    } else if (t.role == Role::gate || t.role == Role::expert_gate || t.role == Role::shared_gate ||
               t.role == Role::expert_gate_bias) {
      rule["parts"] = {t.name, Find(a, UpOf(t.role))->name};
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
    if (const float offset = NormOffset(a, t.role, s.te); offset != 0) rule["transform"] = {{"offset", offset}};
    if (t.role == Role::embed && tied_copy) {
      rule["at"] = {{"pp", 0}};
      ordered_json copy = rule;
      copy["name"] = name.Chunk(S(s.vpp - 1)) + "output_layer.weight";
      copy["at"] = {{"pp", -1}};
      b.Buffer(rule);
      b.Buffer(copy);
      continue;
    }
    // TE spec, Qwen3-Next: the input norm is fused into the layer's first
    // linear, GatedDeltaNet's in_proj (TELayerNormColumnParallelLinear,
    // metainfo fuse_input_layernorm) or gated attention's linear_qkv.
    if (t.role == Role::input_norm && s.te && !a.linear_layer.empty()) {
      const auto linear_runs = LayerRuns(a, Layers::linear_attn), full_runs = LayerRuns(a, Layers::full_attn);
      ordered_json linear = rule;
      linear["name"] = name.Layer() + "self_attention.in_proj.layer_norm_weight";
      if (full_runs.empty()) {
        rule = linear;
      } else if (!linear_runs.empty()) {
        linear["range"] = {{"layer", LayerRange(a, linear_runs)}};
        rule["range"] = {{"layer", LayerRange(a, full_runs)}};
        b.Buffer(linear);
      }
    }
    if (t.role == Role::post_norm && s.te && a.experts > 0 && a.first_moe > 0) {
      ordered_json dense = rule;
      dense["name"] = name.Layer() + "mlp.linear_fc1.layer_norm_weight";
      dense["range"] = {{"layer", LayerRange(a, LayerRuns(a, Layers::dense))}};
      rule["range"] = {{"layer", LayerRange(a, LayerRuns(a, Layers::moe))}};
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

void Set(Settings& s, const std::string& key, const std::string& value) {
  if (key == "tp") s.tp = PositiveInt(s, key, value);
  else if (key == "pp") s.pp = PositiveInt(s, key, value);
  else if (key == "dp") s.dp = PositiveInt(s, key, value);
  else if (key == "cp") s.cp = PositiveInt(s, key, value);
  else if (key == "ep") s.ep = PositiveInt(s, key, value);
  else if (key == "etp") s.etp = PositiveInt(s, key, value);
  else if (key == "vpp") s.vpp = PositiveInt(s, key, value);
  else if (key == "grouped-gemm") s.grouped_gemm = true;
  else if (key == "fp32-norms") s.fp32_norms = true;
  else if (key == "pp-layers") s.pp_layers.push_back(PositiveInt(s, key, value));
  else if (key == "spec") {
    if (value != "te" && value != "local") Fail(s, "'spec' expects te or local, got '" + value + "'" + DidYouMean(value, {"te", "local"}));
    s.te = value == "te";
  } else if (key == "vocab-divisible") {
    if (value == "0") s.vocab_divisible = 0;
    else s.vocab_divisible = PositiveInt(s, key, value);
  }
}

}  // namespace

const FrameworkDef& MegatronFramework() {
  static const FrameworkDef def{
      "megatron",
      "megatron:...",
      {"tp", "pp", "dp", "cp", "ep", "etp", "vpp", "pp-layers", "grouped-gemm", "spec", "vocab-divisible", "fp32-norms"},
      {"grouped-gemm", "fp32-norms"},
      {"pp-layers"},
      false,
      Set,
      MakeMegatron,
  };
  return def;
}

}  // namespace reshard::init
