// One table per architecture: the tensors of a Hugging Face checkpoint, named as
// transformers' modeling_<model_type>.py names them (and as the safetensors
// index of the published checkpoints lists them), with shapes from config.json.
#include "frameworks/architectures.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "runtime/error.h"

namespace reshard::init {
namespace {

using nlohmann::json;

// Reads config fields, naming the file and the field in every error.
class Config {
 public:
  /// `prefix`: where `j` sits in the file ("text_config/": Llama 4's language model).
  Config(const json& j, std::string file, std::string prefix = "")
      : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {}

  [[noreturn]] void Fail(const std::string& field, const std::string& what) const {
    throw Error(file_ + ": /" + prefix_ + field + ": " + what);
  }
  bool Has(const std::string& k) const { return j_.contains(k) && !j_.at(k).is_null(); }
  bool Present(const std::string& k) const { return j_.contains(k); }  // null included
  int64_t Int(const std::string& k) const {
    if (!Present(k)) Fail(k, "missing; a " + Str("model_type") + " config.json has it");
    return Whole(k, 1, "a positive integer");
  }
  int64_t Int(const std::string& k, int64_t def) const { return Has(k) ? Int(k) : def; }
  int64_t IntOrZero(const std::string& k) const {  // 0 allowed (first_k_dense_replace, n_shared_experts)
    return Has(k) ? Whole(k, 0, "an integer >= 0") : 0;
  }
  bool Bool(const std::string& k, bool def) const {
    if (!Has(k)) return def;
    if (!j_.at(k).is_boolean()) Fail(k, "expected true or false, got " + j_.at(k).dump());
    return j_.at(k).get<bool>();
  }
  std::string Str(const std::string& k) const {
    if (!Has(k)) return "";
    if (!j_.at(k).is_string()) Fail(k, "expected a string, got " + j_.at(k).dump());
    return j_.at(k).get<std::string>();
  }
  const json& Raw(const std::string& k) const { return j_.at(k); }
  const std::string& file() const { return file_; }

 private:
  // An integer field, min..4294967295. A whole number past that is too large
  // whether JSON holds it as an integer or, written 1e30, as a float.
  int64_t Whole(const std::string& k, int64_t min, const char* expected) const {
    const json& v = j_.at(k);
    if (v.is_number() && v.get<double>() > 4294967295.0 &&
        (v.is_number_integer() || v.get<double>() == std::floor(v.get<double>())))
      Fail(k, "expected at most 4294967295, got " + v.dump());
    if (!v.is_number_integer() || v.get<int64_t>() < min) Fail(k, std::string("expected ") + expected + ", got " + v.dump());
    return v.get<int64_t>();
  }

  const json& j_;
  std::string file_, prefix_;
};

// Rows shared by the architectures.
void Embeddings(Arch& a, std::vector<ArchTensor>& t) {
  t.push_back({Role::embed, a.lm_prefix + "model.embed_tokens.weight", {a.vocab, a.hidden}, Layers::none});
}
void Head(Arch& a, std::vector<ArchTensor>& t) {
  t.push_back({Role::final_norm, a.lm_prefix + "model.norm.weight", {a.hidden}, Layers::none});
  // Tied embeddings: the checkpoint has no lm_head (transformers ties it to embed_tokens).
  if (!a.tied) t.push_back({Role::lm_head, a.lm_prefix + "lm_head.weight", {a.vocab, a.hidden}, Layers::none});
}
// GQA attention; `o_bias` and `sinks` (gpt-oss): o_proj's bias and the
// per-head sink logits (self_attn.sinks [num_attention_heads]).
void GqaAttention(Arch& a, std::vector<ArchTensor>& t, bool bias, bool qk_norm, bool o_bias = false,
                  bool sinks = false, Layers layers = Layers::all) {
  const std::string p = a.lm_prefix + "model.layers.{layer}.";
  const int64_t hd = a.head_dim, q = a.heads * hd, kv = a.kv_heads * hd;
  t.push_back({Role::input_norm, p + "input_layernorm.weight", {a.hidden}});
  t.push_back({Role::q, p + "self_attn.q_proj.weight", {q, a.hidden}, layers, false, hd});
  t.push_back({Role::k, p + "self_attn.k_proj.weight", {kv, a.hidden}, layers, false, hd});
  t.push_back({Role::v, p + "self_attn.v_proj.weight", {kv, a.hidden}, layers, false, hd});
  if (bias) {
    t.push_back({Role::q_bias, p + "self_attn.q_proj.bias", {q}, layers, false, hd});
    t.push_back({Role::k_bias, p + "self_attn.k_proj.bias", {kv}, layers, false, hd});
    t.push_back({Role::v_bias, p + "self_attn.v_proj.bias", {kv}, layers, false, hd});
  }
  t.push_back({Role::o, p + "self_attn.o_proj.weight", {a.hidden, q}, layers, false, hd});
  if (o_bias) t.push_back({Role::o_bias, p + "self_attn.o_proj.bias", {a.hidden}, layers});
  if (sinks) t.push_back({Role::sinks, p + "self_attn.sinks", {a.heads}, layers, false, 1});
  if (qk_norm) {
    t.push_back({Role::q_norm, p + "self_attn.q_norm.weight", {hd}, layers});
    t.push_back({Role::k_norm, p + "self_attn.k_norm.weight", {hd}, layers});
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
  if (c.Has("mlp_only_layers") && !c.Raw("mlp_only_layers").is_array())
    c.Fail("mlp_only_layers", "expected a list of layer indices, got " + c.Raw("mlp_only_layers").dump());
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

// GLM-4.5 / 4.6 / 4.5-Air (transformers 5.20.2 models/glm4_moe/modeling_glm4_moe.py;
// the checkpoints' safetensors index): GQA with q/k/v biases
// (attention_bias) and optional per-head q/k norms (use_qk_norm: GLM-4.5 and
// 4.6, not 4.5-Air), first_k_dense_replace dense layers, then MoE layers
// (Glm4MoeMoE) with a sigmoid router `mlp.gate` and its fp32
// e_score_correction_bias (Glm4MoeTopkRouter: always, an nn.Buffer kept in
// fp32 by _keep_in_fp32_modules_strict), n_routed_experts experts and
// n_shared_experts fused into one shared MLP of moe_intermediate_size x
// n_shared_experts. The checkpoint's MTP layer (num_nextn_predict_layers:
// model.layers.{num_hidden_layers}.*) is not part of the model spec
// (Glm4MoePreTrainedModel ignores it on load; vLLM skips it: skip_spec_layers).
// Missing first_k_dense_replace / n_shared_experts take Glm4MoeConfig's
// defaults (1 and 1), said in a note.
void Glm4Moe(const Config& c, Arch& a) {
  const std::string cls = " assumed (Glm4MoeConfig, transformers 5.20.2 models/glm4_moe/configuration_glm4_moe.py)";
  a.experts = c.Int("n_routed_experts");
  if (c.Has("first_k_dense_replace")) {
    a.first_moe = c.IntOrZero("first_k_dense_replace");
  } else {
    a.first_moe = 1;
    a.notes.push_back(c.file() + ": no first_k_dense_replace; 1" + cls);
  }
  a.mtp_layers = c.IntOrZero("num_nextn_predict_layers");
  if (a.first_moe >= a.layers) c.Fail("first_k_dense_replace", "must be below num_hidden_layers");
  if (!c.Has("n_shared_experts")) a.notes.push_back(c.file() + ": no n_shared_experts; 1" + cls);
  const int64_t shared = c.Int("n_shared_experts", 1);
  const int64_t h = a.hidden, inter = c.Int("moe_intermediate_size");
  auto& t = a.tensors;
  Embeddings(a, t);
  GqaAttention(a, t, c.Bool("attention_bias", false), c.Bool("use_qk_norm", false));
  const std::string m = "model.layers.{layer}.mlp.";
  if (a.first_moe > 0) DenseMlp(t, m, h, c.Int("intermediate_size"), Layers::dense);
  t.push_back({Role::router, m + "gate.weight", {a.experts, h}, Layers::moe});
  t.push_back({Role::router_bias, m + "gate.e_score_correction_bias", {a.experts}, Layers::moe, true});
  DenseMlp(t, m + "experts.{expert}.", h, inter, Layers::moe, Role::expert_gate, Role::expert_up, Role::expert_down);
  DenseMlp(t, m + "shared_experts.", h, shared * inter, Layers::moe, Role::shared_gate, Role::shared_up,
           Role::shared_down);
  Head(a, t);
}

// gpt-oss (transformers 5.20.2 models/gpt_oss/modeling_gpt_oss.py; the
// safetensors index of openai/gpt-oss-120b): GQA with q/k/v/o biases and
// per-head attention sinks (self_attn.sinks), every layer MoE with a router
// `mlp.router` that has a bias, and experts with biases. The checkpoint fuses
// each layer's experts as GptOssExperts holds them: gate_up_proj [E, H, 2I]
// (gate = columns 0::2, up = 1::2: _apply_gate), gate_up_proj_bias [E, 2I],
// down_proj [E, I, H], down_proj_bias [E, H]; the release stores gate_up_proj
// and down_proj in MXFP4 (*_blocks, *_scales: quantization_config
// "mxfp4"). The weights are [in, out] there, the transpose of what vLLM
// (w13_weight [E, 2I, H]) and Megatron (linear_fc1 [2I, H]) hold, and a
// layout does not transpose: the model spec holds each expert's gate, up and
// down as [out, in] (and their biases) under per-expert names, and says so
// in its notes.
void GptOss(const Config& c, Arch& a) {
  if (!c.Bool("attention_bias", true))
    c.Fail("attention_bias", "vLLM's OAIAttention (models/gpt_oss.py) always builds q/k/v/o biases; expected true");
  a.experts = c.Int("num_local_experts");
  a.interleaved_gate_up = true;
  a.experts_transposed = true;
  const int64_t h = a.hidden, inter = c.Int("intermediate_size");
  auto& t = a.tensors;
  Embeddings(a, t);
  GqaAttention(a, t, true, false, true, true);
  const std::string m = "model.layers.{layer}.mlp.";
  t.push_back({Role::router, m + "router.weight", {a.experts, h}, Layers::moe});
  t.push_back({Role::router_linear_bias, m + "router.bias", {a.experts}, Layers::moe});
  const std::string e = m + "experts.{expert}.";
  DenseMlp(t, e, h, inter, Layers::moe, Role::expert_gate, Role::expert_up, Role::expert_down);
  t.push_back({Role::expert_gate_bias, e + "gate_proj.bias", {inter}, Layers::moe});
  t.push_back({Role::expert_up_bias, e + "up_proj.bias", {inter}, Layers::moe});
  t.push_back({Role::expert_down_bias, e + "down_proj.bias", {h}, Layers::moe});
  Head(a, t);
  a.model_notes =
      "gpt-oss experts per expert as [out, in]: the checkpoint's mlp.experts.gate_up_proj [E, H, 2I] holds them "
      "transposed with gate and up in alternate columns (gate = 0::2, up = 1::2), gate_up_proj_bias [E, 2I] "
      "alternates likewise, down_proj [E, I, H] is down_proj.weight transposed, down_proj_bias [E, H]; the "
      "release stores gate_up_proj and down_proj in MXFP4 (*_blocks, *_scales). Generated by reshard init";
}

// Llama 4 (transformers 5.20.2 models/llama4/modeling_llama4.py; the
// safetensors index of meta-llama/Llama-4-Scout-17B-16E-Instruct and
// -Maverick-17B-128E-Instruct): the released checkpoints are multimodal
// (model_type "llama4", Llama4ForConditionalGeneration: the language model
// under `language_model.`, its fields in `text_config`); a "llama4_text"
// config is the language model alone (Llama4ForCausalLM). GQA without biases
// (the L2 qk norm has no weights), MoE layers at config moe_layers, by default
// every interleave_moe_layer_step-th (Llama4TextConfig.__post_init__:
// range(step - 1, layers, step): Scout every layer, Maverick layers 1, 3, ...),
// the others a dense MLP of intermediate_size_mlp. An MoE layer
// (Llama4TextMoe) has a router `feed_forward.router` [E, H], one shared expert
// `feed_forward.shared_expert` of intermediate_size, and experts fused as
// Llama4TextExperts holds them: gate_up_proj [E, H, 2I] (gate = columns
// 0..I, up = I..2I: chunk(2, dim=-1)), down_proj [E, I, H], the transpose of
// what vLLM and Megatron hold, so the model spec holds each expert's gate,
// up and down as [out, in] under per-expert names (as for gpt-oss). The
// vision encoder and projector are not part of the model spec: a refit
// leaves them as loaded (RL on text keeps them frozen).
void Llama4(const Config& c, Arch& a) {
  if (c.Bool("attention_bias", false))
    c.Fail("attention_bias", "Llama 4 checkpoints have no attention biases; expected false");
  a.experts = c.Int("num_local_experts");
  a.experts_transposed = true;
  std::vector<bool> moe(a.layers, false);
  if (c.Has("moe_layers")) {
    const json& list = c.Raw("moe_layers");
    if (!list.is_array()) c.Fail("moe_layers", "expected a list of layer indices, got " + list.dump());
    for (const json& x : list) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= a.layers)
        c.Fail("moe_layers", "expected layer indices 0.." + std::to_string(a.layers - 1) + ", got " + x.dump());
      moe[x.get<int64_t>()] = true;
    }
  } else {
    const int64_t step = c.Int("interleave_moe_layer_step", 1);
    for (int64_t l = step - 1; l < a.layers; l += step) moe[l] = true;
  }
  a.moe_layer = moe;
  a.first_moe = std::find(moe.begin(), moe.end(), true) - moe.begin();
  if (a.first_moe == a.layers) c.Fail("moe_layers", "names no layer; a Llama 4 model has MoE layers");
  const int64_t h = a.hidden, inter = c.Int("intermediate_size"), hd = a.head_dim;
  if (hd % 2 != 0) c.Fail("head_dim", "Llama 4 rotates pairs of rows: expected an even head_dim, got " + std::to_string(hd));
  auto& t = a.tensors;
  Embeddings(a, t);
  // q_proj and k_proj hold each head's rows in RoPE pairs (2j, 2j + 1)
  // (modeling_llama4.py apply_rotary_emb: view_as_complex of row pairs);
  // vLLM's loader regroups them per head as [even rows; odd rows]
  // (models/llama4.py permute_qk_weight_for_rotary): the spec holds the even
  // and the odd rows of every head apart (q_proj.even / q_proj.odd, heads of
  // d / 2), and each layout puts them back in its order.
  const std::string sa = a.lm_prefix + "model.layers.{layer}.self_attn.";
  t.push_back({Role::input_norm, a.lm_prefix + "model.layers.{layer}.input_layernorm.weight", {h}});
  t.push_back({Role::q, sa + "q_proj.even.weight", {a.heads * hd / 2, h}, Layers::all, false, hd / 2});
  t.push_back({Role::q_odd, sa + "q_proj.odd.weight", {a.heads * hd / 2, h}, Layers::all, false, hd / 2});
  t.push_back({Role::k, sa + "k_proj.even.weight", {a.kv_heads * hd / 2, h}, Layers::all, false, hd / 2});
  t.push_back({Role::k_odd, sa + "k_proj.odd.weight", {a.kv_heads * hd / 2, h}, Layers::all, false, hd / 2});
  t.push_back({Role::v, sa + "v_proj.weight", {a.kv_heads * hd, h}, Layers::all, false, hd});
  t.push_back({Role::o, sa + "o_proj.weight", {h, a.heads * hd}, Layers::all, false, hd});
  t.push_back({Role::post_norm, a.lm_prefix + "model.layers.{layer}.post_attention_layernorm.weight", {h}});
  const std::string m = a.lm_prefix + "model.layers.{layer}.feed_forward.";
  if (std::find(moe.begin(), moe.end(), false) != moe.end())
    DenseMlp(t, m, h, c.Int("intermediate_size_mlp"), Layers::dense);
  t.push_back({Role::router, m + "router.weight", {a.experts, h}, Layers::moe});
  DenseMlp(t, m + "experts.{expert}.", h, inter, Layers::moe, Role::expert_gate, Role::expert_up, Role::expert_down);
  DenseMlp(t, m + "shared_expert.", h, inter, Layers::moe, Role::shared_gate, Role::shared_up, Role::shared_down);
  Head(a, t);
  a.model_notes = "Llama 4 with q_proj and k_proj split into each head's even and odd rows (q_proj.even, "
                  "q_proj.odd: the checkpoint's rows 2j and 2j + 1 of a head, its RoPE pairs); experts per expert "
                  "as [out, in]: the checkpoint's feed_forward.experts.gate_up_proj "
                  "[E, H, 2I] holds them transposed, gate in columns 0..I and up in I..2I, down_proj [E, I, H] is "
                  "down_proj.weight transposed. The vision encoder and projector are not in this spec: a refit "
                  "leaves them as loaded. Generated by reshard init";
}

// Qwen3-Next (transformers 5.20.2 models/qwen3_next/modeling_qwen3_next.py;
// the safetensors index of Qwen/Qwen3-Next-80B-A3B-Instruct): a hybrid of
// Gated DeltaNet linear-attention layers and gated full-attention layers, by
// config layer_types (default: every full_attention_interval-th layer full,
// Qwen3NextConfig.__post_init__), every layer MoE (decoder_sparse_step 1, no
// mlp_only_layers: as the release) with a shared expert and its sigmoid gate
// `mlp.shared_expert_gate` [1, H]. The checkpoint fuses what the frameworks
// cut apart, so the model spec splits it and says so in its notes:
// - full attention: q_proj [2·heads·d, H] holds per head [q_h; gate_h]
//   (Qwen3NextAttention.forward: view(..., heads, 2d).chunk(2)): the spec's
//   self_attn.q_proj.query.weight and .gate.weight, heads of d;
// - linear attention: in_proj_qkvz holds per key head g [q_g; k_g; v_g; z_g]
//   (dk, dk, nv/nk·dv, nv/nk·dv rows) and in_proj_ba per key head [b_g; a_g]
//   (fix_query_key_value_ordering): the spec's in_proj_qkvz.{q,k,v,z}.weight
//   and in_proj_ba.{b,a}.weight; conv1d [2·nk·dk + nv·dv, 1, K] holds the
//   channels [q; k; v] (forward: torch.cat((query, key, value))): conv1d.{q,k,v}.weight.
// dt_bias and A_log are per value head, norm (Qwen3NextRMSNormGated) one value
// head's weight. The MTP layer (mtp.*) is not part of the model spec (vLLM
// skips it: hf_to_vllm_mapper "mtp." -> None).
void Qwen3Next(const Config& c, Arch& a) {
  if (c.Int("decoder_sparse_step", 1) != 1) c.Fail("decoder_sparse_step", "only 1 (every layer MoE) is supported");
  if (c.Has("mlp_only_layers") && (!c.Raw("mlp_only_layers").is_array() || !c.Raw("mlp_only_layers").empty()))
    c.Fail("mlp_only_layers", "dense layers among MoE layers are not supported; expected []");
  a.experts = c.Int("num_experts");
  // layer_types, or every full_attention_interval-th layer full.
  std::vector<bool> linear(a.layers, false);
  if (c.Has("layer_types")) {
    const json& types = c.Raw("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != a.layers)
      c.Fail("layer_types", "expected a list of " + std::to_string(a.layers) + " layer types, got " + types.dump());
    for (size_t l = 0; l < types.size(); ++l) {
      if (types[l] != "linear_attention" && types[l] != "full_attention")
        c.Fail("layer_types/" + std::to_string(l), "expected \"linear_attention\" or \"full_attention\", got " +
                                                       types[l].dump());
      linear[l] = types[l] == "linear_attention";
    }
  } else {
    const int64_t interval = c.Int("full_attention_interval", 4);
    for (int64_t l = 0; l < a.layers; ++l) linear[l] = (l + 1) % interval != 0;
    if (!c.Has("full_attention_interval"))
      a.notes.push_back(c.file() + ": no layer_types or full_attention_interval; every 4th layer full attention "
                                   "assumed (Qwen3NextConfig, transformers 5.20.2 models/qwen3_next/configuration_qwen3_next.py)");
  }
  a.linear_layer = linear;
  if (c.Bool("attention_bias", false)) c.Fail("attention_bias", "Qwen3-Next has no attention biases; expected false");
  const int64_t h = a.hidden, hd = a.head_dim, nk = c.Int("linear_num_key_heads"), nv = c.Int("linear_num_value_heads");
  const int64_t dk = c.Int("linear_key_head_dim"), dv = c.Int("linear_value_head_dim"), k = c.Int("linear_conv_kernel_dim");
  if (nv % nk != 0)
    c.Fail("linear_num_value_heads", "must be a multiple of linear_num_key_heads (" + std::to_string(nk) + "), got " +
                                         std::to_string(nv));
  auto& t = a.tensors;
  const std::string p = "model.layers.{layer}.", la = p + "linear_attn.", sa = p + "self_attn.";
  const Layers full = Layers::full_attn, lin = Layers::linear_attn;
  Embeddings(a, t);
  t.push_back({Role::input_norm, p + "input_layernorm.weight", {h}});
  // Gated full attention.
  t.push_back({Role::q, sa + "q_proj.query.weight", {a.heads * hd, h}, full, false, hd});
  t.push_back({Role::q_gate, sa + "q_proj.gate.weight", {a.heads * hd, h}, full, false, hd});
  t.push_back({Role::k, sa + "k_proj.weight", {a.kv_heads * hd, h}, full, false, hd});
  t.push_back({Role::v, sa + "v_proj.weight", {a.kv_heads * hd, h}, full, false, hd});
  t.push_back({Role::o, sa + "o_proj.weight", {h, a.heads * hd}, full, false, hd});
  t.push_back({Role::q_norm, sa + "q_norm.weight", {hd}, full});
  t.push_back({Role::k_norm, sa + "k_norm.weight", {hd}, full});
  // Gated DeltaNet.
  t.push_back({Role::lin_q, la + "in_proj_qkvz.q.weight", {nk * dk, h}, lin, false, dk});
  t.push_back({Role::lin_k, la + "in_proj_qkvz.k.weight", {nk * dk, h}, lin, false, dk});
  t.push_back({Role::lin_v, la + "in_proj_qkvz.v.weight", {nv * dv, h}, lin, false, dv});
  t.push_back({Role::lin_z, la + "in_proj_qkvz.z.weight", {nv * dv, h}, lin, false, dv});
  t.push_back({Role::lin_b, la + "in_proj_ba.b.weight", {nv, h}, lin, false, 1});
  t.push_back({Role::lin_a, la + "in_proj_ba.a.weight", {nv, h}, lin, false, 1});
  t.push_back({Role::conv_q, la + "conv1d.q.weight", {nk * dk, 1, k}, lin, false, dk});
  t.push_back({Role::conv_k, la + "conv1d.k.weight", {nk * dk, 1, k}, lin, false, dk});
  t.push_back({Role::conv_v, la + "conv1d.v.weight", {nv * dv, 1, k}, lin, false, dv});
  t.push_back({Role::lin_dt_bias, la + "dt_bias", {nv}, lin, false, 1});
  t.push_back({Role::lin_a_log, la + "A_log", {nv}, lin, false, 1});
  t.push_back({Role::lin_norm, la + "norm.weight", {dv}, lin});
  t.push_back({Role::lin_out, la + "out_proj.weight", {h, nv * dv}, lin, false, dv});
  t.push_back({Role::post_norm, p + "post_attention_layernorm.weight", {h}});
  // MoE.
  const std::string m = p + "mlp.";
  const int64_t inter = c.Int("moe_intermediate_size"), shared = c.Int("shared_expert_intermediate_size");
  t.push_back({Role::router, m + "gate.weight", {a.experts, h}, Layers::moe});
  DenseMlp(t, m + "experts.{expert}.", h, inter, Layers::moe, Role::expert_gate, Role::expert_up, Role::expert_down);
  DenseMlp(t, m + "shared_expert.", h, shared, Layers::moe, Role::shared_gate, Role::shared_up, Role::shared_down);
  t.push_back({Role::shared_expert_gate, m + "shared_expert_gate.weight", {1, h}, Layers::moe});
  Head(a, t);
  a.model_notes =
      "Qwen3-Next with the checkpoint's fused tensors split: self_attn.q_proj.weight is per head [query; gate] "
      "(q_proj.query, q_proj.gate); linear_attn.in_proj_qkvz.weight is per key head [q; k; v; z] "
      "(in_proj_qkvz.q/k/v/z, the v and z of a key head's value heads), in_proj_ba.weight per key head [b; a]; "
      "conv1d.weight is [q; k; v] channels (conv1d.q/k/v). The MTP layer (mtp.*) is not in this spec. Generated "
      "by reshard init";
}

// What transformers builds when config.json leaves out num_key_value_heads or
// head_dim: the defaults of the architecture's config class (transformers
// 5.20.2, models/<model_type>/configuration_<model_type>.py) or, where the
// class has no such field, what the modeling file falls back to.
struct Defaults {
  const char* source;            // the class and file, for the note
  int64_t kv_heads = 0;          // num_key_value_heads when missing; 0: num_attention_heads
  bool kv_null_is_heads = true;  // null -> num_attention_heads (__post_init__); false: null is an error
  int64_t head_dim = 0;          // head_dim when missing; 0: hidden_size // num_attention_heads
  bool head_dim_null_computed = false;  // null -> hidden_size // num_attention_heads; false: null is an error
};

// LlamaConfig (configuration_llama.py): num_key_value_heads and head_dim
// default to None, __post_init__ sets them to num_attention_heads and
// hidden_size // num_attention_heads.
const Defaults kLlama{"LlamaConfig, transformers 5.20.2 models/llama/configuration_llama.py", 0, true, 0, true};
// Qwen2Config (configuration_qwen2.py): num_key_value_heads = 32 (None ->
// num_attention_heads in __post_init__); no head_dim field: Qwen2Attention
// (modeling_qwen2.py) takes getattr(config, "head_dim", hidden_size // num_attention_heads).
const Defaults kQwen2{"Qwen2Config, transformers 5.20.2 models/qwen2/configuration_qwen2.py, and Qwen2Attention in "
                      "modeling_qwen2.py",
                      32, true, 0, false};
// Qwen3Config (configuration_qwen3.py): num_key_value_heads = 32 (None ->
// num_attention_heads), head_dim: int = 128 (not hidden / heads: Qwen3-32B
// has 5120 / 64 = 80, and heads of 128).
const Defaults kQwen3{"Qwen3Config, transformers 5.20.2 models/qwen3/configuration_qwen3.py", 32, true, 128, false};
// Qwen3MoeConfig (configuration_qwen3_moe.py): num_key_value_heads: int = 4
// (no __post_init__ for None); no head_dim field: Qwen3MoeAttention
// (modeling_qwen3_moe.py) takes getattr(config, "head_dim", hidden_size // num_attention_heads).
const Defaults kQwen3Moe{"Qwen3MoeConfig, transformers 5.20.2 models/qwen3_moe/configuration_qwen3_moe.py, and "
                         "Qwen3MoeAttention in modeling_qwen3_moe.py",
                         4, false, 0, false};
// MixtralConfig (configuration_mixtral.py): num_key_value_heads = 8 (None ->
// num_attention_heads), head_dim = None: MixtralAttention (modeling_mixtral.py)
// takes getattr(config, "head_dim", None) or hidden_size // num_attention_heads.
const Defaults kMixtral{"MixtralConfig, transformers 5.20.2 models/mixtral/configuration_mixtral.py", 8, true, 0, true};
// Glm4MoeConfig (configuration_glm4_moe.py): num_key_value_heads: int = 8
// (no __post_init__ for None); no head_dim field: Glm4MoeAttention
// (modeling_glm4_moe.py) takes getattr(config, "head_dim", hidden_size // num_attention_heads).
const Defaults kGlm4Moe{"Glm4MoeConfig, transformers 5.20.2 models/glm4_moe/configuration_glm4_moe.py, and "
                        "Glm4MoeAttention in modeling_glm4_moe.py",
                        8, false, 0, false};
// GptOssConfig (configuration_gpt_oss.py): num_key_value_heads: int = 8,
// head_dim: int = 64; __post_init__ sets None to num_attention_heads and
// hidden_size // num_attention_heads.
const Defaults kGptOss{"GptOssConfig, transformers 5.20.2 models/gpt_oss/configuration_gpt_oss.py", 8, true, 64, true};

// Llama4TextConfig (configuration_llama4.py): num_key_value_heads: int = 8,
// head_dim: int = 128; __post_init__ sets None to num_attention_heads and
// hidden_size // num_attention_heads.
const Defaults kLlama4{"Llama4TextConfig, transformers 5.20.2 models/llama4/configuration_llama4.py", 8, true, 128,
                       true};

// Qwen3NextConfig (configuration_qwen3_next.py): num_key_value_heads: int = 2,
// head_dim: int = 256 (no __post_init__ for None).
const Defaults kQwen3Next{"Qwen3NextConfig, transformers 5.20.2 models/qwen3_next/configuration_qwen3_next.py", 2,
                          false, 256, false};

struct Table {
  const char* model_type;
  const char* uses;              // the table it shares (kimi_k2 is DeepSeek-V3)
  std::function<void(const Config&, Arch&)> fill;
  const Defaults* defaults;      // nullptr: MLA, the table derives its heads (DeepseekV3)
};

const std::vector<Table>& Tables() {
  static const std::vector<Table> tables = {
      {"llama", "llama", Llama, &kLlama},
      {"qwen2", "qwen2", Qwen2, &kQwen2},
      {"qwen3", "qwen3", Qwen3, &kQwen3},
      {"qwen3_moe", "qwen3_moe", Qwen3Moe, &kQwen3Moe},
      {"mixtral", "mixtral", Mixtral, &kMixtral},
      {"deepseek_v3", "deepseek_v3", DeepseekV3, nullptr},
      {"kimi_k2", "deepseek_v3", DeepseekV3, nullptr},
      {"glm4_moe", "glm4_moe", Glm4Moe, &kGlm4Moe},
      {"gpt_oss", "gpt_oss", GptOss, &kGptOss},
      {"qwen3_next", "qwen3_next", Qwen3Next, &kQwen3Next},
      {"llama4", "llama4", Llama4, &kLlama4},
      {"llama4_text", "llama4", Llama4, &kLlama4},
  };
  return tables;
}

// num_key_value_heads and head_dim as transformers builds them, with a note
// for what the config left out.
void GqaHeads(const Config& c, const Defaults& d, Arch& a) {
  const std::string why = " assumed (" + std::string(d.source) + ")";
  if (!c.Has("num_key_value_heads") && (d.kv_null_is_heads || !c.Present("num_key_value_heads"))) {
    const bool null = c.Present("num_key_value_heads");
    a.kv_heads = null || d.kv_heads == 0 ? a.heads : d.kv_heads;
    a.notes.push_back(c.file() + (null ? ": num_key_value_heads is null; " : ": no num_key_value_heads; ") +
                      std::to_string(a.kv_heads) +
                      (null || d.kv_heads == 0 ? " (num_attention_heads)" : "") + why);
  } else {
    a.kv_heads = c.Int("num_key_value_heads");
  }
  if (a.heads % a.kv_heads != 0)
    c.Fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(a.heads) + "), got " +
                                      std::to_string(a.kv_heads));
  if (!c.Has("head_dim") && (d.head_dim_null_computed || !c.Present("head_dim"))) {
    const bool computed = c.Present("head_dim") || d.head_dim == 0;
    a.head_dim = computed ? a.hidden / a.heads : d.head_dim;
    a.notes.push_back(c.file() + (c.Present("head_dim") ? ": head_dim is null; " : ": no head_dim; ") +
                      (computed ? "hidden_size // num_attention_heads = " + std::to_string(a.hidden) + " // " +
                                      std::to_string(a.heads) + " = " + std::to_string(a.head_dim)
                                : std::to_string(a.head_dim)) +
                      why);
  } else {
    a.head_dim = c.Int("head_dim");
  }
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> LayerRuns(const Arch& a, Layers layers) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t l = 0; l < a.layers; ++l) {
    const bool moe = !a.moe_layer.empty() && a.moe_layer[l];
    const bool linear = !a.linear_layer.empty() && a.linear_layer[l];
    bool in = false;
    switch (layers) {
      case Layers::none: in = false; break;
      case Layers::all: in = true; break;
      case Layers::dense: in = !moe; break;
      case Layers::moe: in = moe; break;
      case Layers::linear_attn: in = linear; break;
      case Layers::full_attn: in = !linear; break;
    }
    if (!in) continue;
    if (!runs.empty() && runs.back().second == l) runs.back().second = l + 1;
    else runs.emplace_back(l, l + 1);
  }
  return runs;
}

nlohmann::ordered_json LayerRange(const Arch& a, const std::vector<std::pair<int64_t, int64_t>>& runs) {
  if (runs.size() == 1 && runs[0].first == 0 && runs[0].second == a.layers) return nullptr;
  if (runs.size() == 1) return {runs[0].first, runs[0].second};
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& [lo, hi] : runs) out.push_back(nlohmann::ordered_json::array({lo, hi}));
  return out;
}

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
                             "; reshard init supports " + list +
                             ". For another architecture, write the model spec by hand: the shortest way is init "
                             "with the closest model_type above, then edit the tensors' names and shapes "
                             "(docs/specs.md, \"Writing a model spec by hand\")");
  }
  Arch a;
  a.model_type = table->uses;
  // A multimodal checkpoint's language model: its fields in text_config, its
  // tensors under language_model. (Llama4ForConditionalGeneration).
  if (type == "llama4") {
    if (!c.Has("text_config") || !c.Raw("text_config").is_object())
      c.Fail("text_config", "missing; a llama4 config.json holds the language model's fields there");
    a.lm_prefix = "language_model.";
  }
  const Config lm = type == "llama4" ? Config(c.Raw("text_config"), file, "text_config/") : c;
  a.layers = lm.Int("num_hidden_layers");
  a.hidden = lm.Int("hidden_size");
  a.vocab = lm.Int("vocab_size");
  a.heads = lm.Int("num_attention_heads");
  if (table->defaults) GqaHeads(lm, *table->defaults, a);  // MLA: the table derives its own
  a.tied = c.Bool("tie_word_embeddings", false);
  if (c.Has("quantization_config")) {
    const json& q = c.Raw("quantization_config");
    if (!q.is_object()) c.Fail("quantization_config", "expected an object, got " + q.dump());
    const json method = q.value("quant_method", json(""));
    if (method == "mxfp4" && type == "gpt_oss") {
      // gpt-oss's release: MXFP4 experts. The model spec is BF16 (what
      // training holds); frameworks/vllm.cc refuses an MXFP4-serving engine.
      a.mxfp4_release = true;
    } else {
      if (method != "fp8" || !q.contains("weight_block_size"))
        c.Fail("quantization_config", "only FP8 checkpoints with block scales (quant_method 'fp8', weight_block_size) "
                                      "and gpt-oss's MXFP4 release (quant_method 'mxfp4') are supported, got " + q.dump());
      const json& b = q.at("weight_block_size");
      auto positive = [](const json& x) { return x.is_number_integer() && x.get<int64_t>() > 0; };
      if (!b.is_array() || b.size() != 2 || !positive(b[0]) || !positive(b[1]))
        c.Fail("quantization_config/weight_block_size", "expected [rows, cols] (positive integers), got " + b.dump());
      a.fp8_block = std::make_pair(b[0].get<int64_t>(), b[1].get<int64_t>());
    }
  }
  table->fill(lm, a);
  if (a.experts == 0) a.first_moe = a.layers;
  if (a.moe_layer.empty())
    for (int64_t l = 0; l < a.layers; ++l) a.moe_layer.push_back(a.experts > 0 && l >= a.first_moe);
  std::string name = c.Str("_name_or_path");
  if (auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  a.name = name.empty() ? type : name;
  return a;
}

}  // namespace reshard::init
