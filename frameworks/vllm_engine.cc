// vLLM 0.33's tensors beyond the checkpoint, as seen on real vLLM ranks
// (tests/vllm: named_parameters() and persistent buffers after get_model) and
// where its source makes them (paths under vllm/model_executor/).
#include <algorithm>
#include <cctype>

#include "frameworks/engine_tensors.h"

namespace reshard {

namespace {

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

const char* EngineTensorKindString(EngineTensorKind k) {
  switch (k) {
    case EngineTensorKind::runtime_buffer: return "runtime buffer";
    case EngineTensorKind::derived_at_load: return "derived at load";
    case EngineTensorKind::outside_spec: return "outside the model spec";
  }
  return "";
}

std::optional<EngineTensor> VllmEngineTensor(const std::string& name) {
  // Every attention layer (Attention and MLAAttention, registered as
  // `<attn>.attn` / `<self_attn>.mla_attn.mla_attn`) registers
  // _k_scale, _v_scale, _q_scale and _prob_scale as buffers
  // (layers/attention/attention.py set_default_quant_scales(register_buffer=True)
  // and _init_kv_cache_quant) and resets them to 1.0 after loading unless an FP8
  // KV cache loads checkpoint scales (process_weights_after_loading).
  for (const char* s : {"._k_scale", "._v_scale", "._q_scale", "._prob_scale"})
    if (EndsWith(name, s) && (name.find(".attn.") != std::string::npos ||
                              name.find(".mla_attn.") != std::string::npos))
      return EngineTensor{EngineTensorKind::runtime_buffer, "vLLM 0.33", "",
                          "attention / KV-cache scale (layers/attention/attention.py set_default_quant_scales)"};
  // MLA: W_UV [heads, kv_lora_rank, v_head_dim] and W_UK_T [heads,
  // qk_nope_head_dim, kv_lora_rank], split from kv_b_proj (dequantized to the
  // model dtype under FP8: a separate copy; under BF16 views of its memory) by
  // layers/attention/mla_attention.py MLAAttention.process_weights_after_loading
  // (split_kv_b_proj, replace_parameter).
  for (const char* s : {".W_UV", ".W_UK_T"}) {
    if (!EndsWith(name, s)) continue;
    const size_t at = name.find(".mla_attn.");
    if (at == std::string::npos) continue;
    return EngineTensor{EngineTensorKind::derived_at_load, "vLLM 0.33", name.substr(0, at) + ".kv_b_proj.weight",
                        "MLA's absorbed projection (layers/attention/mla_attention.py "
                        "MLAAttention.process_weights_after_loading): reshard.vllm recomputes it after a refit"};
  }
  // Llama 4 (models/mllama4.py Llama4ForConditionalGeneration): the vision
  // encoder and the projector, which reshard init's model spec leaves out (a
  // text refit leaves them as loaded).
  for (const char* p : {"vision_model.", "multi_modal_projector."})
    if (name.rfind(p, 0) == 0)
      return EngineTensor{EngineTensorKind::outside_spec, "vLLM 0.33", "",
                          "Llama 4's vision encoder / projector (models/mllama4.py): not in the model spec reshard "
                          "init writes; a refit leaves it as loaded"};
  return std::nullopt;
}

std::optional<EngineTensor> FindEngineTensor(const std::string& framework, const std::string& name) {
  std::string first = framework.substr(0, framework.find(' '));
  std::transform(first.begin(), first.end(), first.begin(), [](unsigned char c) { return std::tolower(c); });
  if (first == "vllm") return VllmEngineTensor(name);
  if (first == "sglang") return SglangEngineTensor(name);
  return std::nullopt;
}

}  // namespace reshard
