// vLLM 0.33: what its ranks hold for each tensor role (fused buffer names,
// quantized storage, how TP, DP, EP and PP cut it), and its settings
// "vllm:tp=8,dp=16,ep,...".
// Sources (vLLM v0.33, paths under vllm/model_executor/ unless said):
//  - layers/linear.py QKVParallelLinear (KV heads replicated when TP exceeds
//    them: divide(tp_size, total_num_kv_heads)), MergedColumnParallelLinear
//    (gate_up_proj), vocab_parallel_embedding.py (DEFAULT_VOCAB_PADDING_SIZE =
//    64, padded vocab split evenly over TP),
//    fused_moe/config.py FusedMoEParallelConfig (without EP, experts' intermediate
//    dim sharded over DP x TP; with EP, ep_rank = dp_rank x TP + tp_rank, experts
//    contiguous; uneven counts: fused_moe/expert_map_manager.py determine_expert_map,
//    linear placement, the first ranks one more; more ranks than experts: the
//    rest hold none, zero-size buffers), fused_moe/routed_experts.py
//    RoutedExperts (owns w13_weight / w2_weight and their scales, held as
//    `routed_experts` by the FusedMoE layer / MoERunner built as `experts`),
//    models/deepseek_v2.py DeepseekV2MLAAttention (fused_qkv_a_proj with q LoRA,
//    kv_a_proj_with_mqa without), quantization/fp8.py (block scales
//    `weight_scale_inv`, the per-rank slice a multiple of the block:
//    validate_fp8_block_shape), quantization/compressed_tensors/schemes/
//    compressed_tensors_w8a8_fp8.py (per-channel `weight_scale` [rows, 1]; after
//    loading the weight parameter is a transposed view of the [rows, cols] storage).
//  - models/glm4_moe.py (GLM-4.5): Glm4MoE's router `gate` is a GateLinear with
//    params_dtype=torch.float32 (an fp32 buffer of the bf16 checkpoint
//    tensor) and e_score_correction_bias an fp32 Parameter; its shared
//    experts are a Glm4MoeMLP without disable_tp (TP-cut even when the MoE
//    runs sequence-parallel, unlike DeepseekV2MLP); fused shared experts only
//    under ROCm AITER (fused_moe/utils.py resolve_layer_fused_shared_expert).
//  - models/gpt_oss.py (gpt-oss): hf_to_vllm_mapper renames `.self_attn.` to
//    `.attn.` and embed_tokens to `embedding`; OAIAttention's qkv_proj and
//    o_proj have biases (o_proj's whole on every rank, RowParallelLinear),
//    `sinks` holds the rank's heads (model_loader/weight_utils.py
//    load_attention_sink); the KV heads are divided by tp_size, not
//    replicated (num_key_value_heads // tp_size); MLPBlock's router has a
//    bias; GptOssModel._load_weights_other (BF16 checkpoints) loads
//    gate_up_proj [E, H, 2I] as w13_weight [E, 2I, H] keeping gate and up in
//    alternate rows (each rank's slice 2 x tp_rank_start .. 2 x tp_rank_end
//    of the alternating columns: gate and up rows of its part of I), w13_bias
//    likewise, and w2_bias only on the (DP x TP-flattened) rank 0 (zeros on
//    the others: the row-parallel reduction adds it once); with EP, experts
//    ep_rank x (E // ep_size) onward (E divisible by EP). The release's
//    MXFP4 experts are held after loading in a kernel-specific layout
//    (layers/fused_moe/oracle/mxfp4.py convert_gpt_oss_weight_to_mxfp4_moe_kernel_format:
//    Marlin repacking, FlashInfer TRTLLM row shuffles, SM90 interleaving,
//    triton_kernels swizzling; sizes rounded up by
//    mxfp4_round_up_hidden_size_and_intermediate_size), which reshard does not write.
//  Checked against per-rank dumps of real vLLM 0.33 ranks
//  (tests/data/recorded/vllm-*/SOURCES.md, tests/recorded_dumps_test.cc).
#include <algorithm>
#include <set>

#include "compiler/spec.h"
#include "frameworks/layout_builder.h"
#include "runtime/error.h"

namespace reshard::init {

// QKVParallelLinear / ColumnParallelLinear: heads over TP; KV heads either
// divide over TP or are replicated TP / kv_heads times.
bool HeadsOverTp(const Arch& a, const Settings& s, const std::string& who, Notes& notes) {
  const int64_t tp = s.tp;
  if (a.heads % tp != 0)
    FailTp(s, who + " needs num_attention_heads (" + S(a.heads) + ") divisible by tensor_parallel_size (" + S(tp) + ")");
  const bool kv_replicated = !a.mla && tp > a.kv_heads;
  if (kv_replicated && tp % a.kv_heads != 0)
    FailTp(s, who + " replicates KV heads when TP exceeds them: tensor_parallel_size (" + S(tp) +
                ") must be a multiple of num_key_value_heads (" + S(a.kv_heads) + ")");
  if (kv_replicated)
    notes.push_back(s.option + ": TP " + S(tp) + " > " + S(a.kv_heads) + " KV heads: each KV head replicated on " +
                    S(tp / a.kv_heads) + " ranks");
  return kv_replicated;
}

namespace {

using nlohmann::ordered_json;

// The vLLM fused buffer name of a role, from the HF name (vLLM's stacked_params_mapping).
std::string VllmFusedName(const Arch& a, const ArchTensor& t) {
  switch (t.role) {
    case Role::q: case Role::q_gate: case Role::k: case Role::v: case Role::q_odd: case Role::k_odd:
      if (Find(a, Role::q_gate))  // Qwen3-Next's gated attention: the spec splits q_proj into query and gate
        return Rename(Find(a, Role::q)->name, "q_proj.query.weight", "qkv_proj.weight");
      if (Find(a, Role::q_odd))  // Llama 4: each head's even and odd rows
        return Rename(Find(a, Role::q)->name, "q_proj.even.weight", "qkv_proj.weight");
      return Rename(Find(a, Role::q)->name, "q_proj.weight", "qkv_proj.weight");
    // Gated DeltaNet (Qwen3-Next): the checkpoint's fused tensors, as vLLM keeps them.
    case Role::lin_q: case Role::lin_k: case Role::lin_v: case Role::lin_z:
      return CheckpointFusion(a, *Find(a, Role::lin_q))["name"];
    case Role::lin_b: case Role::lin_a: return CheckpointFusion(a, *Find(a, Role::lin_b))["name"];
    case Role::conv_q: case Role::conv_k: case Role::conv_v: return CheckpointFusion(a, *Find(a, Role::conv_q))["name"];
    case Role::q_bias: case Role::k_bias: case Role::v_bias:
      return Rename(Find(a, Role::q_bias)->name, "q_proj.bias", "qkv_proj.bias");
    case Role::gate: case Role::up: return Rename(Find(a, Role::gate)->name, "gate_proj.weight", "gate_up_proj.weight");
    case Role::shared_gate: case Role::shared_up:
      return Rename(Find(a, Role::shared_gate)->name, "gate_proj.weight", "gate_up_proj.weight");
    case Role::mla_q_a: case Role::mla_kv_a:
      if (Find(a, Role::mla_q_a)) return Rename(Find(a, Role::mla_q_a)->name, "q_a_proj.weight", "fused_qkv_a_proj.weight");
      return t.name;
    case Role::expert_gate: case Role::expert_up: case Role::expert_down: case Role::expert_gate_bias:
    case Role::expert_up_bias: case Role::expert_down_bias: {
      // FusedMoE's weights live in its `routed_experts` submodule (fused_moe/routed_experts.py
      // RoutedExperts; see tests/data/recorded/vllm-moe-*/SOURCES.md).
      const std::string prefix = t.name.substr(0, t.name.find(".{expert}."));
      const bool down = t.role == Role::expert_down || t.role == Role::expert_down_bias;
      const bool bias = t.role == Role::expert_gate_bias || t.role == Role::expert_up_bias ||
                        t.role == Role::expert_down_bias;
      return prefix + ".routed_experts." + (down ? "w2" : "w13") + (bias ? "_bias" : "_weight");
    }
    default: return t.name;
  }
}

// gpt-oss's hf_to_vllm_mapper (models/gpt_oss.py GptOssForCausalLM): the
// attention module is `attn`, the embedding `embedding`.
std::string VllmName(const Arch& a, const ArchTensor& t) {
  std::string name = VllmFusedName(a, t);
  if (a.model_type != "gpt_oss") return name;
  if (const auto at = name.find(".self_attn."); at != std::string::npos) name.replace(at, 11, ".attn.");
  if (name == "model.embed_tokens.weight") name = "model.embedding.weight";
  return name;
}

ordered_json MakeVllm(const Arch& a, const std::string& model, Settings& s, Notes& notes) {
  const int64_t tp = s.tp, dp = std::max<int64_t>(s.dp, 1), engines = s.engines;
  s.dp = dp;
  const bool ep = s.vllm_ep;
  if (a.model_type == "gpt_oss") {
    // A BF16 refit into an engine serving the release's MXFP4 experts would
    // need MXFP4 quantization (E2M1 values, one e8m0 scale per 32) and then
    // each kernel's own layout of them (see the sources above): refused.
    if (a.mxfp4_release && s.quant != "none")
      Fail(s, "the config's quantization_config (quant_method mxfp4) makes vLLM serve gpt-oss's experts in MXFP4, "
              "held after loading in a kernel-specific layout (layers/fused_moe/oracle/mxfp4.py "
              "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format: Marlin repacking, FlashInfer shuffles, "
              "triton_kernels swizzling, sizes rounded up), which reshard cannot write: a BF16 refit needs MXFP4 "
              "quantization and that layout. Serve a BF16 checkpoint (no quantization_config) and add quant=none "
              "to refit into it");
    if (a.mxfp4_release)
      notes.push_back(s.option + ": quant=none: engines serving gpt-oss in BF16, started from a BF16 checkpoint (the "
                      "release's experts dequantized), not from the MXFP4 release the config describes");
    if (!s.quant.empty() && s.quant != "none")
      Fail(s, "reshard init describes gpt-oss engines in BF16 only (quant=none); quant=" + s.quant +
                  " would quantize the experts, which vLLM's gpt-oss loader (models/gpt_oss.py) takes only from an "
                  "MXFP4 or quark checkpoint");
    if (tp > a.kv_heads)
      Fail(s, "vLLM's OAIAttention (models/gpt_oss.py) divides the " + S(a.kv_heads) +
                  " KV heads by tensor_parallel_size (num_key_value_heads // tp_size) instead of replicating them: "
                  "tp must be at most " + S(a.kv_heads));
    const int64_t world = dp * s.pp * tp;
    if (Find(a, Role::expert_gate)->shape[0] % world != 0)
      Fail(s, "vLLM's gpt-oss MLPBlock asserts intermediate_size (" + S(Find(a, Role::expert_gate)->shape[0]) +
                  ") % world_size (dp x pp x tp = " + S(world) + ") == 0 (models/gpt_oss.py)");
    if (ep && a.experts % (dp * tp) != 0)
      Fail(s, "vLLM's gpt-oss loader gives EP rank r experts r x (E // ep_size) onward (models/gpt_oss.py "
              "GptOssModel.load_weights): num_local_experts (" + S(a.experts) + ") must divide by dp x tp (" +
                  S(dp * tp) + ")");
  }
  if (a.model_type == "qwen3_next") {
    const ArchTensor* lq = Find(a, Role::lin_q);
    const int64_t nk = lq->shape[0] / lq->head_dim;
    if (nk % tp != 0)
      FailTp(s, "vLLM's Qwen3-Next linear attention keeps whole key heads on a rank (layers/mamba/gdn/"
              "qwen_gdn_linear_attn.py: num_k_heads / tp_size): linear_num_key_heads (" + S(nk) +
                  ") must divide by tp (" + S(tp) + ")");
    if (!s.quant.empty() && s.quant != "none")
      Fail(s, "reshard init describes Qwen3-Next engines in BF16 only; quant=" + s.quant + " is not described yet");
  }
  const bool kv_replicated = HeadsOverTp(a, s, "vLLM", notes);
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
  const int64_t moe_width = ep ? 1 : dp * tp;  // who splits each expert's intermediate dim
  const int64_t ep_size = dp * tp;
  // vLLM's sequence-parallel MoE (config/parallel.py
  // ParallelConfig.use_sequence_parallel_moe: the default all2all_backend
  // "allgather_reducescatter", EP, TP > 1 and DP > 1) builds the shared
  // experts with disable_tp=is_sequence_parallel (models/deepseek_v2.py
  // DeepseekV2MLP): each rank holds them whole. Seen on real vLLM 0.33 ranks
  // (tests/vllm, case vllm-mla-fp8-tp2-dp2-ep).
  // GLM-4.5's Glm4MoeMLP (models/glm4_moe.py) has no disable_tp: its shared
  // experts stay TP-cut (seen on real vLLM ranks: tests/data/archs).
  // Qwen3-Next's and Llama 4's shared experts likewise (Qwen2MoeMLP and
  // LlamaMLP built with disable_tp=is_sequence_parallel: models/qwen2_moe.py,
  // models/llama4.py Llama4MoE; seen on real ranks: tests/data/archs).
  const bool shared_whole = ep && tp > 1 && dp > 1 &&
                            (a.model_type == "deepseek_v3" || a.model_type == "qwen3_next" || a.model_type == "llama4");
  auto is_shared = [](Role r) { return r == Role::shared_gate || r == Role::shared_up || r == Role::shared_down; };
  if (shared_whole && Find(a, Role::shared_gate))
    notes.push_back(s.option + ": EP with TP " + S(tp) + " and DP " + S(dp) +
                    ": vLLM runs the MoE sequence-parallel and holds the shared experts whole on every rank");
  // Quantized storage: asked for, or the checkpoint's own format.
  const QuantFormat q = QuantOf(a, s.quant);
  for (const auto& t : a.tensors) {
    const Cut c = CutOf(t.role);
    if (c == Cut::replicate || c == Cut::vocab || c == Cut::expert_whole || (shared_whole && is_shared(t.role)))
      continue;
    const bool expert = c == Cut::expert_column || c == Cut::expert_row;
    const int64_t n = expert ? moe_width : tp;
    const int dim = (c == Cut::row || c == Cut::expert_row) ? 1 : 0;
    const bool replicated_kv = kv_replicated && (t.role == Role::k || t.role == Role::v || t.role == Role::k_bias ||
                                                 t.role == Role::v_bias || t.role == Role::k_odd);
    const int64_t per = replicated_kv ? t.shape[dim] / a.kv_heads : t.shape[dim] / n;
    if (!replicated_kv && t.shape[dim] % n != 0 && expert && n != tp)
      Fail(s, "vLLM shards each expert's intermediate dim over DP x TP (" + S(n) +
                  ") when data parallel runs without expert parallelism; " + t.name + " dim " + S(dim) + " is " +
                  S(t.shape[dim]));
    if (!replicated_kv && t.shape[dim] % n != 0)
      FailTp(s, "vLLM splits it evenly over TP; " + t.name + " dim " + S(dim) + " is " + S(t.shape[dim]));
    // quantization/fp8.py validate_fp8_block_shape: each rank's slice of a
    // block-quantized weight is a whole number of blocks.
    if (!q.kind.empty() && q.block_rows > 0 && IsQuantized(t.role) && n > 1) {
      const int64_t block = dim == 0 ? q.block_rows : q.block_cols;
      if (per % block != 0)
        FailTp(s, "vLLM refuses block-quantized weights whose per-rank slice is not a whole number of " + S(block) +
                      "-blocks (quantization/fp8.py validate_fp8_block_shape): " + t.name + " dim " + S(dim) + " is " +
                      S(t.shape[dim]) + " / " + S(n) + " = " + S(per),
               true);
    }
  }
  // fused_moe/config.py FusedMoEParallelConfig.make: with EP, ep_size = dp x tp
  // whatever the expert count; fused_moe/expert_map_manager.py
  // determine_expert_map (linear placement, the default): rank r holds
  // E // ep_size experts, one more when r < E % ep_size, contiguous. vLLM does
  // not refuse ep_size > E: ranks E.. get local_num_experts = 0, and
  // RoutedExperts still creates w13_weight / w2_weight with 0 experts
  // (unquantized_fused_moe_method.py create_weights: torch.empty(num_experts,
  // ...)): zero-size buffers, written as torch.chunk's cut (ceil(E / ep_size)
  // = 1 each: the same ranks, and zero-size buffers past the end).
  const bool experts_short = ep && a.experts < ep_size;
  if (ep && a.experts % ep_size != 0) {
    const int64_t base = a.experts / ep_size, more = a.experts % ep_size;
    auto span = [](int64_t lo, int64_t hi) { return hi - lo == 1 ? "rank " + S(lo) : "ranks " + S(lo) + "-" + S(hi - 1); };
    const std::string where = "(vLLM's linear expert placement: fused_moe/expert_map_manager.py determine_expert_map)";
    if (experts_short)
      notes.push_back(s.option + ": " + S(a.experts) + " experts over EP " + S(ep_size) + " (dp " + S(dp) + " x tp " +
                      S(tp) + "): " + span(0, a.experts) + " hold one expert each and " + span(a.experts, ep_size) +
                      " none " + where + ": vLLM accepts this, and those ranks hold zero-size expert weights and idle "
                      "in every MoE layer; dp x tp of at most " + S(a.experts) + " gives every rank an expert");
    else
      notes.push_back(s.option + ": " + S(a.experts) + " experts over EP " + S(ep_size) + ": " + span(0, more) +
                      " hold " + S(base + 1) + " experts each, " + span(more, ep_size) + " hold " + S(base) + " " + where);
  }
  // Built-in data parallel (dp=N: one engine, --data-parallel-size N) or N
  // independent engines (engines=N): the same weights per rank on a dense
  // model, not on a MoE one (experts cut over the whole engine). Say which
  // was written, and the option for the other.
  if (dp > 1 || engines > 1) {
    const std::string engine = "TP " + S(tp) + (pp > 1 ? " x PP " + S(pp) : "");
    auto nemo = [&](int64_t n) { return "NeMo RL's \"TP" + S(tp) + (pp > 1 ? " PP" + S(pp) : "") + " DP" + S(n) + "\""; };
    // What one engine of `n` DP ranks does with the experts (EP over n x tp with ep).
    auto experts_over = [&](int64_t n) -> std::string {
      if (a.experts == 0) return "";
      return ep ? ", the experts spread over all its ranks (EP " + S(n * tp) + ")"
                : ", each expert's intermediate dim split over all its ranks";
    };
    // The settings as written, with dp / engines replaced where the first of them stood.
    auto with = [&s](int64_t new_dp, int64_t new_engines) {
      std::vector<std::string> items;
      std::string item;
      bool placed = false;
      for (char ch : s.text.substr(s.text.find(':') + 1) + ",") {
        if (ch != ',') {
          item += ch;
          continue;
        }
        if (item.rfind("dp=", 0) == 0 || item.rfind("engines=", 0) == 0) {
          if (!placed) {
            if (new_dp > 1) items.push_back("dp=" + S(new_dp));
            if (new_engines > 1) items.push_back("engines=" + S(new_engines));
          }
          placed = true;
        } else {
          items.push_back(item);
        }
        item.clear();
      }
      std::string out = "vllm:";
      for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
      return out;
    };
    if (dp > 1) {
      const std::string alt = with(1, engines * dp);
      notes.push_back(s.option + ": dp=" + S(dp) + " is vLLM's built-in data parallel: " +
                      (engines > 1 ? "each of the " + S(engines) + " engines is " : "one engine of ") + S(dp * pp * tp) +
                      " ranks (--data-parallel-size " + S(dp) + ")" + experts_over(dp) + "; " + S(engines * dp) +
                      " independent engines of " + engine + " (" + nemo(engines * dp) + ") would be " + s.option + " " +
                      alt);
    } else {
      const std::string alt = with(engines, 1);
      notes.push_back(s.option + ": engines=" + S(engines) + " is " + S(engines) + " independent vLLM engines of " +
                      engine + " (" + nemo(engines) + "), each holding the whole model; one engine of " +
                      S(engines * pp * tp) + " ranks with vLLM's built-in data parallel (--data-parallel-size " +
                      S(engines) + experts_over(engines) + ") would be " + s.option + " " + alt);
    }
  }

  const int64_t ranks = engines * dp * pp * tp;
  Builder b;
  if (pp > 1) {  // parallel_state.py initialize_model_parallel: ranks ordered (dp, pp, tp)
    b.AddMesh("dense", {{"engine", engines}, {"dp", dp}, {"pp", pp}, {"tp", tp}});
  } else {
    b.AddMesh("dense", {{"engine", engines}, {"dp", dp}, {"tp", tp}});
    if (ep) b.AddMesh("expert", {{"engine", engines}, {"ep", ep_size}});
  }
  // gpt-oss's w2_bias without EP: real on the MoE's flattened rank 0
  // (dp_rank x tp + tp_rank, FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp),
  // zeros on the others; a mesh of that flattened axis says it exactly.
  const bool down_bias_flat = !ep && Find(a, Role::expert_down_bias) && dp * tp > 1;
  if (down_bias_flat && pp == 1) b.AddMesh("moe", {{"engine", engines}, {"moe_tp", dp * tp}});
  if (down_bias_flat)
    notes.push_back(s.option + ": vLLM holds the real w2_bias on the MoE's first rank of each engine (DP x TP "
                    "flattened) and zeros on the others (models/gpt_oss.py _load_weights_other: the row-parallel "
                    "reduction adds it once); the layout writes rank 0's and leaves the zeros" +
                    (pp > 1 && dp > 1 ? "; with pp, the ranks of dp > 0 are left out of the layout (their w2_bias "
                                        "stays zero)"
                                      : ""));
  const VocabSplit vocab = SplitVocab(a.vocab, 64, tp);
  if (vocab.padded % tp != 0)
    FailTp(s, "vLLM's VocabParallelEmbedding splits the vocabulary padded to a multiple of 64 (" + S(vocab.padded) +
                ") evenly over TP (" + S(tp) + ")");
  if (vocab.padded != a.vocab)
    notes.push_back(s.option + ": vLLM pads the vocabulary " + S(a.vocab) + " -> " + S(vocab.padded) + " (" +
                    S(vocab.per_rank) + " rows per TP rank)");

  std::set<std::string> done;
  for (const auto& t : a.tensors) {
    const Cut c = CutOf(t.role);
    std::vector<std::pair<std::string, ordered_json>> axes;
    if (pp > 1) {
      if (t.layers != Layers::none) axes.push_back({"pp", {{"shard", "layer"}, {"sizes", pp_sizes}}});
      if (t.role == Role::embed) axes.push_back({"pp", {{"at", 0}}});
      if (t.role == Role::lm_head || t.role == Role::final_norm) axes.push_back({"pp", {{"at", -1}}});
    }
    if (IsExpert(t.role)) {
      const int dim = c == Cut::expert_row ? 1 : 0;
      if (ep) {
        ordered_json e = {{"shard", "expert"}};
        if (experts_short) {
          e["split"] = "chunk";  // one expert each on the first ranks, zero-size buffers on the rest
        } else if (a.experts % ep_size != 0) {
          ordered_json sizes = ordered_json::array();
          for (int64_t r = 0; r < ep_size; ++r) sizes.push_back(a.experts / ep_size + (r < a.experts % ep_size));
          e["sizes"] = sizes;
        }
        axes.push_back({"ep", e});
        b.Place(t, "expert", axes);
      } else if (c == Cut::expert_whole) {
        if (down_bias_flat) {  // the flattened rank 0 holds it, the others all padding (the rule's "shape")
          ordered_json first = ordered_json::array();
          for (int64_t r = 0; r < (pp == 1 ? dp * tp : tp); ++r) first.push_back(r == 0 ? t.shape[0] : 0);
          if (pp == 1) {
            axes.push_back({"moe_tp", {{"shard", 0}, {"sizes", first}}});
            b.Place(t, "moe", axes);
          } else {
            axes.push_back({"dp", {{"at", 0}}});
            axes.push_back({"tp", {{"shard", 0}, {"sizes", first}}});
            b.Place(t, "dense", axes);
          }
        } else {
          b.Place(t, "dense", axes);
        }
      } else {
        axes.push_back({"dp", Shard(dim)});
        axes.push_back({"tp", Shard(dim)});
        b.Place(t, "dense", axes);
      }
    } else if (shared_whole && is_shared(t.role)) {
      b.Place(t, "dense", axes);  // whole on every rank
    } else {
      AddTpAxis(t, kv_replicated, a.kv_heads, vocab, axes);
      b.Place(t, "dense", axes);
    }
    const std::string buf = VllmName(a, t);
    if (!done.insert(buf).second) continue;
    ordered_json rule = {{"name", buf}};
    if (buf != t.name) {  // fused by vLLM: [q; k; v], [gate; up], [q_a; kv_a]
      if (t.role == Role::q && Find(a, Role::q_odd)) {
        // Llama 4: Llama4ForCausalLM.load_weights (models/llama4.py
        // permute_qk_weight_for_rotary) regroups each head's q and k rows
        // from RoPE pairs (2j, 2j + 1) to [even rows; odd rows] on every
        // layer, before the TP cut; v is kept (seen on real vLLM 0.33 ranks:
        // tests/data/archs/vllm-llama4-*).
        rule["parts"] = {t.name, Find(a, Role::q_odd)->name, Find(a, Role::k)->name, Find(a, Role::k_odd)->name,
                         Find(a, Role::v)->name};
        rule["interleave"] = {{"dim", 0},
                              {"blocks", ordered_json::array({{{"parts", 2}, {"groups", a.heads}},
                                                              {{"parts", 2}, {"groups", a.kv_heads}},
                                                              {{"parts", 1}}})}};
      } else if (t.role == Role::q && Find(a, Role::q_gate)) {
        // Qwen3-Next: qkv_proj holds the rank's heads each as [query; gate]
        // (Qwen3NextAttention: QKVParallelLinear of heads x 2, q_proj rows as
        // the checkpoint has them), then k, then v.
        rule["parts"] = {t.name, Find(a, Role::q_gate)->name, Find(a, Role::k)->name, Find(a, Role::v)->name};
        rule["interleave"] = {{"dim", 0},
                              {"blocks", ordered_json::array({{{"parts", 2}, {"groups", a.heads}}, {{"parts", 1}},
                                                              {{"parts", 1}}})}};
      } else if (t.role == Role::lin_q || t.role == Role::lin_b || t.role == Role::conv_q) {
        // As the checkpoint holds them, each part cut over TP: in_proj_qkvz
        // and in_proj_ba in whole key heads (QwenGatedDeltaNetAttention.
        // create_qkvz_proj: one output size, gqa_interleaved_layout),
        // conv1d's q, k, v each (mamba_v2_sharded_weight_loader).
        rule = CheckpointFusion(a, t);
      } else if (t.role == Role::q || t.role == Role::q_bias) {
        const bool bias = t.role == Role::q_bias;
        rule["parts"] = {t.name, Find(a, bias ? Role::k_bias : Role::k)->name, Find(a, bias ? Role::v_bias : Role::v)->name};
        rule["concat"] = 0;
      } else if (t.role == Role::gate || t.role == Role::shared_gate || t.role == Role::expert_gate ||
                 t.role == Role::expert_gate_bias) {
        rule["parts"] = {t.name, Find(a, UpOf(t.role))->name};
        // gpt-oss: gate and up rows alternate (groups of one row).
        if (IsExpert(t.role) && a.interleaved_gate_up) rule["interleave"] = {{"dim", 0}, {"groups", t.shape[0]}};
        else rule["concat"] = 0;
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
    if (quantized && q.kind == "fp8-channel" && !expert) rule["held"] = "transposed";
    if (c == Cut::vocab && vocab.padded != a.vocab) rule["shape"] = {vocab.per_rank, a.hidden};
    if (c == Cut::expert_whole && down_bias_flat) rule["shape"] = {t.shape[0]};
    // GLM-4.5's router: a GateLinear built with params_dtype=torch.float32.
    if (t.role == Role::router && a.model_type == "glm4_moe") rule["dtype"] = "fp32";
    // Qwen3-Next's A_log: an fp32 Parameter whatever the model dtype
    // (QwenGatedDeltaNetAttention: torch.empty(nv / tp, dtype=torch.float32)).
    if (t.role == Role::lin_a_log) rule["dtype"] = "fp32";
    // Buffers vLLM keeps under their HF names need no rule (default_buffers).
    if (buf == t.name && !quantized && !rule.contains("shape") && !rule.contains("dtype")) continue;
    b.Buffer(rule);
  }
  std::string lname = "vllm";
  lname += "-tp" + S(tp);
  if (pp > 1) lname += "-pp" + S(pp);
  if (dp > 1) lname += "-dp" + S(dp);
  if (ep) lname += "-ep" + S(ep_size);
  if (engines > 1) lname += "-x" + S(engines);
  if (!q.kind.empty()) lname += "-" + q.kind;
  std::string note = "vLLM 0.33";
  if (engines > 1) note += ", " + S(engines) + " independent engines";
  if (pp > 1) note += ", pipeline parallel " + S(pp);
  if (dp > 1) note += std::string(", built-in data parallel ") + S(dp) + (ep ? "" : " (experts' intermediate dim over DP x TP)");
  if (ep) note += ", expert parallel " + S(ep_size);
  if (!q.kind.empty()) note += ", " + q.kind + " linear weights";
  note += "; generated by reshard init";
  return b.Finish(lname, model, ranks, true, note);
}

void Set(Settings& s, const std::string& key, const std::string& value) {
  if (key == "tp") s.tp = PositiveInt(s, key, value);
  else if (key == "pp") s.pp = PositiveInt(s, key, value);
  else if (key == "dp") s.dp = PositiveInt(s, key, value);
  else if (key == "ep") s.vllm_ep = true;
  else if (key == "engines") s.engines = PositiveInt(s, key, value);
  else if (key == "quant") {
    static const std::vector<std::string> kinds = {"none", "fp8-block", "fp8-channel", "mxfp8"};
    if (std::find(kinds.begin(), kinds.end(), value) == kinds.end())
      Fail(s, "'quant' expects one of " + Join(kinds) + ", got '" + value + "'" + DidYouMeanSameKind(value, kinds));
    s.quant = value;
  }
}

}  // namespace

const FrameworkDef& VllmFramework() {
  static const FrameworkDef def{
      "vllm", "vllm:...", {"tp", "pp", "dp", "ep", "engines", "quant"}, {"ep"}, {}, false, Set, MakeVllm,
  };
  return def;
}

}  // namespace reshard::init
