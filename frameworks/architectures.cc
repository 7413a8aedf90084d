// One table per architecture: the tensors of a Hugging Face checkpoint, named as
// transformers' modeling_<model_type>.py names them (and as the safetensors
// index of the published checkpoints lists them), with shapes from config.json.
#include "frameworks/architectures.h"

#include <algorithm>
#include <functional>
#include <map>

#include "runtime/error.h"

namespace reshard::init {
namespace {

using nlohmann::json;

// Reads config fields, naming the file and the field in every error.
class Config {
 public:
  Config(const json& j, std::string file) : j_(j), file_(std::move(file)) {}

  [[noreturn]] void Fail(const std::string& field, const std::string& what) const {
    throw Error(file_ + ": /" + field + ": " + what);
  }
  bool Has(const std::string& k) const { return j_.contains(k) && !j_.at(k).is_null(); }
  int64_t Int(const std::string& k) const {
    if (!Has(k)) Fail(k, "missing; a " + Str("model_type") + " config.json has it");
    const json& v = j_.at(k);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) Fail(k, "expected a positive integer, got " + v.dump());
    return v.get<int64_t>();
  }
  int64_t Int(const std::string& k, int64_t def) const { return Has(k) ? Int(k) : def; }
  int64_t IntOrZero(const std::string& k) const {  // 0 allowed (first_k_dense_replace, n_shared_experts)
    if (!Has(k)) return 0;
    const json& v = j_.at(k);
    if (!v.is_number_integer() || v.get<int64_t>() < 0) Fail(k, "expected an integer >= 0, got " + v.dump());
    return v.get<int64_t>();
  }
  bool Bool(const std::string& k, bool def) const {
    if (!Has(k)) return def;
    if (!j_.at(k).is_boolean()) Fail(k, "expected true or false, got " + j_.at(k).dump());
    return j_.at(k).get<bool>();
  }
  std::string Str(const std::string& k) const {
    if (!Has(k) || !j_.at(k).is_string()) return "";
    return j_.at(k).get<std::string>();
  }
  const json& Raw(const std::string& k) const { return j_.at(k); }

 private:
  const json& j_;
  std::string file_;
};

// Rows shared by the architectures.
void Embeddings(Arch& a, std::vector<ArchTensor>& t) {
  t.push_back({Role::embed, "model.embed_tokens.weight", {a.vocab, a.hidden}, Layers::none});
}
void Head(Arch& a, std::vector<ArchTensor>& t) {
  t.push_back({Role::final_norm, "model.norm.weight", {a.hidden}, Layers::none});
  // Tied embeddings: the checkpoint has no lm_head (transformers ties it to embed_tokens).
  if (!a.tied) t.push_back({Role::lm_head, "lm_head.weight", {a.vocab, a.hidden}, Layers::none});
}
void GqaAttention(Arch& a, std::vector<ArchTensor>& t, bool bias, bool qk_norm) {
  const std::string p = "model.layers.{layer}.";
  const int64_t hd = a.head_dim, q = a.heads * hd, kv = a.kv_heads * hd;
  t.push_back({Role::input_norm, p + "input_layernorm.weight", {a.hidden}});
  t.push_back({Role::q, p + "self_attn.q_proj.weight", {q, a.hidden}, Layers::all, false, hd});
  t.push_back({Role::k, p + "self_attn.k_proj.weight", {kv, a.hidden}, Layers::all, false, hd});
  t.push_back({Role::v, p + "self_attn.v_proj.weight", {kv, a.hidden}, Layers::all, false, hd});
  if (bias) {
    t.push_back({Role::q_bias, p + "self_attn.q_proj.bias", {q}, Layers::all, false, hd});
    t.push_back({Role::k_bias, p + "self_attn.k_proj.bias", {kv}, Layers::all, false, hd});
    t.push_back({Role::v_bias, p + "self_attn.v_proj.bias", {kv}, Layers::all, false, hd});
  }
  t.push_back({Role::o, p + "self_attn.o_proj.weight", {a.hidden, q}, Layers::all, false, hd});
  if (qk_norm) {
    t.push_back({Role::q_norm, p + "self_attn.q_norm.weight", {hd}});
    t.push_back({Role::k_norm, p + "self_attn.k_norm.weight", {hd}});
  }
  t.push_back({Role::post_norm, p + "post_attention_layernorm.weight", {a.hidden}});
}
void DenseMlp(std::vector<ArchTensor>& t, const std::string& prefix, int64_t hidden, int64_t inter, Layers layers,
              Role g = Role::gate, Role u = Role::up, Role d = Role::down) {
  t.push_back({g, prefix + "gate_proj.weight", {inter, hidden}, layers});
  t.push_back({u, prefix + "up_proj.weight", {inter, hidden}, layers});
  t.push_back({d, prefix + "down_proj.weight", {hidden, inter}, layers});
}

// --- the tables ----------------------------------------------------------------

// Llama 3.x (transformers modeling_llama.py): GQA, SwiGLU MLP, optional
// attention_bias, tied embeddings on the small models.
void Llama(const Config& c, Arch& a) {
  auto& t = a.tensors;
  Embeddings(a, t);
  GqaAttention(a, t, c.Bool("attention_bias", false), false);
  DenseMlp(t, "model.layers.{layer}.mlp.", a.hidden, c.Int("intermediate_size"), Layers::all);
  Head(a, t);
}

// Qwen2 / Qwen2.5 (modeling_qwen2.py): Llama with q/k/v biases always.
void Qwen2(const Config& c, Arch& a) {
  auto& t = a.tensors;
  Embeddings(a, t);
  GqaAttention(a, t, true, false);
  DenseMlp(t, "model.layers.{layer}.mlp.", a.hidden, c.Int("intermediate_size"), Layers::all);
  Head(a, t);
}

// Qwen3 (modeling_qwen3.py): per-head RMSNorm on q and k, explicit head_dim.
void Qwen3(const Config& c, Arch& a) {
  auto& t = a.tensors;
  Embeddings(a, t);
  GqaAttention(a, t, c.Bool("attention_bias", false), true);
  DenseMlp(t, "model.layers.{layer}.mlp.", a.hidden, c.Int("intermediate_size"), Layers::all);
  Head(a, t);
}

// Qwen3-MoE (modeling_qwen3_moe.py): Qwen3 attention, every layer MoE
// (decoder_sparse_step 1, no mlp_only_layers), router mlp.gate, no shared expert.
void Qwen3Moe(const Config& c, Arch& a) {
  if (c.Int("decoder_sparse_step", 1) != 1) c.Fail("decoder_sparse_step", "only 1 (every layer MoE) is supported");
  if (c.Has("mlp_only_layers") && !c.Raw("mlp_only_layers").empty())
    c.Fail("mlp_only_layers", "dense layers among MoE layers are not supported; expected []");
  a.experts = c.Int("num_experts");
  const int64_t inter = c.Int("moe_intermediate_size");
  auto& t = a.tensors;
  Embeddings(a, t);
  GqaAttention(a, t, c.Bool("attention_bias", false), true);
  const std::string p = "model.layers.{layer}.mlp.";
  t.push_back({Role::router, p + "gate.weight", {a.experts, a.hidden}, Layers::moe});
  DenseMlp(t, p + "experts.{expert}.", a.hidden, inter, Layers::moe, Role::expert_gate, Role::expert_up,
           Role::expert_down);
  Head(a, t);
}

// Mixtral (modeling_mixtral.py): block_sparse_moe with experts w1 (gate),
// w3 (up), w2 (down) of intermediate_size.
void Mixtral(const Config& c, Arch& a) {
  a.experts = c.Int("num_local_experts");
  const int64_t inter = c.Int("intermediate_size");
  auto& t = a.tensors;
  Embeddings(a, t);
  GqaAttention(a, t, false, false);
  const std::string p = "model.layers.{layer}.block_sparse_moe.";
  t.push_back({Role::router, p + "gate.weight", {a.experts, a.hidden}, Layers::moe});
  t.push_back({Role::expert_gate, p + "experts.{expert}.w1.weight", {inter, a.hidden}, Layers::moe});
  t.push_back({Role::expert_up, p + "experts.{expert}.w3.weight", {inter, a.hidden}, Layers::moe});
  t.push_back({Role::expert_down, p + "experts.{expert}.w2.weight", {a.hidden, inter}, Layers::moe});
  Head(a, t);
}

// DeepSeek-V3 / R1 and Kimi-K2 (modeling_deepseek.py of the checkpoints): MLA
// attention (q LoRA optional), first_k_dense_replace dense layers, then MoE
// layers with a sigmoid router and its e_score_correction_bias (noaux_tc), and
// n_shared_experts fused into one shared MLP. The MTP layer
// (num_nextn_predict_layers) is not part of the model spec.
void DeepseekV3(const Config& c, Arch& a) {
  if (c.Int("moe_layer_freq", 1) != 1) c.Fail("moe_layer_freq", "only 1 (every layer after the dense ones MoE) is supported");
  a.mla = true;
  a.experts = c.Int("n_routed_experts");
  a.first_moe = c.IntOrZero("first_k_dense_replace");
  a.mtp_layers = c.IntOrZero("num_nextn_predict_layers");
  if (a.first_moe >= a.layers) c.Fail("first_k_dense_replace", "must be below num_hidden_layers");
  a.kv_heads = 0;
  const int64_t nope = c.Int("qk_nope_head_dim"), rope = c.Int("qk_rope_head_dim"), vdim = c.Int("v_head_dim");
  const int64_t kv_lora = c.Int("kv_lora_rank"), h = a.hidden, n = a.heads;
  a.head_dim = nope + rope;
  const std::string p = "model.layers.{layer}.self_attn.";
  auto& t = a.tensors;
  Embeddings(a, t);
  t.push_back({Role::input_norm, "model.layers.{layer}.input_layernorm.weight", {h}});
  if (c.Has("q_lora_rank")) {
    const int64_t q_lora = c.Int("q_lora_rank");
    t.push_back({Role::mla_q_a, p + "q_a_proj.weight", {q_lora, h}});
    t.push_back({Role::mla_q_a_norm, p + "q_a_layernorm.weight", {q_lora}});
    t.push_back({Role::mla_q_b, p + "q_b_proj.weight", {n * (nope + rope), q_lora}, Layers::all, false, nope + rope});
  } else {
    t.push_back({Role::mla_q, p + "q_proj.weight", {n * (nope + rope), h}, Layers::all, false, nope + rope});
  }
  t.push_back({Role::mla_kv_a, p + "kv_a_proj_with_mqa.weight", {kv_lora + rope, h}});
  t.push_back({Role::mla_kv_a_norm, p + "kv_a_layernorm.weight", {kv_lora}});
  t.push_back({Role::mla_kv_b, p + "kv_b_proj.weight", {n * (nope + vdim), kv_lora}, Layers::all, false, nope + vdim});
  t.push_back({Role::o, p + "o_proj.weight", {h, n * vdim}, Layers::all, false, vdim});
  t.push_back({Role::post_norm, "model.layers.{layer}.post_attention_layernorm.weight", {h}});
  const std::string m = "model.layers.{layer}.mlp.";
  if (a.first_moe > 0) DenseMlp(t, m, h, c.Int("intermediate_size"), Layers::dense);
  const int64_t inter = c.Int("moe_intermediate_size");
  t.push_back({Role::router, m + "gate.weight", {a.experts, h}, Layers::moe});
  if (c.Str("topk_method") == "noaux_tc")
    t.push_back({Role::router_bias, m + "gate.e_score_correction_bias", {a.experts}, Layers::moe, true});
  DenseMlp(t, m + "experts.{expert}.", h, inter, Layers::moe, Role::expert_gate, Role::expert_up, Role::expert_down);
  if (const int64_t shared = c.IntOrZero("n_shared_experts"); shared > 0)
    DenseMlp(t, m + "shared_experts.", h, shared * inter, Layers::moe, Role::shared_gate, Role::shared_up,
             Role::shared_down);
  Head(a, t);
}

struct Table {
  const char* model_type;
  const char* uses;              // the table it shares (kimi_k2 is DeepSeek-V3)
  std::function<void(const Config&, Arch&)> fill;
};

const std::vector<Table>& Tables() {
  static const std::vector<Table> tables = {
      {"llama", "llama", Llama},          {"qwen2", "qwen2", Qwen2},
      {"qwen3", "qwen3", Qwen3},          {"qwen3_moe", "qwen3_moe", Qwen3Moe},
      {"mixtral", "mixtral", Mixtral},    {"deepseek_v3", "deepseek_v3", DeepseekV3},
      {"kimi_k2", "deepseek_v3", DeepseekV3},
  };
  return tables;
}

}  // namespace

std::vector<std::string> ArchModelTypes() {
  std::vector<std::string> out;
  for (const auto& t : Tables()) out.push_back(t.model_type);
  return out;
}

Arch ParseArch(const json& j, const std::string& file) {
  if (!j.is_object()) throw Error(file + ": expected a JSON object (a Hugging Face config.json)");
  Config c(j, file);
  const std::string type = c.Str("model_type");
  const Table* table = nullptr;
  for (const auto& t : Tables())
    if (type == t.model_type) table = &t;
  if (!table) {
    std::string list;
    for (const auto& t : Tables()) list += (list.empty() ? "" : ", ") + std::string(t.model_type);
    c.Fail("model_type", (type.empty() ? std::string("missing") : "unknown model_type '" + type + "'") +
                             "; reshard init supports " + list);
  }
  Arch a;
  a.model_type = table->uses;
  a.layers = c.Int("num_hidden_layers");
  a.hidden = c.Int("hidden_size");
  a.vocab = c.Int("vocab_size");
  a.heads = c.Int("num_attention_heads");
  a.kv_heads = c.Int("num_key_value_heads", a.heads);
  if (a.heads % a.kv_heads != 0)
    c.Fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(a.heads) + ")");
  a.head_dim = c.Int("head_dim", a.hidden / a.heads);
  a.tied = c.Bool("tie_word_embeddings", false);
  if (c.Has("quantization_config")) {
    const json& q = c.Raw("quantization_config");
    const std::string method = q.value("quant_method", "");
    if (method != "fp8" || !q.contains("weight_block_size"))
      c.Fail("quantization_config", "only FP8 checkpoints with block scales (quant_method 'fp8', weight_block_size) are "
                                    "supported, got " + q.dump());
    const json& b = q.at("weight_block_size");
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer())
      c.Fail("quantization_config/weight_block_size", "expected [rows, cols], got " + b.dump());
    a.fp8_block = std::make_pair(b[0].get<int64_t>(), b[1].get<int64_t>());
  }
  table->fill(c, a);
  if (a.experts == 0) a.first_moe = a.layers;
  std::string name = c.Str("_name_or_path");
  if (auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  a.name = name.empty() ? type : name;
  return a;
}

}  // namespace reshard::init
