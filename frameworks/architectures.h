// The architectures `reshard init` knows: for each HF `model_type`, the tensors
// of its checkpoint (names, shapes from config.json, where in the layer stack)
// and the role each plays. The frameworks' layouts (frameworks/megatron.cc,
// vllm.cc, hf.cc, ...) are written against the roles only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace reshard::init {

/// What a tensor is, as far as the frameworks' sharding and naming go.
enum class Role {
  embed, lm_head, final_norm,                  // vocab rows / replicated, outside the layers
  input_norm, post_norm,                       // layer norms before attention and before the MLP
  q, k, v, q_bias, k_bias, v_bias, o,          // GQA attention (q/k/v rows, o cols, in heads)
  o_bias,                                      // o_proj's bias (gpt-oss): whole on every TP rank
  sinks,                                       // per-head attention sink logits (gpt-oss), cut with the heads
  q_norm, k_norm,                              // per-head q/k norms (Qwen3, GLM-4.5)
  mla_q, mla_q_a, mla_q_a_norm, mla_q_b,       // MLA (DeepSeek-V3): q without / with LoRA
  mla_kv_a, mla_kv_a_norm, mla_kv_b,
  gate, up, down,                              // dense MLP
  router, router_bias,                         // MoE router weight, e_score_correction_bias
  router_linear_bias,                          // the router linear's own bias (gpt-oss mlp.router.bias)
  expert_gate, expert_up, expert_down,         // routed experts, stacked over {expert}
  expert_gate_bias, expert_up_bias,            // the experts' biases (gpt-oss): cut with their rows
  expert_down_bias,                            // added after the row-parallel reduction: never cut
  shared_gate, shared_up, shared_down,         // shared experts (one fused MLP)
  shared_expert_gate,                          // the shared expert's sigmoid gate [1, H] (Qwen3-Next): whole
  q_gate,                                      // gated attention's output gate rows (Qwen3-Next q_proj: [q_h; gate_h])
  q_odd, k_odd,                                // Llama 4: each head's odd rows (RoPE pairs (2j, 2j + 1)); q, k the even ones
  // Gated DeltaNet linear attention (Qwen3-Next), the checkpoint's fused
  // tensors split into what the frameworks cut separately:
  lin_q, lin_k, lin_v, lin_z,                  // in_proj_qkvz (per key head [q; k; v; z]), rows by heads
  lin_b, lin_a,                                // in_proj_ba (per key head [b; a]), rows by value heads
  conv_q, conv_k, conv_v,                      // conv1d [q; k; v] channels, [C, 1, K]
  lin_dt_bias, lin_a_log,                      // per value head
  lin_norm,                                    // the gated RMSNorm of one value head: whole
  lin_out,                                     // out_proj, cols by value heads
};

/// Which layers a per-layer tensor exists in: none (outside the layers), all,
/// the dense or the MoE ones (Arch::moe_layer), the linear-attention or the
/// full-attention ones of a hybrid model (Arch::linear_layer).
enum class Layers { none, all, dense, moe, linear_attn, full_attn };

/// One tensor family of the HF checkpoint.
struct ArchTensor {
  Role role;
  std::string name;              // HF name with {layer} / {expert}
  std::vector<int64_t> shape;
  Layers layers = Layers::all;
  bool fp32 = false;             // stored in float32 (DeepSeek's e_score_correction_bias)
  int64_t head_dim = 0;          // rows (q/k/v/MLA up) or cols (o) per head; 0: no heads
};

/// A parsed config.json, as the tables need it.
struct Arch {
  std::string model_type;        // the table used ("deepseek_v3" for kimi_k2 too)
  /// Before "model." and "lm_head." in every name: "language_model." for a
  /// multimodal checkpoint's language model (Llama 4), "" otherwise.
  std::string lm_prefix;
  std::string name;              // default model spec name
  int64_t layers = 0, experts = 0;
  int64_t first_moe = 0;         // the first MoE layer (layers when none)
  /// Per layer: MoE (ParseArch fills it from first_moe when a table leaves it
  /// empty: layers [first_moe, layers)); linear attention (hybrid models; empty: none).
  std::vector<bool> moe_layer, linear_layer;
  int64_t hidden = 0, vocab = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // kv_heads = 0 for MLA
  bool mla = false;
  bool tied = false;
  /// gate and up rows alternate in the checkpoint's fused experts (gpt-oss
  /// gate_up_proj: gate = 0::2, up = 1::2), and so in vLLM's w13.
  bool interleaved_gate_up = false;
  /// The checkpoint stores the experts' weights transposed ([E, in, out]:
  /// gpt-oss gate_up_proj [E, H, 2I], down_proj [E, I, H]); the model spec
  /// holds them per expert as [out, in], as vLLM and Megatron do.
  bool experts_transposed = false;
  int64_t mtp_layers = 0;        // num_nextn_predict_layers: not in the model spec
  /// The release's MXFP4 experts (quantization_config quant_method "mxfp4",
  /// gpt-oss): the model spec is BF16; a refit into an MXFP4-serving engine
  /// is refused (frameworks/vllm.cc says why).
  bool mxfp4_release = false;
  /// FP8 checkpoint (`quantization_config`: quant_method fp8 with
  /// weight_block_size): its block; nullopt for BF16 checkpoints.
  std::optional<std::pair<int64_t, int64_t>> fp8_block;
  std::vector<ArchTensor> tensors;
  /// The model spec's "notes" (what the tensors are, where they differ from
  /// the checkpoint); empty: none written.
  std::string model_notes;
  /// What the config left out and was taken from the HF config class's
  /// defaults (head_dim, num_key_value_heads), one line each.
  std::vector<std::string> notes;
};

/// The layers a tensor of `layers` exists in, as ascending runs [lo, hi).
std::vector<std::pair<int64_t, int64_t>> LayerRuns(const Arch& a, Layers layers);

/// A model or rule "range" of layer runs: nothing (null) when they are all
/// the layers, [lo, hi] for one run, a list of them for several.
nlohmann::ordered_json LayerRange(const Arch& a, const std::vector<std::pair<int64_t, int64_t>>& runs);

/// Reads config.json into an Arch; errors name `file` and the config field.
Arch ParseArch(const nlohmann::json& config, const std::string& file);

std::vector<std::string> ArchModelTypes();

}  // namespace reshard::init
