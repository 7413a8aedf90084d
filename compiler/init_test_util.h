// Fixtures shared by the tests of `reshard init` (compiler/init_test.cc) and
// of each framework's side (frameworks/*_test.cc): a tiny config of every
// architecture, Generate on it, and finding files, rules and placements in
// what it wrote.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "compiler/init.h"

namespace reshard::init::fixtures {

/// A tiny config.json of `type` (4 layers, hidden 64, 4 heads of 16, 2 KV heads).
inline nlohmann::json Tiny(const std::string& type) {
  nlohmann::json c = {{"model_type", type},  {"hidden_size", 64},        {"num_hidden_layers", 4},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                      {"intermediate_size", 128}, {"vocab_size", 512}};
  if (type == "qwen3_moe") c.update({{"num_experts", 8}, {"moe_intermediate_size", 32}});
  if (type == "mixtral") c.update({{"num_local_experts", 8}});
  if (type == "deepseek_v3" || type == "kimi_k2")
    c.update({{"num_key_value_heads", 4}, {"n_routed_experts", 8}, {"n_shared_experts", 1}, {"first_k_dense_replace", 1},
              {"moe_intermediate_size", 32}, {"q_lora_rank", 32}, {"kv_lora_rank", 16}, {"qk_nope_head_dim", 16},
              {"qk_rope_head_dim", 8}, {"v_head_dim", 16}, {"topk_method", "noaux_tc"}});
  if (type == "glm4_moe")  // GLM-4.5's fields: q/k/v biases, q/k norms, one dense layer, a shared expert, MTP
    c.update({{"n_routed_experts", 8}, {"n_shared_experts", 1}, {"first_k_dense_replace", 1},
              {"moe_intermediate_size", 32}, {"attention_bias", true}, {"use_qk_norm", true},
              {"num_nextn_predict_layers", 1}});
  if (type == "gpt_oss") c.update({{"num_local_experts", 8}, {"intermediate_size", 32}});
  if (type == "qwen3_next")  // layers 0, 2 linear attention, 1, 3 full; 2 key heads of 16, 4 value heads of 16
    c.update({{"num_experts", 8}, {"moe_intermediate_size", 32}, {"shared_expert_intermediate_size", 48},
              {"full_attention_interval", 2}, {"linear_num_key_heads", 2}, {"linear_num_value_heads", 4},
              {"linear_key_head_dim", 16}, {"linear_value_head_dim", 16}, {"linear_conv_kernel_dim", 4}});
  if (type == "llama4" || type == "llama4_text")  // MoE layers 1 and 3 (interleave step 2), dense 0 and 2
    c.update({{"num_local_experts", 8}, {"intermediate_size", 32}, {"intermediate_size_mlp", 128},
              {"interleave_moe_layer_step", 2}});
  if (type == "llama4") {  // the multimodal config: the language model's fields in text_config
    nlohmann::json text = c;
    text["model_type"] = "llama4_text";
    c = {{"model_type", "llama4"}, {"text_config", text}, {"vision_config", {{"hidden_size", 32}}}};
  }
  return c;
}

/// Whether `type`'s table has experts.
inline bool Moe(const std::string& type) {
  return type == "qwen3_moe" || type == "mixtral" || type == "deepseek_v3" || type == "kimi_k2" ||
         type == "glm4_moe" || type == "gpt_oss" || type == "llama4" || type == "llama4_text" || type == "qwen3_next";
}

inline Result Gen(const nlohmann::json& config, const std::string& train, const std::string& infer) {
  return Generate(Request{config, "config.json", train, infer, "", "m"});
}

/// The file `name` ("model.json", "train.json", ...) Generate wrote.
inline nlohmann::json File(const Result& r, const std::string& name) {
  for (const auto& [n, text] : r.files)
    if (n == name) return nlohmann::json::parse(text);
  ADD_FAILURE() << "no " << name;
  return {};
}

/// The buffer rule named `buffer`, or nullptr.
inline const nlohmann::json* Rule(const nlohmann::json& layout, const std::string& buffer) {
  for (const nlohmann::json& b : layout["buffers"])
    if (b["name"] == buffer) return &b;
  return nullptr;
}

/// The placement whose match is `tensor`, or nullptr.
inline const nlohmann::json* Place(const nlohmann::json& layout, const std::string& tensor) {
  for (const nlohmann::json& p : layout["placements"])
    if (p["match"] == tensor) return &p;
  return nullptr;
}

}  // namespace reshard::init::fixtures
