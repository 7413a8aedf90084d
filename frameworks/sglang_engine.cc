// SGLang 0.5.23's tensors beyond the checkpoint, as seen on real SGLang ranks
// (tests/sglang: named_parameters(), persistent buffers and MLA's derived
// attributes after load_model_with_memory_saver) and where its source makes
// them (paths under sglang/srt/).
#include "frameworks/engine_tensors.h"

namespace reshard {

namespace {

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::optional<EngineTensor> SglangEngineTensor(const std::string& name) {
  // An FP8 checkpoint's Fp8Config gives every RadixAttention a
  // Fp8KVCacheMethod, whose create_weights registers k_scale / v_scale as
  // fp32 0-dim Parameters (-1.0 until a checkpoint scale loads, 1.0 after
  // process_weights_after_loading): layers/quantization/kv_cache.py
  // BaseKVCacheMethod. DeepSeek's MLA has two: attn_mqa and attn_mha
  // (models/deepseek_v2.py DeepseekV2AttentionMLA).
  for (const char* s : {".k_scale", ".v_scale"})
    if (EndsWith(name, s) && (name.find(".self_attn.attn_mqa.") != std::string::npos ||
                              name.find(".self_attn.attn_mha.") != std::string::npos ||
                              name.find(".self_attn.attn.") != std::string::npos))
      return EngineTensor{EngineTensorKind::runtime_buffer, "SGLang 0.5.23", "",
                          "FP8 KV-cache scale parameter (layers/quantization/kv_cache.py BaseKVCacheMethod."
                          "create_weights), not in the checkpoint"};
  // MLA: w_kc [heads, qk_nope_head_dim, kv_lora_rank] and w_vc [heads,
  // kv_lora_rank, v_head_dim] of each self_attn, split from kv_b_proj (BF16:
  // copies of it; FP8 blocks other than 128x128, or no CUDA: requantized per
  // tensor with the 0-dim w_scale) by models/deepseek_common/
  // deepseek_weight_loader.py post_load_weights. Plain attributes, not
  // parameters: a refit in place leaves them stale until SGLang's
  // weight-update session re-derives them.
  for (const char* s : {".self_attn.w_kc", ".self_attn.w_vc", ".self_attn.w_scale"}) {
    if (!EndsWith(name, s)) continue;
    const std::string attn = name.substr(0, name.size() - std::string(s).size()) + ".self_attn";
    return EngineTensor{EngineTensorKind::derived_at_load, "SGLang 0.5.23", attn + ".kv_b_proj.weight",
                        "MLA's absorbed projection (models/deepseek_common/deepseek_weight_loader.py "
                        "post_load_weights): a plain attribute, re-derived by SGLang's weight-update session "
                        "(begin_weight_update / end_weight_update) after a refit"};
  }
  return std::nullopt;
}

}  // namespace reshard
