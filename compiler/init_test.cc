// reshard init: every architecture's table, the frameworks' rules (names,
// dtypes, padding, KV replication, experts) and the errors that name them.
#include "compiler/init.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>

#include "compiler/expand.h"
#include "compiler/spec.h"
#include "compiler/init_test_util.h"
#include "compiler/test.h"

namespace reshard::init {
namespace {

using nlohmann::json;
using testing::ErrorOf;
using fixtures::File;
using fixtures::Gen;
using fixtures::Place;
using fixtures::Rule;
using fixtures::Tiny;

// Compiles and validates the generated specs: every destination element
// written exactly once from the right source.
void CompileAndValidate(const Result& r) {
  const json model = File(r, "model.json");
  auto bytes = testing::CompileJson(model, File(r, "train.json"), File(r, "infer.json"), testing::TinyCluster());
  const ValidateReport report = testing::ValidateBytes(std::move(bytes));
  EXPECT_TRUE(report.ok()) << (report.errors.empty() ? "" : report.errors.front());
}

// Every architecture, both frameworks both ways, and the plain HF sides.
TEST(Init, EveryArchitectureCompilesAndValidates) {
  for (const std::string& type : SupportedModelTypes()) {
    SCOPED_TRACE(type);
    const json c = Tiny(type);
    const bool moe = fixtures::Moe(type);
    const std::string ep = moe ? ",ep=2,etp=1" : "";
    const bool megatron = true;
    const std::string src = "megatron:tp=2,pp=2" + ep;
    CompileAndValidate(Gen(c, src, "vllm:tp=2,dp=2"));
    CompileAndValidate(Gen(c, megatron ? "megatron:tp=2,pp=2" + ep + ",spec=local" : "hf:tp=2", "hf"));
    if (megatron) CompileAndValidate(Gen(c, "hf:tp=2", "megatron:tp=2,pp=2,vpp=2" + ep + (moe ? ",grouped-gemm" : "")));
    if (moe) CompileAndValidate(Gen(c, megatron ? "megatron:pp=2,ep=4,etp=1" : "hf", "vllm:tp=2,dp=2,ep,engines=2"));
  }
}

TEST(Init, UnknownModelTypeListsTheSupportedOnes) {
  json c = Tiny("llama");
  c["model_type"] = "gpt2";
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "hf"); }),
            "config.json: /model_type: unknown model_type 'gpt2'; reshard init supports llama, qwen2, qwen3, qwen3_moe, "
            "mixtral, deepseek_v3, kimi_k2, glm4_moe, gpt_oss, qwen3_next, llama4, llama4_text. For another architecture, write the model spec by hand: "
            "the shortest way is init with the closest model_type above, then edit the tensors' names and shapes "
            "(docs/specs.md, \"Writing a model spec by hand\")");
  c.erase("hidden_size");
  c["model_type"] = "llama";
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "hf"); }), "config.json: /hidden_size: missing; a llama config.json has it");
}

TEST(Init, ModelSpecCarriesHeadsRangesAndBiases) {
  const json m = File(Gen(Tiny("deepseek_v3"), "hf", "hf"), "model.json");
  EXPECT_EQ(m["dims"], json({{"layer", 4}, {"expert", 8}}));
  for (const json& t : m["tensors"]) {
    const std::string n = t["name"];
    if (n == "model.layers.{layer}.self_attn.q_b_proj.weight") {
      EXPECT_EQ(t["shape"], json({4 * 24, 32}));
      EXPECT_EQ(t["heads"], json({{"dim", 0}, {"size", 24}}));
    }
    if (n == "model.layers.{layer}.self_attn.o_proj.weight") {
      EXPECT_EQ(t["heads"], json({{"dim", 1}, {"size", 16}}));
    }
    if (n == "model.layers.{layer}.mlp.gate_proj.weight") {
      EXPECT_EQ(t["range"], json({{"layer", {0, 1}}}));
    }
    if (n == "model.layers.{layer}.mlp.gate.e_score_correction_bias") {
      EXPECT_EQ(t["dtype"], "fp32");
      EXPECT_EQ(t["range"], json({{"layer", {1, 4}}}));
    }
  }
  const json q2 = File(Gen(Tiny("qwen2"), "hf", "hf"), "model.json");
  EXPECT_EQ(q2["tensors"][6]["name"], "model.layers.{layer}.self_attn.k_proj.bias");
  json tied = Tiny("qwen3");
  tied["tie_word_embeddings"] = true;
  const json q3 = File(Gen(tied, "hf", "hf"), "model.json");
  EXPECT_EQ(q3["tensors"].back()["name"], "model.norm.weight");  // no lm_head
}

// Megatron linear_qkv: interleaved per query group; when TP exceeds the groups
// the fused buffer as a whole is split over TP and q/k/v replicate TP.
TEST(Init, MegatronQkvInterleavedAndSplitAsAWholeWhenTpExceedsGroups) {
  const std::string qkv = "decoder.layers.{layer.local}.self_attention.linear_qkv.weight";
  Result r = Gen(Tiny("llama"), "megatron:tp=2", "hf");
  const json t2 = File(r, "train.json");
  EXPECT_EQ(*Rule(t2, qkv), json::parse(R"({"name": ")" + qkv + R"(", "parts": ["model.layers.{layer}.self_attn.q_proj.weight",
      "model.layers.{layer}.self_attn.k_proj.weight", "model.layers.{layer}.self_attn.v_proj.weight"],
      "interleave": {"dim": 0, "groups": 2}})"));
  EXPECT_EQ((*Place(t2, "model.layers.{layer}.self_attn.k_proj.weight"))["tp"], json({{"shard", 0}}));
  r = Gen(Tiny("llama"), "megatron:tp=4", "hf");
  const json t4 = File(r, "train.json");
  EXPECT_EQ((*Rule(t4, qkv))["shard"], "tp");
  EXPECT_FALSE(Place(t4, "model.layers.{layer}.self_attn.k_proj.weight")->contains("tp"));
  EXPECT_EQ(r.notes.back(), "--train: TP 4 exceeds 2 query groups: linear_qkv is split evenly by rows of the interleaved matrix");
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("llama"), "megatron:tp=8", "hf"); }),
            "--train 'megatron:tp=8': Megatron-Core needs num_attention_heads (4) divisible by tensor_model_parallel_size (8); "
            "use tp=1, tp=2 or tp=4");
}

// Vocabulary padding: Megatron to a multiple of vocab-divisible x TP with the
// padding on the last ranks (a rank may hold only padding); vLLM to 64.
TEST(Init, VocabPadding) {
  json c = Tiny("llama");
  c["vocab_size"] = 300;
  Result r = Gen(c, "megatron:tp=4", "vllm:tp=4");
  const json t = File(r, "train.json");
  EXPECT_EQ((*Place(t, "model.embed_tokens.weight"))["tp"], json::parse(R"({"shard": 0, "sizes": [128, 128, 44, 0]})"));
  EXPECT_EQ((*Rule(t, "output_layer.weight"))["shape"], json({128, 64}));
  const json i = File(r, "infer.json");
  EXPECT_EQ((*Place(i, "lm_head.weight"))["tp"], json::parse(R"({"shard": 0, "sizes": [80, 80, 80, 60]})"));
  EXPECT_EQ((*Rule(i, "model.embed_tokens.weight"))["shape"], json({80, 64}));
  EXPECT_EQ(r.notes[2], "--train: Megatron pads the vocabulary 300 -> 512 (128 rows per TP rank; the last rank holds 0 real rows)");
  EXPECT_EQ(r.notes[4], "--infer: TP 4 > 2 KV heads: each KV head replicated on 2 ranks");
  EXPECT_EQ(r.notes[5], "--infer: vLLM pads the vocabulary 300 -> 320 (80 rows per TP rank)");
  // Megatron-Bridge's default: no padding, the vocab must divide.
  const json nopad = File(Gen(c, "megatron:tp=4,vocab-divisible=0", "hf"), "train.json");
  EXPECT_EQ((*Place(nopad, "model.embed_tokens.weight"))["tp"], json({{"shard", 0}}));
  c["vocab_size"] = 301;
  EXPECT_EQ(ErrorOf([&] { Gen(c, "megatron:tp=4,vocab-divisible=0", "hf"); }),
            "--train 'megatron:tp=4,vocab-divisible=0': Megatron-Core's VocabParallelEmbedding splits the vocabulary "
            "(301) evenly over TP; without padding (vocab-divisible=0) TP must divide it; use tp=1");
}

// vLLM's qkv_proj: KV heads replicated when TP exceeds them.
TEST(Init, VllmQkvReplicatesKvHeads) {
  const json i = File(Gen(Tiny("llama"), "hf", "vllm:tp=4"), "infer.json");
  EXPECT_EQ((*Place(i, "model.layers.{layer}.self_attn.v_proj.weight"))["tp"], json::parse(R"({"shard": 0, "parts": 2})"));
  EXPECT_EQ((*Rule(i, "model.layers.{layer}.self_attn.qkv_proj.weight"))["concat"], 0);
  EXPECT_EQ(i["default_buffers"], true);
  json c = Tiny("llama");
  c["num_key_value_heads"] = 4;
  c["num_attention_heads"] = 12;
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=6"); }),
            "--infer 'vllm:tp=6': vLLM replicates KV heads when TP exceeds them: tensor_parallel_size (6) must be a "
            "multiple of num_key_value_heads (4); use tp=1, tp=2 or tp=4");
}

// Megatron's two spec flavours and two expert modules.
TEST(Init, MegatronSpecNamesAndDtypes) {
  const json te = File(Gen(Tiny("qwen3_moe"), "megatron:tp=2,ep=2,etp=1,grouped-gemm", "hf"), "train.json");
  EXPECT_NE(Rule(te, "decoder.layers.{layer.local}.self_attention.linear_qkv.layer_norm_weight"), nullptr);
  EXPECT_NE(Rule(te, "decoder.layers.{layer.local}.mlp.experts.linear_fc1.weight{expert.local}"), nullptr);
  EXPECT_EQ(te["meshes"]["expert"], json::parse(R"([["ep", 2]])"));
  EXPECT_EQ(te["meshes"]["dense"], json::parse(R"([["tp", 2]])"));
  // Under Float16Module (Megatron's get_model with --bf16) every parameter is
  // bf16; a bare GPTModel keeps the local spec's norms in fp32.
  const json local = File(Gen(Tiny("qwen3_moe"), "megatron:tp=2,ep=2,spec=local", "hf"), "train.json");
  const json* norm = Rule(local, "decoder.layers.{layer.local}.input_layernorm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_FALSE(norm->contains("dtype"));
  const json bare = File(Gen(Tiny("qwen3_moe"), "megatron:tp=2,ep=2,spec=local,fp32-norms", "hf"), "train.json");
  EXPECT_EQ((*Rule(bare, "decoder.layers.{layer.local}.self_attention.q_layernorm.weight"))["dtype"], "fp32");
  EXPECT_EQ((*Rule(bare, "decoder.final_layernorm.weight"))["dtype"], "fp32");
  EXPECT_FALSE(Rule(bare, "decoder.layers.{layer.local}.mlp.router.weight")->contains("dtype"));
  EXPECT_NE(Rule(local, "decoder.layers.{layer.local}.mlp.experts.local_experts.{expert.local}.linear_fc1.weight"), nullptr);
  // etp defaults to tp as in Megatron: the expert grid is EDP x EP x ETP, ETP fastest.
  EXPECT_EQ(local["meshes"]["expert"], json::parse(R"([["ep", 2], ["etp", 2]])"));
  EXPECT_EQ(local["ranks"], 4);
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("qwen3_moe"), "megatron:tp=2,ep=2,spec=local,grouped-gemm", "hf"); }),
            "--train 'megatron:tp=2,ep=2,spec=local,grouped-gemm': grouped-gemm needs spec=te: Megatron-Core's local "
            "spec has only the legacy GroupedMLP (weight1/weight2), which reshard init does not describe");
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("qwen3_moe"), "megatron:ep=3", "hf"); }),
            "--train 'megatron:ep=3': Megatron-Core needs num_moe_experts (8) divisible by expert_model_parallel_size (3)");
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("qwen3_moe"), "megatron:tp=2,ep=4,dp=1", "hf"); }),
            "--train 'megatron:tp=2,ep=4,dp=1': Megatron-Core needs expert_model_parallel_size x "
            "expert_tensor_parallel_size (4 x 2) to divide tensor x context x data parallel size (2 x 1 x 1)");
}

// MLA: the TE spec replicates the down projections and fuses the norms into
// the up projections; the local spec shards them and keeps separate norms.
TEST(Init, MegatronMla) {
  const json te = File(Gen(Tiny("deepseek_v3"), "megatron:tp=2,pp=2", "hf"), "train.json");
  EXPECT_FALSE(Place(te, "model.layers.{layer}.self_attn.q_a_proj.weight")->contains("tp"));
  EXPECT_NE(Rule(te, "decoder.layers.{layer.local}.self_attention.linear_q_up_proj.layer_norm_weight"), nullptr);
  EXPECT_NE(Rule(te, "decoder.layers.{layer.local}.mlp.router.expert_bias"), nullptr);
  EXPECT_NE(Rule(te, "decoder.layers.{layer.local}.mlp.shared_experts.linear_fc1.weight"), nullptr);
  const json local = File(Gen(Tiny("deepseek_v3"), "megatron:tp=2,spec=local", "hf"), "train.json");
  EXPECT_EQ((*Place(local, "model.layers.{layer}.self_attn.kv_a_proj_with_mqa.weight"))["tp"], json({{"shard", 0}}));
  EXPECT_NE(Rule(local, "decoder.layers.{layer.local}.self_attention.kv_layernorm.weight"), nullptr);
}

// vLLM experts: built-in DP shards each expert over DP x TP; EP spreads whole
// experts over DP x TP ranks; independent engines each hold their own copy.
TEST(Init, VllmExperts) {
  const std::string w13 = "model.layers.{layer}.mlp.experts.routed_experts.w13_weight";
  const std::string gate = "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight";
  const json dp = File(Gen(Tiny("qwen3_moe"), "hf", "vllm:tp=2,dp=2"), "infer.json");
  EXPECT_EQ(*Place(dp, gate), json::parse(R"({"match": ")" + gate + R"(", "mesh": "dense", "dp": {"shard": 0}, "tp": {"shard": 0}})"));
  EXPECT_EQ((*Rule(dp, w13))["parts"][1], "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight");
  const json ep = File(Gen(Tiny("qwen3_moe"), "hf", "vllm:tp=2,dp=3,ep"), "infer.json");
  EXPECT_EQ(ep["meshes"]["expert"], json::parse(R"([["ep", 6]])"));
  EXPECT_EQ((*Place(ep, gate))["ep"], json::parse(R"({"shard": "expert", "sizes": [2, 2, 1, 1, 1, 1]})"));
  const json eng = File(Gen(Tiny("qwen3_moe"), "hf", "vllm:tp=2,engines=3"), "infer.json");
  EXPECT_EQ(eng["meshes"]["dense"], json::parse(R"([["engine", 3], ["tp", 2]])"));
  EXPECT_EQ(eng["name"], "vllm-tp2-x3");
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("qwen3_moe"), "hf", "vllm:tp=4,dp=16"); }),
            "--infer 'vllm:tp=4,dp=16': vLLM shards each expert's intermediate dim over DP x TP (64) when data parallel "
            "runs without expert parallelism; model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight dim 0 is 32");
  const json mix = File(Gen(Tiny("mixtral"), "hf", "vllm:tp=2"), "infer.json");
  EXPECT_NE(Rule(mix, "model.layers.{layer}.block_sparse_moe.experts.routed_experts.w2_weight"), nullptr);
}

// DeepSeek's FP8 checkpoint: vLLM serves it with 128x128 block scales
// (weight_scale_inv) unless quant=none; `hf` stores it as the checkpoint does.
TEST(Init, Fp8Checkpoint) {
  json c = Tiny("deepseek_v3");
  c.update({{"hidden_size", 256}, {"moe_intermediate_size", 256}, {"intermediate_size", 512}, {"q_lora_rank", 256},
            {"kv_lora_rank", 128}, {"qk_rope_head_dim", 128}, {"qk_nope_head_dim", 128}, {"v_head_dim", 128}});
  c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"fmt", "e4m3"}};
  Result r = Gen(c, "megatron:pp=2,ep=2,etp=1", "vllm:tp=2");
  const json i = File(r, "infer.json");
  EXPECT_EQ((*Rule(i, "model.layers.{layer}.self_attn.fused_qkv_a_proj.weight"))["quant"],
            json::parse(R"({"format": "fp8_e4m3", "scale": "block", "block": [128, 128],
                "scale_name": "model.layers.{layer}.self_attn.fused_qkv_a_proj.weight_scale_inv"})"));
  EXPECT_EQ(Rule(i, "model.layers.{layer}.mlp.gate.weight"), nullptr);  // the router stays BF16
  EXPECT_EQ(i["name"], "vllm-tp2-fp8-block");
  CompileAndValidate(r);
  const json none = File(Gen(c, "hf", "vllm:tp=2,quant=none"), "infer.json");
  EXPECT_FALSE((*Rule(none, "model.layers.{layer}.mlp.gate_up_proj.weight")).contains("quant"));
  const json hf = File(Gen(c, "hf", "hf"), "train.json");
  EXPECT_EQ((*Rule(hf, "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"))["quant"]["scale_name"],
            "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight_scale_inv");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=4"); }),
            "--infer 'vllm:tp=4': vLLM refuses block-quantized weights whose per-rank slice is not a whole number of "
            "128-blocks (quantization/fp8.py validate_fp8_block_shape): "
            "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight dim 0 is 256 / 4 = 64; use tp=1 or tp=2, or "
            "quant=none (BF16 weights)");
  // hf stores the checkpoint's format: a smaller TP is the fix.
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf:tp=4", "hf"); }),
            "--train 'hf:tp=4': vLLM refuses block-quantized weights whose per-rank slice is not a whole number of "
            "128-blocks (quantization/fp8.py validate_fp8_block_shape): "
            "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight dim 0 is 256 / 4 = 64; use tp=1 or tp=2");
  // Block FP8 asked of a BF16 checkpoint: quant=none is the fix at this TP.
  json bf16 = c;
  bf16.erase("quantization_config");
  EXPECT_EQ(ErrorOf([&] { Gen(bf16, "hf", "vllm:tp=4,quant=fp8-block"); }),
            "--infer 'vllm:tp=4,quant=fp8-block': vLLM refuses block-quantized weights whose per-rank slice is not a "
            "whole number of 128-blocks (quantization/fp8.py validate_fp8_block_shape): "
            "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight dim 0 is 256 / 4 = 64; use tp=1 or tp=2, or "
            "quant=none (BF16 weights)");
}

TEST(Init, PipelineStages) {
  json c = Tiny("llama");
  c["num_hidden_layers"] = 6;
  const json t = File(Gen(c, "megatron:pp=4,pp-layers=1,2,2,1", "hf"), "train.json");
  EXPECT_EQ((*Place(t, "model.layers.{layer}.mlp.up_proj.weight"))["pp"],
            json::parse(R"({"shard": "layer", "sizes": [1, 2, 2, 1]})"));
  EXPECT_EQ((*Place(t, "lm_head.weight"))["pp"], json({{"at", -1}}));
  const json v = File(Gen(c, "megatron:pp=3,vpp=2", "hf"), "train.json");
  EXPECT_EQ((*Place(v, "model.layers.{layer}.mlp.up_proj.weight"))["pp"], json::parse(R"({"shard": "layer", "cyclic": 1})"));
  EXPECT_EQ(ErrorOf([&] { Gen(c, "megatron:pp=4", "hf"); }),
            "--train 'megatron:pp=4': Megatron-Core splits num_layers (6) evenly over pipeline stages (4); give the "
            "stage sizes with pp-layers=N,N,...");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "megatron:pp=4,pp-layers=1,2,2", "hf"); }),
            "--train 'megatron:pp=4,pp-layers=1,2,2': pp-layers lists 3 stages, pp is 4");
}

// vLLM's pipeline stages (distributed/utils.py get_pp_indices): L / pp layers
// each, the remainder on the stages before the last; ranks (dp, pp, tp).
TEST(Init, VllmPipelineStages) {
  json c = Tiny("llama");
  c["num_hidden_layers"] = 7;
  Result r = Gen(c, "hf", "vllm:tp=2,pp=3,dp=2");
  const json i = File(r, "infer.json");
  EXPECT_EQ(i["meshes"]["dense"], json::parse(R"([["dp", 2], ["pp", 3], ["tp", 2]])"));  // size-1 dims dropped
  EXPECT_EQ((*Place(i, "model.layers.{layer}.mlp.up_proj.weight"))["pp"],
            json::parse(R"({"shard": "layer", "sizes": [2, 3, 2]})"));
  EXPECT_EQ((*Place(i, "model.embed_tokens.weight"))["pp"], json({{"at", 0}}));
  EXPECT_EQ((*Place(i, "lm_head.weight"))["pp"], json({{"at", -1}}));
  EXPECT_EQ(i["name"], "vllm-tp2-pp3-dp2");
  EXPECT_EQ(i["ranks"], 12);
  CompileAndValidate(r);
  json moe = Tiny("qwen3_moe");
  EXPECT_EQ(ErrorOf([&] { Gen(moe, "hf", "vllm:tp=2,pp=2,dp=2,ep"); }),
            "--infer 'vllm:tp=2,pp=2,dp=2,ep': pp with ep is not described by reshard init yet (write the layout by "
            "hand)");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=1,pp=8"); }), "--infer 'vllm:tp=1,pp=8': pp (8) exceeds the model's 7 layers");
}

// Sequence-parallel MoE (EP, TP > 1, DP > 1): vLLM holds the shared experts
// whole on every rank (config/parallel.py use_sequence_parallel_moe); without
// DP or without EP they are split over TP. Seen on real vLLM ranks (tests/vllm).
TEST(Init, VllmSharedExpertsWholeUnderSequenceParallelMoe) {
  const std::string up = "model.layers.{layer}.mlp.shared_experts.up_proj.weight";
  Result sp = Gen(Tiny("deepseek_v3"), "hf", "vllm:tp=2,dp=2,ep");
  EXPECT_FALSE((*Place(File(sp, "infer.json"), up)).contains("tp"));
  EXPECT_NE(std::find(sp.notes.begin(), sp.notes.end(),
                      "--infer: EP with TP 2 and DP 2: vLLM runs the MoE sequence-parallel and holds the shared "
                      "experts whole on every rank"),
            sp.notes.end());
  CompileAndValidate(sp);
  for (const char* infer : {"vllm:tp=2,dp=2", "vllm:tp=2,ep", "vllm:tp=2"})
    EXPECT_EQ((*Place(File(Gen(Tiny("deepseek_v3"), "hf", infer), "infer.json"), up))["tp"], json({{"shard", 0}}))
        << infer;
}

TEST(Init, BadSettingsNameTheOptionAndTheAllowedValues) {
  const json c = Tiny("llama");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "megatron:tp=2,tpp=2", "hf"); }),
            "--train 'megatron:tp=2,tpp=2': unknown option 'tpp' for megatron, expected one of tp, pp, dp, cp, ep, etp, "
            "vpp, pp-layers, grouped-gemm, spec, vocab-divisible, fp32-norms; did you mean 'tp'?");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "trtllm:tp=2"); }),
            "--infer 'trtllm:tp=2': unknown framework 'trtllm', expected megatron:..., vllm:..., sglang:..., "
            "hf[:tp=N] or fsdp2:dp_shard=N,...");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=0"); }), "--infer 'vllm:tp=0': 'tp' expects a positive integer, got '0'");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=2,quant=int4"); }),
            "--infer 'vllm:tp=2,quant=int4': 'quant' expects one of none, fp8-block, fp8-channel, mxfp8, got 'int4'");
  // An FP8 user is shown the FP8 formats, never another kind (issue 59: fp8 -> 'mxfp8').
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=2,quant=fp8"); }),
            "--infer 'vllm:tp=2,quant=fp8': 'quant' expects one of none, fp8-block, fp8-channel, mxfp8, got 'fp8'; "
            "did you mean 'fp8-block' or 'fp8-channel'?");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=2,quant=fp8_channel"); }),
            "--infer 'vllm:tp=2,quant=fp8_channel': 'quant' expects one of none, fp8-block, fp8-channel, mxfp8, got "
            "'fp8_channel'; did you mean 'fp8-channel'?");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=2,quant=mxfp4"); }),
            "--infer 'vllm:tp=2,quant=mxfp4': 'quant' expects one of none, fp8-block, fp8-channel, mxfp8, got 'mxfp4'");
  // Too large, not malformed (1e30 is a whole number).
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=1e30"); }),
            "--infer 'vllm:tp=1e30': 'tp' is too large: expected a positive integer up to 1048576, got '1e30'");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "megatron:pp=99999999999999999999", "hf"); }),
            "--train 'megatron:pp=99999999999999999999': 'pp' is too large: expected a positive integer up to "
            "1048576, got '99999999999999999999'");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=2.5"); }), "--infer 'vllm:tp=2.5': 'tp' expects a positive integer, got '2.5'");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "megatron:spec=apex", "hf"); }), "--train 'megatron:spec=apex': 'spec' expects te or local, got 'apex'");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=2,ep"); }), "--infer 'vllm:tp=2,ep': the model has no experts; leave out ep");
  json odd = c;
  odd["intermediate_size"] = 130;
  EXPECT_EQ(ErrorOf([&] { Gen(odd, "megatron:tp=4", "hf"); }),
            "--train 'megatron:tp=4': Megatron-Core splits model.layers.{layer}.mlp.gate_proj.weight dim 0 (130) evenly "
            "over tensor_model_parallel_size (4); use tp=1 or tp=2");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm"); }),
            "--infer 'vllm': expected vllm:key=value,... (tp, pp, dp, ep, engines, quant)");
}

// The TE spec's DeepSeek-style dense first layers fuse the pre-MLP norm into
// linear_fc1; MoE layers keep pre_mlp_layernorm: two rules narrowed by layer.
// The MTP layer is named as left out.
TEST(Init, TeDenseLayersNameTheirPreMlpNormInLinearFc1) {
  json c = Tiny("deepseek_v3");
  c["num_nextn_predict_layers"] = 1;
  Result r = Gen(c, "megatron:tp=2,pp=2,ep=2", "hf");
  const json t = File(r, "train.json");
  const std::string L = "decoder.layers.{layer.local}.";
  ASSERT_NE(Rule(t, L + "mlp.linear_fc1.layer_norm_weight"), nullptr);
  EXPECT_EQ((*Rule(t, L + "mlp.linear_fc1.layer_norm_weight"))["range"], json::parse(R"({"layer": [0, 1]})"));
  EXPECT_EQ((*Rule(t, L + "pre_mlp_layernorm.weight"))["range"], json::parse(R"({"layer": [1, 4]})"));
  const std::string mtp = "--train: the checkpoint's 1 MTP layer(s) (num_nextn_predict_layers) are not in the layout: "
                          "train without --mtp-num-layers, or refit them separately (vLLM's main model skips them "
                          "when loading)";
  EXPECT_NE(std::find(r.notes.begin(), r.notes.end(), mtp), r.notes.end());
  CompileAndValidate(r);
  // The local spec keeps pre_mlp_layernorm on every layer.
  r = Gen(c, "megatron:tp=2,pp=2,ep=2,spec=local", "hf");
  EXPECT_FALSE(Rule(File(r, "train.json"), L + "pre_mlp_layernorm.weight")->contains("range"));
}

// Tied embeddings at PP > 1: the last stage's output_layer copy is a second
// buffer of the embedding (written too when Megatron is the destination).
TEST(Init, TiedEmbeddingCopyOnTheLastStage) {
  json c = Tiny("llama");
  c["tie_word_embeddings"] = true;
  Result r = Gen(c, "megatron:tp=2,pp=2", "hf");
  const json t = File(r, "train.json");
  EXPECT_EQ((*Place(t, "model.embed_tokens.weight"))["pp"], json::parse(R"({"at": [0, -1]})"));
  EXPECT_EQ((*Rule(t, "embedding.word_embeddings.weight"))["at"], json::parse(R"({"pp": 0})"));
  EXPECT_EQ((*Rule(t, "output_layer.weight"))["at"], json::parse(R"({"pp": -1})"));
  CompileAndValidate(r);
  r = Gen(c, "hf", "megatron:tp=2,pp=2");  // Megatron as the destination: both copies written
  CompileAndValidate(r);
  r = Gen(c, "megatron:tp=2", "hf");  // one stage: the output layer uses the embedding itself
  EXPECT_EQ(Rule(File(r, "train.json"), "output_layer.weight"), nullptr);
}

// Virtual pipeline stages: chunk c of a rank under "model{c}.", its layers from 0.
TEST(Init, VirtualPipelineChunksNamedAsMegatronSavesThem) {
  Result r = Gen(Tiny("llama"), "megatron:pp=2,vpp=2", "hf");
  const json t = File(r, "train.json");
  EXPECT_NE(Rule(t, "model{layer.chunk}.decoder.layers.{layer.in_chunk}.mlp.linear_fc2.weight"), nullptr);
  EXPECT_NE(Rule(t, "model0.embedding.word_embeddings.weight"), nullptr);
  EXPECT_NE(Rule(t, "model1.output_layer.weight"), nullptr);
  EXPECT_NE(Rule(t, "model1.decoder.final_layernorm.weight"), nullptr);
  ModelSpec m = ParseModel(File(r, "model.json"), "model.json");
  Expansion e = Expand(m, ParseLayout(t, "train.json", m));
  std::set<std::string> rank1;  // stage 1: layers 1 and 3, each layer 0 of its chunk
  for (const BufferDesc& b : e.ranks[1].buffers) rank1.insert(b.name);
  EXPECT_TRUE(rank1.count("model0.decoder.layers.0.mlp.linear_fc2.weight"));
  EXPECT_TRUE(rank1.count("model1.decoder.layers.0.mlp.linear_fc2.weight"));
  EXPECT_FALSE(rank1.count("model0.decoder.layers.1.mlp.linear_fc2.weight"));
  EXPECT_TRUE(rank1.count("model1.output_layer.weight"));
  CompileAndValidate(r);
}

// A config without head_dim (or num_key_value_heads) gets what transformers
// 5.20.2's config class builds, and a note says so: Qwen3Config's head_dim is
// 128, not hidden / heads (Qwen3-32B: 5120 / 64 = 80).
TEST(Init, MissingHeadDimFollowsTheConfigClass) {
  json q3 = {{"model_type", "qwen3"}, {"hidden_size", 5120}, {"num_hidden_layers", 2}, {"num_attention_heads", 64},
             {"num_key_value_heads", 8}, {"intermediate_size", 256}, {"vocab_size", 512}};
  Result r = Gen(q3, "hf", "vllm:tp=8");
  const json m = File(r, "model.json");
  EXPECT_EQ(m["tensors"][2]["name"], "model.layers.{layer}.self_attn.q_proj.weight");
  EXPECT_EQ(m["tensors"][2]["shape"], json({64 * 128, 5120}));
  EXPECT_EQ(m["tensors"][2]["heads"], json({{"dim", 0}, {"size", 128}}));
  EXPECT_NE(std::find(r.notes.begin(), r.notes.end(),
                      "config.json: no head_dim; 128 assumed (Qwen3Config, transformers 5.20.2 "
                      "models/qwen3/configuration_qwen3.py)"),
            r.notes.end());
  CompileAndValidate(r);
  // Where the class computes it (or, without such a field, the attention module does): hidden // heads.
  for (const std::string type : {"llama", "qwen2", "qwen3_moe", "mixtral"}) {
    SCOPED_TRACE(type);
    json c = Tiny(type);
    c["hidden_size"] = 96;  // 4 heads: 24 each
    c.erase("head_dim");
    Result t = Gen(c, "hf", "hf");
    EXPECT_EQ(File(t, "model.json")["tensors"][2]["shape"], json({96, 96}));
    EXPECT_NE(std::find(t.notes.begin(), t.notes.end(),
                        std::string("config.json: no head_dim; hidden_size // num_attention_heads = 96 // 4 = 24 "
                                    "assumed (") +
                            (type == "llama" ? "LlamaConfig, transformers 5.20.2 models/llama/configuration_llama.py)"
                             : type == "qwen2"
                                 ? "Qwen2Config, transformers 5.20.2 models/qwen2/configuration_qwen2.py, and "
                                   "Qwen2Attention in modeling_qwen2.py)"
                             : type == "qwen3_moe"
                                 ? "Qwen3MoeConfig, transformers 5.20.2 models/qwen3_moe/configuration_qwen3_moe.py, "
                                   "and Qwen3MoeAttention in modeling_qwen3_moe.py)"
                                 : "MixtralConfig, transformers 5.20.2 models/mixtral/configuration_mixtral.py)")),
              t.notes.end());
  }
  // num_key_value_heads: the class default (Qwen3MoeConfig: 4; LlamaConfig: the heads).
  json moe = Tiny("qwen3_moe");
  moe["num_attention_heads"] = 8;
  moe["hidden_size"] = 128;
  moe.erase("num_key_value_heads");
  EXPECT_EQ(File(Gen(moe, "hf", "hf"), "model.json")["tensors"][3]["shape"], json({4 * 16, 128}));  // k_proj
  json llama = Tiny("llama");
  llama.erase("num_key_value_heads");
  EXPECT_EQ(File(Gen(llama, "hf", "hf"), "model.json")["tensors"][3]["shape"], json({4 * 16, 64}));
  // null where the class would not compute one: an error naming the field.
  q3["head_dim"] = nullptr;
  EXPECT_EQ(ErrorOf([&] { Gen(q3, "hf", "hf"); }), "config.json: /head_dim: expected a positive integer, got null");
}

// Every config field init reads, missing or of the wrong type: the file and the field.
TEST(Init, BadConfigFieldsNameTheFieldAndTheFile) {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& c) { c.erase("num_experts"); }, "/num_experts: missing; a qwen3_moe config.json has it"},
      {[](json& c) { c["hidden_size"] = "64"; }, "/hidden_size: expected a positive integer, got \"64\""},
      {[](json& c) { c["vocab_size"] = 512.0; }, "/vocab_size: expected a positive integer, got 512.0"},
      {[](json& c) { c["hidden_size"] = int64_t{1} << 40; },
       "/hidden_size: expected at most 4294967295, got 1099511627776"},
      // Too large, not fractional, however JSON holds it.
      {[](json& c) { c["hidden_size"] = 1e30; }, "/hidden_size: expected at most 4294967295, got 1e+30"},
      {[](json& c) { c["hidden_size"] = uint64_t{18446744073709551615u}; },
       "/hidden_size: expected at most 4294967295, got 18446744073709551615"},
      {[](json& c) { c["model_type"] = 5; }, "/model_type: expected a string, got 5"},
      {[](json& c) { c["_name_or_path"] = json::array(); }, "/_name_or_path: expected a string, got []"},
      {[](json& c) { c["tie_word_embeddings"] = "yes"; }, "/tie_word_embeddings: expected true or false, got \"yes\""},
      {[](json& c) { c["num_key_value_heads"] = nullptr; },
       "/num_key_value_heads: expected a positive integer, got null"},  // Qwen3MoeConfig: an int, no fallback
      {[](json& c) { c["num_key_value_heads"] = 3; }, "/num_key_value_heads: must divide num_attention_heads (4), got 3"},
      {[](json& c) { c["mlp_only_layers"] = 3; }, "/mlp_only_layers: expected a list of layer indices, got 3"},
      {[](json& c) { c["quantization_config"] = "fp8"; }, "/quantization_config: expected an object, got \"fp8\""},
      {[](json& c) { c["quantization_config"] = {{"quant_method", 5}}; },
       "/quantization_config: only FP8 checkpoints with block scales (quant_method 'fp8', weight_block_size) and "
       "gpt-oss's MXFP4 release (quant_method 'mxfp4') are supported, got {\"quant_method\":5}"},
      {[](json& c) { c["quantization_config"] = {{"quant_method", "mxfp4"}}; },  // gpt-oss's alone
       "/quantization_config: only FP8 checkpoints with block scales (quant_method 'fp8', weight_block_size) and "
       "gpt-oss's MXFP4 release (quant_method 'mxfp4') are supported, got {\"quant_method\":\"mxfp4\"}"},
      {[](json& c) { c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {0, 128}}}; },
       "/quantization_config/weight_block_size: expected [rows, cols] (positive integers), got [0,128]"},
  };
  for (const auto& [breakit, message] : cases) {
    json c = Tiny("qwen3_moe");
    breakit(c);
    SCOPED_TRACE(c.dump());
    EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "hf"); }), "config.json: " + message);
  }
  json ds = Tiny("deepseek_v3");
  ds["topk_method"] = 1;  // was read as "" (no e_score_correction_bias)
  EXPECT_EQ(ErrorOf([&] { Gen(ds, "hf", "hf"); }), "config.json: /topk_method: expected a string, got 1");
}

// vLLM's EP over more ranks than experts (FusedMoEParallelConfig: ep_size =
// dp x tp; determine_expert_map: the first E ranks one expert each): the rest
// hold zero-size w13_weight / w2_weight, and the note says so.
TEST(Init, VllmEpLargerThanTheExpertCount) {
  const std::string gate = "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight";
  Result r = Gen(Tiny("qwen3_moe"), "megatron:tp=2,ep=2,etp=1", "vllm:tp=2,dp=8,ep");
  const json infer = File(r, "infer.json");
  EXPECT_EQ((*Place(infer, gate))["ep"], json::parse(R"({"shard": "expert", "split": "chunk"})"));
  EXPECT_NE(std::find(r.notes.begin(), r.notes.end(),
                      "--infer: 8 experts over EP 16 (dp 8 x tp 2): ranks 0-7 hold one expert each and ranks 8-15 "
                      "none (vLLM's linear expert placement: fused_moe/expert_map_manager.py determine_expert_map): "
                      "vLLM accepts this, and those ranks hold zero-size expert weights and idle in every MoE layer; "
                      "dp x tp of at most 8 gives every rank an expert"),
            r.notes.end());
  ModelSpec m = ParseModel(File(r, "model.json"), "model.json");
  Expansion e = Expand(m, ParseLayout(infer, "infer.json", m));
  auto w13 = [&](int rank) -> std::vector<int64_t> {
    for (const BufferDesc& b : e.ranks[rank].buffers)
      if (b.name == "model.layers.0.mlp.experts.routed_experts.w13_weight") return b.shape;
    return {};
  };
  EXPECT_EQ(w13(7), std::vector<int64_t>({1, 64, 64}));
  EXPECT_EQ(w13(8), std::vector<int64_t>({0, 64, 64}));  // as vLLM holds it: torch.empty(0, 2I, H)
  CompileAndValidate(r);
  // Fewer ranks than experts, not a multiple: the first ranks one more, said as such.
  Result u = Gen(Tiny("qwen3_moe"), "hf", "vllm:tp=2,dp=3,ep");
  EXPECT_NE(std::find(u.notes.begin(), u.notes.end(),
                      "--infer: 8 experts over EP 6: ranks 0-1 hold 2 experts each, ranks 2-5 hold 1 (vLLM's linear "
                      "expert placement: fused_moe/expert_map_manager.py determine_expert_map)"),
            u.notes.end());
}

// dp=N (vLLM's built-in data parallel, one engine) and engines=N (N engines,
// NeMo RL's "TP8 DP16"): the note says which was written and the other option.
TEST(Init, NotesSayBuiltInDataParallelOrIndependentEngines) {
  auto note = [](const Result& r, const std::string& start) {
    for (const auto& n : r.notes)
      if (n.rfind(start, 0) == 0) return n;
    return std::string();
  };
  const json moe = Tiny("qwen3_moe");
  EXPECT_EQ(note(Gen(moe, "hf", "vllm:tp=2,dp=2"), "--infer: dp="),
            "--infer: dp=2 is vLLM's built-in data parallel: one engine of 4 ranks (--data-parallel-size 2), each "
            "expert's intermediate dim split over all its ranks; 2 independent engines of TP 2 (NeMo RL's \"TP2 DP2\") "
            "would be --infer vllm:tp=2,engines=2");
  EXPECT_EQ(note(Gen(moe, "hf", "vllm:tp=2,engines=4"), "--infer: engines="),
            "--infer: engines=4 is 4 independent vLLM engines of TP 2 (NeMo RL's \"TP2 DP4\"), each holding the whole "
            "model; one engine of 8 ranks with vLLM's built-in data parallel (--data-parallel-size 4, each expert's "
            "intermediate dim split over all its ranks) would be --infer vllm:tp=2,dp=4");
  EXPECT_EQ(note(Gen(moe, "hf", "vllm:tp=2,dp=2,ep,engines=2,quant=none"), "--infer: dp="),
            "--infer: dp=2 is vLLM's built-in data parallel: each of the 2 engines is 4 ranks (--data-parallel-size "
            "2), the experts spread over all its ranks (EP 4); 4 independent engines of TP 2 (NeMo RL's \"TP2 DP4\") "
            "would be --infer vllm:tp=2,engines=4,ep,quant=none");
  EXPECT_EQ(note(Gen(Tiny("llama"), "vllm:tp=2,engines=2", "hf"), "--train: engines="),
            "--train: engines=2 is 2 independent vLLM engines of TP 2 (NeMo RL's \"TP2 DP2\"), each holding the whole "
            "model; one engine of 4 ranks with vLLM's built-in data parallel (--data-parallel-size 2) would be --train "
            "vllm:tp=2,dp=2");
  EXPECT_EQ(note(Gen(moe, "hf", "vllm:tp=2"), "--infer: "), "");  // one engine, no DP: nothing to confuse
}

// Llama-3.1-405B in BF16 at vLLM TP8 needs 101 GB per GPU: init warns on an
// 80 GB DGX H100, not on GB200 (186 GB); the specs are written either way.
TEST(Init, WarnsWhereARanksWeightsExceedTheGpuMemory) {
  const json l405 = {{"model_type", "llama"}, {"hidden_size", 16384}, {"intermediate_size", 53248},
                     {"num_attention_heads", 128}, {"num_hidden_layers", 126}, {"num_key_value_heads", 8},
                     {"head_dim", 128}, {"vocab_size", 128256}};
  Request req{l405, "config.json", "megatron:tp=8,pp=9", "vllm:tp=8", "dgx-h100", "llama-405b"};
  Result r = Generate(req);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0],
            "infer.json (vllm-tp8): rank 0 holds 101.47 GB of weights (101470601216 bytes), more than its GPU's 80 GB "
            "(dgx-h100: /gpu_memory_GB); 8 of its 8 ranks do");
  EXPECT_EQ(r.files.size(), 4u);
  req.cluster = "gb200-nvl72";
  EXPECT_TRUE(Generate(req).warnings.empty());
  req.cluster = "";
  EXPECT_TRUE(Generate(req).warnings.empty());  // no cluster: no limit known
}


bool HasNote(const Result& r, const std::string& note) {
  return std::find(r.notes.begin(), r.notes.end(), note) != r.notes.end();
}

// GLM-4.5 (glm4_moe): q/k/v biases, optional q/k norms, first_k_dense_replace
// dense layers, a sigmoid router with its fp32 e_score_correction_bias, shared
// experts; the MTP layer left out. vLLM holds the router in fp32 and keeps the
// shared experts TP-cut under sequence-parallel MoE (Glm4MoeMLP has no
// disable_tp); Megatron: linear_qkv.bias, q/k_layernorm, expert_bias, shared
// experts. Checked on real vLLM and Megatron-Core ranks: tests/data/archs.
TEST(Init, Glm4Moe) {
  const std::string m = "model.layers.{layer}.mlp.";
  Result r = Gen(Tiny("glm4_moe"), "megatron:tp=2,pp=2,ep=2,etp=1", "vllm:tp=2,dp=2,ep");
  const json model = File(r, "model.json");
  std::vector<std::string> names;
  for (const json& t : model["tensors"]) names.push_back(t["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "model.embed_tokens.weight", "model.layers.{layer}.input_layernorm.weight",
                       "model.layers.{layer}.self_attn.q_proj.weight", "model.layers.{layer}.self_attn.k_proj.weight",
                       "model.layers.{layer}.self_attn.v_proj.weight", "model.layers.{layer}.self_attn.q_proj.bias",
                       "model.layers.{layer}.self_attn.k_proj.bias", "model.layers.{layer}.self_attn.v_proj.bias",
                       "model.layers.{layer}.self_attn.o_proj.weight", "model.layers.{layer}.self_attn.q_norm.weight",
                       "model.layers.{layer}.self_attn.k_norm.weight",
                       "model.layers.{layer}.post_attention_layernorm.weight", m + "gate_proj.weight",
                       m + "up_proj.weight", m + "down_proj.weight", m + "gate.weight",
                       m + "gate.e_score_correction_bias", m + "experts.{expert}.gate_proj.weight",
                       m + "experts.{expert}.up_proj.weight", m + "experts.{expert}.down_proj.weight",
                       m + "shared_experts.gate_proj.weight", m + "shared_experts.up_proj.weight",
                       m + "shared_experts.down_proj.weight", "model.norm.weight", "lm_head.weight"}));
  for (const json& t : model["tensors"]) {
    if (t["name"] == m + "gate_proj.weight") {
      EXPECT_EQ(t["range"], json::parse(R"({"layer": [0, 1]})"));
    }
    if (t["name"] == m + "gate.e_score_correction_bias") {
      EXPECT_EQ(t["dtype"], "fp32");
      EXPECT_EQ(t["range"], json::parse(R"({"layer": [1, 4]})"));
    }
    if (t["name"] == m + "shared_experts.gate_proj.weight") {
      EXPECT_EQ(t["shape"], json({32, 64}));
    }
  }
  const json infer = File(r, "infer.json");
  EXPECT_EQ(*Rule(infer, m + "gate.weight"),
            json::parse(R"({"name": ")" + m + R"(gate.weight", "parts": [")" + m + R"(gate.weight"], "dtype": "fp32"})"));
  EXPECT_EQ((*Place(infer, m + "shared_experts.up_proj.weight"))["tp"], json({{"shard", 0}}));  // not whole
  EXPECT_EQ((*Rule(infer, m + "shared_experts.gate_up_proj.weight"))["concat"], 0);
  const json train = File(r, "train.json");
  const std::string L = "decoder.layers.{layer.local}.";
  for (const std::string b : {"self_attention.linear_qkv.bias", "self_attention.q_layernorm.weight",
                              "mlp.router.expert_bias", "mlp.shared_experts.linear_fc1.weight"})
    EXPECT_NE(Rule(train, L + b), nullptr) << b;
  EXPECT_EQ((*Rule(train, L + "mlp.linear_fc1.layer_norm_weight"))["range"], json::parse(R"({"layer": [0, 1]})"));
  EXPECT_TRUE(HasNote(r, "--train: the checkpoint's 1 MTP layer(s) (num_nextn_predict_layers) are not in the layout: "
                         "train without --mtp-num-layers, or refit them separately (vLLM's main model skips them "
                         "when loading)"));
  CompileAndValidate(r);
  CompileAndValidate(Gen(Tiny("glm4_moe"), "fsdp2:dp_shard=2,tp=2", "vllm:tp=2"));
  // GLM-4.5-Air: no q/k norms; Glm4MoeConfig's defaults where the config is silent.
  json air = Tiny("glm4_moe");
  air.erase("use_qk_norm");
  air.erase("first_k_dense_replace");
  air.erase("n_shared_experts");
  air.erase("head_dim");
  air["hidden_size"] = 96;
  Result a = Gen(air, "hf", "hf");
  const json air_model = File(a, "model.json");  // a named copy: a loop over a temporary's member would dangle
  for (const json& t : air_model["tensors"]) EXPECT_EQ(t["name"].get<std::string>().find("_norm"), std::string::npos);
  const std::string cls = " assumed (Glm4MoeConfig, transformers 5.20.2 models/glm4_moe/configuration_glm4_moe.py)";
  EXPECT_TRUE(HasNote(a, "config.json: no first_k_dense_replace; 1" + cls));
  EXPECT_TRUE(HasNote(a, "config.json: no n_shared_experts; 1" + cls));
  EXPECT_TRUE(HasNote(a, "config.json: no head_dim; hidden_size // num_attention_heads = 96 // 4 = 24 assumed "
                         "(Glm4MoeConfig, transformers 5.20.2 models/glm4_moe/configuration_glm4_moe.py, and "
                         "Glm4MoeAttention in modeling_glm4_moe.py)"));
  air["first_k_dense_replace"] = 4;
  EXPECT_EQ(ErrorOf([&] { Gen(air, "hf", "hf"); }),
            "config.json: /first_k_dense_replace: must be below num_hidden_layers");
}

// gpt-oss: q/k/v/o biases, per-head sinks, a router with a bias, experts with
// biases; the experts per expert as [out, in] (the checkpoint's transposed,
// fused gate_up_proj cannot be a layout). vLLM: attn.*, embedding, w13 with
// gate and up rows alternating (interleave, groups of one row), w2_bias real
// only on the MoE's flattened rank 0; Megatron: softmax_offset, the biases.
TEST(Init, GptOss) {
  const std::string e = "model.layers.{layer}.mlp.experts.{expert}.";
  const std::string v = "model.layers.{layer}.mlp.experts.routed_experts.";
  Result r = Gen(Tiny("gpt_oss"), "megatron:tp=2,pp=2,ep=2,etp=1", "vllm:tp=2,dp=2");
  const json model = File(r, "model.json");
  EXPECT_NE(model["notes"].get<std::string>().find("gate_up_proj [E, H, 2I]"), std::string::npos);
  for (const json& t : model["tensors"]) {
    if (t["name"] == "model.layers.{layer}.self_attn.sinks") {
      EXPECT_EQ(t["shape"], json({4}));
      EXPECT_EQ(t["heads"], json({{"dim", 0}, {"size", 1}}));
    }
    if (t["name"] == e + "down_proj.bias") {
      EXPECT_EQ(t["shape"], json({64}));
    }
  }
  const json infer = File(r, "infer.json");
  EXPECT_NE(Rule(infer, "model.embedding.weight"), nullptr);
  EXPECT_NE(Rule(infer, "model.layers.{layer}.attn.qkv_proj.bias"), nullptr);
  EXPECT_NE(Rule(infer, "model.layers.{layer}.attn.sinks"), nullptr);
  EXPECT_EQ((*Place(infer, "model.layers.{layer}.self_attn.sinks"))["tp"], json({{"shard", 0}}));
  EXPECT_FALSE(Place(infer, "model.layers.{layer}.self_attn.o_proj.bias")->contains("tp"));
  EXPECT_EQ(*Rule(infer, v + "w13_weight"),
            json::parse(R"({"name": ")" + v + R"(w13_weight", "parts": [")" + e + R"(gate_proj.weight", ")" + e +
                        R"(up_proj.weight"], "interleave": {"dim": 0, "groups": 32}})"));
  EXPECT_EQ((*Rule(infer, v + "w13_bias"))["interleave"], json::parse(R"({"dim": 0, "groups": 32})"));
  EXPECT_EQ(infer["meshes"]["moe"], json::parse(R"([["moe_tp", 4]])"));
  EXPECT_EQ(*Place(infer, e + "down_proj.bias"),
            json::parse(R"({"match": ")" + e + R"(down_proj.bias", "mesh": "moe", "moe_tp": {"shard": 0, "sizes": [64, 0, 0, 0]}})"));
  EXPECT_EQ((*Rule(infer, v + "w2_bias"))["shape"], json({64}));
  ModelSpec ms = ParseModel(model, "model.json");
  Expansion x = Expand(ms, ParseLayout(infer, "infer.json", ms));
  for (int rank = 0; rank < 4; ++rank)  // every rank binds w2_bias [E, H] (zeros but on rank 0), as vLLM holds it
    EXPECT_EQ(std::count_if(x.ranks[rank].buffers.begin(), x.ranks[rank].buffers.end(),
                            [](const BufferDesc& b) {
                              return b.name == "model.layers.0.mlp.experts.routed_experts.w2_bias" &&
                                     b.shape == std::vector<int64_t>({8, 64});
                            }),
              1)
        << rank;
  const json train = File(r, "train.json");
  const std::string L = "decoder.layers.{layer.local}.";
  for (const std::string b : {"self_attention.core_attention.softmax_offset", "self_attention.linear_proj.bias",
                              "self_attention.linear_qkv.bias", "mlp.router.bias",
                              "mlp.experts.local_experts.{expert.local}.linear_fc1.bias",
                              "mlp.experts.local_experts.{expert.local}.linear_fc2.bias"})
    EXPECT_NE(Rule(train, L + b), nullptr) << b;
  EXPECT_EQ((*Rule(train, L + "mlp.experts.local_experts.{expert.local}.linear_fc1.weight"))["concat"], 0);
  EXPECT_FALSE(Place(train, e + "down_proj.bias")->contains("etp"));
  CompileAndValidate(r);
  // With EP: the biases go with their experts; pp on vLLM: w2_bias on dp 0's first TP rank.
  CompileAndValidate(Gen(Tiny("gpt_oss"), "megatron:pp=2,ep=4,etp=1,grouped-gemm", "vllm:tp=2,dp=2,ep"));
  const json pp = File(Gen(Tiny("gpt_oss"), "hf", "vllm:tp=2,pp=2,dp=2"), "infer.json");
  EXPECT_EQ((*Place(pp, e + "down_proj.bias"))["tp"], json::parse(R"({"shard": 0, "sizes": [64, 0]})"));
  EXPECT_EQ((*Place(pp, e + "down_proj.bias"))["dp"], json::parse(R"({"at": 0})"));
  // hf: the checkpoint's fused expert biases; the note says what the layout cannot hold.
  Result h = Gen(Tiny("gpt_oss"), "hf:tp=2", "hf");
  const json hf = File(h, "train.json");
  EXPECT_EQ(*Rule(hf, "model.layers.{layer}.mlp.experts.gate_up_proj_bias"),
            json::parse(R"({"name": "model.layers.{layer}.mlp.experts.gate_up_proj_bias", "parts": [")" + e +
                        R"(gate_proj.bias", ")" + e + R"(up_proj.bias"], "interleave": {"dim": 0, "groups": 32}})"));
  EXPECT_NE(Rule(hf, "model.layers.{layer}.mlp.experts.down_proj_bias"), nullptr);
  EXPECT_TRUE(HasNote(h, "--train: the experts' weights are written per expert as [out, in] (" + e +
                             "gate_proj.weight, ...): the gpt_oss checkpoint holds them transposed and fused "
                             "(model.layers.{layer}.mlp.experts.gate_up_proj [8, 64, 2 x 32] with gate and up in alternate columns, "
                             "down_proj [8, 32, 64]), which a layout cannot express (no transposes); the experts' "
                             "biases are the checkpoint's gate_up_proj_bias and down_proj_bias"));
  CompileAndValidate(h);
}

// What gpt-oss's frameworks refuse, each naming its rule: vLLM serving the
// release's MXFP4 experts (kernel layouts reshard cannot write), vLLM TP above
// the KV heads (OAIAttention divides them), uneven EP (its loader slices
// E // ep_size), Megatron's expert biases under expert-TP, FSDP2's
// transposed experts.
TEST(Init, GptOssRefusals) {
  json release = Tiny("gpt_oss");
  release["quantization_config"] = {{"quant_method", "mxfp4"},
                                    {"modules_to_not_convert", {"model.layers.*.self_attn", "lm_head"}}};
  EXPECT_EQ(ErrorOf([&] { Gen(release, "hf", "vllm:tp=2"); }),
            "--infer 'vllm:tp=2': the config's quantization_config (quant_method mxfp4) makes vLLM serve gpt-oss's "
            "experts in MXFP4, held after loading in a kernel-specific layout (layers/fused_moe/oracle/mxfp4.py "
            "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format: Marlin repacking, FlashInfer shuffles, "
            "triton_kernels swizzling, sizes rounded up), which reshard cannot write: a BF16 refit needs MXFP4 "
            "quantization and that layout. Serve a BF16 checkpoint (no quantization_config) and add quant=none to "
            "refit into it");
  Result bf16 = Gen(release, "megatron:tp=2,ep=2,etp=1", "vllm:tp=2,quant=none");
  EXPECT_EQ(File(bf16, "infer.json")["name"], "vllm-tp2");
  EXPECT_TRUE(HasNote(bf16, "--infer: quant=none: engines serving gpt-oss in BF16, started from a BF16 checkpoint (the "
                            "release's experts dequantized), not from the MXFP4 release the config describes"));
  CompileAndValidate(bf16);
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("gpt_oss"), "hf", "vllm:tp=2,quant=fp8-block"); }),
            "--infer 'vllm:tp=2,quant=fp8-block': reshard init describes gpt-oss engines in BF16 only (quant=none); "
            "quant=fp8-block would quantize the experts, which vLLM's gpt-oss loader (models/gpt_oss.py) takes only "
            "from an MXFP4 or quark checkpoint");
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("gpt_oss"), "hf", "vllm:tp=4"); }),
            "--infer 'vllm:tp=4': vLLM's OAIAttention (models/gpt_oss.py) divides the 2 KV heads by "
            "tensor_parallel_size (num_key_value_heads // tp_size) instead of replicating them: tp must be at most 2");
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("gpt_oss"), "hf", "vllm:tp=1,dp=3,ep"); }),
            "--infer 'vllm:tp=1,dp=3,ep': vLLM's gpt-oss MLPBlock asserts intermediate_size (32) % world_size "
            "(dp x pp x tp = 3) == 0 (models/gpt_oss.py)");
  json wide = Tiny("gpt_oss");
  wide["intermediate_size"] = 48;
  EXPECT_EQ(ErrorOf([&] { Gen(wide, "hf", "vllm:tp=1,dp=3,ep"); }),
            "--infer 'vllm:tp=1,dp=3,ep': vLLM's gpt-oss loader gives EP rank r experts r x (E // ep_size) onward "
            "(models/gpt_oss.py GptOssModel.load_weights): num_local_experts (8) must divide by dp x tp (3)");
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("gpt_oss"), "megatron:tp=2,ep=2", "hf"); }),
            "--train 'megatron:tp=2,ep=2': Megatron-Core supports the experts' biases (add_bias_linear, gpt_oss) only "
            "with expert_tensor_parallel_size 1 (transformer_config.py: \"Bias in Moe is only supported when "
            "ETP==1\"); etp is 2 (Megatron's default: tp), add etp=1");
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("gpt_oss"), "fsdp2:dp_shard=2", "hf"); }),
            "--train 'fsdp2:dp_shard=2': transformers 5's gpt_oss experts (GptOssExperts, "
            "models/gpt_oss/modeling_gpt_oss.py) are model.layers.{layer}.mlp.experts.gate_up_proj [8, 64, 64] and down_proj [8, 32, 64], "
            "[in, out] per expert: the transpose of the [out, in] experts vLLM and Megatron hold, and a layout cannot "
            "transpose; reshard init does not describe FSDP2 for gpt_oss");
  json nobias = Tiny("gpt_oss");
  nobias["attention_bias"] = false;
  EXPECT_EQ(ErrorOf([&] { Gen(nobias, "hf", "hf"); }),
            "config.json: /attention_bias: vLLM's OAIAttention (models/gpt_oss.py) always builds q/k/v/o biases; "
            "expected true");
}

}  // namespace
json RuleOrNull(const json& layout, const std::string& buffer) {
  const json* r = Rule(layout, buffer);
  return r ? *r : json();
}

TEST(Init, Qwen3NextLayersAndFusedParts) {
  const Result r = Gen(Tiny("qwen3_next"), "hf", "vllm:tp=2");
  const json m = File(r, "model.json");
  std::map<std::string, json> range;
  for (const json& t : m["tensors"]) range[t["name"]] = t.value("range", json());
  const json linear = json::array({json::array({0, 1}), json::array({2, 3})});
  const json full = json::array({json::array({1, 2}), json::array({3, 4})});
  EXPECT_EQ(range.at("model.layers.{layer}.linear_attn.in_proj_qkvz.q.weight"), json({{"layer", linear}}));
  EXPECT_EQ(range.at("model.layers.{layer}.linear_attn.A_log"), json({{"layer", linear}}));
  EXPECT_EQ(range.at("model.layers.{layer}.self_attn.q_proj.gate.weight"), json({{"layer", full}}));
  EXPECT_TRUE(range.at("model.layers.{layer}.input_layernorm.weight").is_null());
  // out_proj [H, value heads x d]: its heads are columns (dim 1), as o_proj's.
  int out_proj = 0;
  for (const json& t : m["tensors"]) {
    if (t["name"] != "model.layers.{layer}.linear_attn.out_proj.weight") continue;
    ++out_proj;
    EXPECT_EQ(t["heads"], json({{"dim", 1}, {"size", 16}}));
  }
  EXPECT_EQ(out_proj, 1);
  json odd = Tiny("qwen3_next");
  odd["hidden_size"] = 60;  // not a multiple of the value head dim: fine
  CompileAndValidate(Gen(odd, "fsdp2:dp_shard=4", "vllm:tp=2"));
  // hf: the checkpoint's fused tensors; vLLM: qkv_proj heads [query; gate], then k, v; A_log in fp32.
  const json h = File(r, "train.json");
  EXPECT_EQ(RuleOrNull(h, "model.layers.{layer}.linear_attn.in_proj_qkvz.weight")["interleave"],
            json({{"dim", 0}, {"groups", 2}}));
  EXPECT_EQ(RuleOrNull(h, "model.layers.{layer}.linear_attn.conv1d.weight")["parts"].size(), 3u);
  EXPECT_EQ(RuleOrNull(h, "model.layers.{layer}.self_attn.q_proj.weight")["interleave"], json({{"dim", 0}, {"groups", 4}}));
  const json v = File(r, "infer.json");
  EXPECT_EQ(RuleOrNull(v, "model.layers.{layer}.self_attn.qkv_proj.weight")["interleave"],
            json::parse(R"({"dim": 0, "blocks": [{"parts": 2, "groups": 4}, {"parts": 1}, {"parts": 1}]})"));
  EXPECT_EQ(RuleOrNull(v, "model.layers.{layer}.linear_attn.A_log")["dtype"], "fp32");
  CompileAndValidate(r);
}

// Megatron for Qwen3-Next: GatedDeltaNet's in_proj [q; k; v; z; b; a] and
// conv1d [q; k; v] per rank, gated attention's linear_qkv per query group
// [queries; gates; k; v], and the zero-centered norms: under TE (what
// Megatron-Bridge runs, layernorm_zero_centered_gamma) out_norm holds w - 1;
// under the local spec (torch RMSNorm, x * gamma) the zero-centered norms
// hold 1 + w and out_norm w. The TE spec fuses the input norm into in_proj
// or linear_qkv by layer type.
TEST(Init, Qwen3NextMegatron) {
  const json c = Tiny("qwen3_next");
  const Result te = Gen(c, "megatron:tp=2,pp=2,ep=2,etp=1", "vllm:tp=2");
  const json t = File(te, "train.json");
  const std::string L = "decoder.layers.{layer.local}.";
  EXPECT_EQ(RuleOrNull(t, L + "self_attention.out_norm.weight")["transform"], json({{"offset", -1.0}}));
  for (const char* n : {"self_attention.in_proj.layer_norm_weight", "self_attention.linear_qkv.layer_norm_weight",
                        "self_attention.q_layernorm.weight", "pre_mlp_layernorm.weight"})
    EXPECT_TRUE(RuleOrNull(t, L + n).is_object() && !RuleOrNull(t, L + n).contains("transform")) << n;
  EXPECT_EQ(RuleOrNull(t, L + "self_attention.in_proj.layer_norm_weight")["range"],
            json({{"layer", json::array({json::array({0, 1}), json::array({2, 3})})}}));
  EXPECT_EQ(RuleOrNull(t, L + "self_attention.in_proj.weight")["parts"].size(), 6u);
  EXPECT_EQ(RuleOrNull(t, L + "self_attention.in_proj.weight")["concat"], 0);
  EXPECT_EQ(RuleOrNull(t, L + "self_attention.linear_qkv.weight")["parts"],
            json({"model.layers.{layer}.self_attn.q_proj.query.weight", "model.layers.{layer}.self_attn.q_proj.gate.weight",
                  "model.layers.{layer}.self_attn.k_proj.weight", "model.layers.{layer}.self_attn.v_proj.weight"}));
  CompileAndValidate(te);
  const Result local = Gen(c, "megatron:tp=2,pp=2,ep=2,etp=1,spec=local", "vllm:tp=2");
  const json l = File(local, "train.json");
  EXPECT_EQ(RuleOrNull(l, L + "input_layernorm.weight")["transform"], json({{"offset", 1.0}}));
  EXPECT_EQ(RuleOrNull(l, "decoder.final_layernorm.weight")["transform"], json({{"offset", 1.0}}));
  EXPECT_FALSE(RuleOrNull(l, L + "self_attention.out_norm.weight").contains("transform"));
  CompileAndValidate(local);
}

TEST(Init, Qwen3NextRefusals) {
  const json c = Tiny("qwen3_next");
  CompileAndValidate(Gen(c, "fsdp2:dp_shard=2", "vllm:tp=2"));
  CompileAndValidate(Gen(c, "hf:tp=2", "vllm:tp=2"));
  EXPECT_EQ(ErrorOf([&] { Gen(c, "fsdp2:dp_shard=2,tp=2", "hf"); }),
            "--train 'fsdp2:dp_shard=2,tp=2': NeMo RL's TP plan has no rule for Qwen3-Next's linear attention "
            "(in_proj_qkvz, conv1d, ...) nor its gated q_proj; use tp=1");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "vllm:tp=4"); }),
            "--infer 'vllm:tp=4': vLLM's Qwen3-Next linear attention keeps whole key heads on a rank "
            "(layers/mamba/gdn/qwen_gdn_linear_attn.py: num_k_heads / tp_size): linear_num_key_heads (2) must "
            "divide by tp (4); use tp=1 or tp=2");
  json bad = c;
  bad["layer_types"] = json::array({"linear_attention", "full_attention"});
  EXPECT_EQ(ErrorOf([&] { Gen(bad, "hf", "hf"); }),
            "config.json: /layer_types: expected a list of 4 layer types, got [\"linear_attention\",\"full_attention\"]");
  bad["layer_types"] = json::array({"linear_attention", "full_attention", "sliding_attention", "full_attention"});
  EXPECT_EQ(ErrorOf([&] { Gen(bad, "hf", "hf"); }),
            "config.json: /layer_types/2: expected \"linear_attention\" or \"full_attention\", got \"sliding_attention\"");
  bad = c;
  bad["linear_num_value_heads"] = 3;
  EXPECT_EQ(ErrorOf([&] { Gen(bad, "hf", "hf"); }),
            "config.json: /linear_num_value_heads: must be a multiple of linear_num_key_heads (2), got 3");
}

TEST(Init, Llama4) {
  const json c = Tiny("llama4");
  const Result r = Gen(c, "megatron:tp=2,pp=2,ep=2,etp=1", "hf");
  const json m = File(r, "model.json");
  std::map<std::string, json> range;
  for (const json& t : m["tensors"]) range[t["name"]] = t.value("range", json());
  const std::string p = "language_model.model.layers.{layer}.feed_forward.";
  EXPECT_EQ(range.at(p + "gate_proj.weight"), json({{"layer", json::array({json::array({0, 1}), json::array({2, 3})})}}));
  EXPECT_EQ(range.at(p + "experts.{expert}.gate_proj.weight"),
            json({{"layer", json::array({json::array({1, 2}), json::array({3, 4})})}}));
  EXPECT_EQ(range.count("language_model.lm_head.weight"), 1u);
  CompileAndValidate(r);
  // moe_layers overrides the step (Llama4TextConfig.__post_init__).
  json listed = c;
  listed["text_config"]["moe_layers"] = json::array({0, 1, 2, 3});
  const json all = File(Gen(listed, "hf", "hf"), "model.json");
  int routers = 0;
  for (const json& t : all["tensors"]) {
    if (t["name"] != p + "router.weight") continue;
    ++routers;
    EXPECT_FALSE(t.contains("range"));
  }
  EXPECT_EQ(routers, 1);
  // q_proj / k_proj: each head's even and odd rows; hf alternates them, vLLM
  // puts each head's even rows first, Megatron alternates them per query group.
  const json v = File(Gen(c, "megatron:tp=2,pp=2,ep=2,etp=1", "vllm:tp=2"), "infer.json");
  EXPECT_EQ(RuleOrNull(v, "language_model.model.layers.{layer}.self_attn.qkv_proj.weight")["interleave"],
            json::parse(R"({"dim": 0, "blocks": [{"parts": 2, "groups": 4}, {"parts": 2, "groups": 2}, {"parts": 1}]})"));
  const json t = File(Gen(c, "megatron:tp=2,pp=2,ep=2,etp=1", "vllm:tp=2"), "train.json");
  EXPECT_EQ(RuleOrNull(t, "decoder.layers.{layer.local}.self_attention.linear_qkv.weight")["interleave"],
            json::parse(R"({"dim": 0, "groups": 2, "blocks": [{"parts": 2, "groups": 16}, {"parts": 2, "groups": 8},
                            {"parts": 1}]})"));
  const json h = File(Gen(c, "hf", "hf"), "train.json");
  EXPECT_EQ(RuleOrNull(h, "language_model.model.layers.{layer}.self_attn.q_proj.weight")["interleave"],
            json({{"dim", 0}, {"groups", 32}}));
  json bad = c;
  bad.erase("text_config");
  EXPECT_EQ(ErrorOf([&] { Gen(bad, "hf", "hf"); }),
            "config.json: /text_config: missing; a llama4 config.json holds the language model's fields there");
  bad = c;
  bad["text_config"].erase("intermediate_size_mlp");
  EXPECT_EQ(ErrorOf([&] { Gen(bad, "hf", "hf"); }),
            "config.json: /text_config/intermediate_size_mlp: missing; a llama4_text config.json has it");
}

}  // namespace reshard::init
