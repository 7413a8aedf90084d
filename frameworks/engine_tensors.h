// Tensors an inference engine holds beyond the checkpoint: runtime buffers
// and tensors derived at load time. A refit does not write them; `reshard
// check` reports them apart from differences, with the reason, and only by
// these exact rules (any other tensor the layout does not bind stays a
// difference). One table per framework: frameworks/vllm_engine.cc,
// frameworks/sglang_engine.cc.
#pragma once

#include <optional>
#include <string>

namespace reshard {

enum class EngineTensorKind {
  runtime_buffer,     // made by the engine at build time (attention / KV-cache scales)
  derived_at_load,    // computed from checkpoint tensors by the engine's post-processing
  outside_spec,       // part of the engine's model that init's model spec leaves out (Llama 4's vision encoder)
};
const char* EngineTensorKindString(EngineTensorKind k);  // "runtime buffer", "derived at load", "outside the model spec"

struct EngineTensor {
  EngineTensorKind kind;
  std::string framework;  // "vLLM 0.33", "SGLang 0.5.23"
  std::string from;       // derived_at_load: the parameter it is computed from ("...kv_b_proj.weight")
  std::string reason;     // where the framework makes it (file: function)
};

/// The engine tensor `name` is, for a dump of `framework` (the dump's
/// "framework" field, e.g. "vLLM 0.33.0 ..."; matched case-insensitively by
/// its first word); nullopt when the name is no such tensor.
std::optional<EngineTensor> FindEngineTensor(const std::string& framework, const std::string& name);

/// vLLM 0.33's rules (frameworks/vllm_engine.cc).
std::optional<EngineTensor> VllmEngineTensor(const std::string& name);

/// SGLang 0.5.23's rules (frameworks/sglang_engine.cc).
std::optional<EngineTensor> SglangEngineTensor(const std::string& name);

}  // namespace reshard
