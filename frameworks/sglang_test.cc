// reshard init --infer sglang:...: the layouts SGLang 0.5.23 ranks hold (names,
// attention DP and EP inside the TP group, shared experts, vocabulary
// padding), compiled and validated from Megatron and HF sides, and the
// refusals that name SGLang's rule. What real SGLang ranks hold is checked in
// tests/recorded_dumps_test.cc against tests/data/recorded/sglang-*.
#include <gtest/gtest.h>

#include <algorithm>

#include "compiler/init.h"
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

void CompileAndValidate(const Result& r) {
  auto bytes = testing::CompileJson(File(r, "model.json"), File(r, "train.json"), File(r, "infer.json"),
                                    testing::TinyCluster());
  const ValidateReport report = testing::ValidateBytes(std::move(bytes));
  EXPECT_TRUE(report.ok()) << (report.errors.empty() ? "" : report.errors.front());
}

bool HasNote(const Result& r, const std::string& text) {
  return std::find(r.notes.begin(), r.notes.end(), text) != r.notes.end();
}

// Every SGLang setting init describes compiles from Megatron and from HF
// ranks into a plan where every destination element is written once.
TEST(InitSglang, LayoutsCompileAndValidate) {
  for (const std::string type : {"llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "kimi_k2"}) {
    SCOPED_TRACE(type);
    const json c = Tiny(type);
    const bool moe = fixtures::Moe(type);
    const bool attn_dp = moe;  // the models whose attention runs over the attention-TP group
    CompileAndValidate(Gen(c, "megatron:tp=2,pp=2" + std::string(moe ? ",ep=2,etp=1" : ""), "sglang:tp=2"));
    CompileAndValidate(Gen(c, "hf:tp=2", "sglang:tp=4,engines=2"));
    if (moe) CompileAndValidate(Gen(c, "hf", "sglang:tp=4,ep=2"));
    if (attn_dp) CompileAndValidate(Gen(c, "hf:tp=2", "sglang:tp=4,ep=4,attn-dp=2"));
    if (attn_dp) CompileAndValidate(Gen(c, "hf", "sglang:tp=2,attn-dp=2,dp-lm-head"));
  }
  // sglang as the training side too (an SGLang rank's memory as a source).
  CompileAndValidate(Gen(Tiny("qwen3_moe"), "sglang:tp=4,ep=2,attn-dp=2", "hf:tp=2"));
}

// SGLang's names: vLLM's fused qkv_proj / gate_up_proj, FusedMoE's
// w13_weight / w2_weight straight under `experts`, MLA's
// fused_qkv_a_proj_with_mqa.
TEST(InitSglang, Names) {
  const json moe = File(Gen(Tiny("qwen3_moe"), "hf", "sglang:tp=2"), "infer.json");
  EXPECT_EQ(moe["name"], "sglang-tp2");
  EXPECT_EQ((*Rule(moe, "model.layers.{layer}.self_attn.qkv_proj.weight"))["concat"], 0);
  const json* w13 = Rule(moe, "model.layers.{layer}.mlp.experts.w13_weight");
  ASSERT_NE(w13, nullptr);
  EXPECT_EQ((*w13)["parts"], json({"model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight",
                                   "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight"}));
  EXPECT_NE(Rule(moe, "model.layers.{layer}.mlp.experts.w2_weight"), nullptr);
  const json mla = File(Gen(Tiny("deepseek_v3"), "hf", "sglang:tp=2"), "infer.json");
  const json* a = Rule(mla, "model.layers.{layer}.self_attn.fused_qkv_a_proj_with_mqa.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ((*a)["parts"], json({"model.layers.{layer}.self_attn.q_a_proj.weight",
                                 "model.layers.{layer}.self_attn.kv_a_proj_with_mqa.weight"}));
  EXPECT_NE(Rule(mla, "model.layers.{layer}.mlp.shared_experts.gate_up_proj.weight"), nullptr);
}

// Attention DP and EP live inside the TP group: attention (and the input
// embedding) over the attention-TP ranks, lm_head and the dense and shared
// MLPs over the whole TP group, experts over EP x MoE TP.
TEST(InitSglang, AttentionDpAndExpertParallelInsideTp) {
  const Result r = Gen(Tiny("deepseek_v3"), "hf", "sglang:tp=4,ep=2,attn-dp=2");
  const json i = File(r, "infer.json");
  EXPECT_EQ(i["ranks"], 4);
  EXPECT_EQ(i["meshes"], json::parse(R"({"tp": [["tp", 4]], "attn": [["attn_dp", 2], ["attn_tp", 2]],
                                         "expert": [["ep", 2], ["moe_tp", 2]]})"));
  const json q = *Place(i, "model.layers.{layer}.self_attn.q_b_proj.weight");
  EXPECT_EQ(q["mesh"], "attn");
  EXPECT_EQ(q["attn_tp"], json({{"shard", 0}}));
  EXPECT_FALSE(q.contains("attn_dp"));
  EXPECT_EQ((*Place(i, "model.embed_tokens.weight"))["mesh"], "attn");
  EXPECT_EQ((*Place(i, "lm_head.weight"))["mesh"], "tp");
  EXPECT_EQ((*Place(i, "model.layers.{layer}.mlp.shared_experts.gate_proj.weight"))["tp"], json({{"shard", 0}}));
  EXPECT_EQ((*Place(i, "model.layers.{layer}.mlp.down_proj.weight"))["tp"], json({{"shard", 1}}));
  const json e = *Place(i, "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight");
  EXPECT_EQ(e["mesh"], "expert");
  EXPECT_EQ(e["ep"], json({{"shard", "expert"}}));
  EXPECT_EQ(e["moe_tp"], json({{"shard", 1}}));
  EXPECT_TRUE(HasNote(r, "--infer: the shared experts cut over the whole TP group (4 ranks), not the attention-TP "
                        "group; under a DeepEP-class all-to-all backend SGLang holds them whole: "
                        "shared-experts=replicated"));
  // dp-lm-head: lm_head over the attention-TP group too.
  const json h = File(Gen(Tiny("deepseek_v3"), "hf", "sglang:tp=4,attn-dp=2,dp-lm-head"), "infer.json");
  EXPECT_EQ((*Place(h, "lm_head.weight"))["mesh"], "attn");
}

TEST(InitSglang, SharedExpertsAndDenseTp) {
  const std::string gate = "model.layers.{layer}.mlp.shared_experts.gate_proj.weight";
  const json rep = File(Gen(Tiny("deepseek_v3"), "hf", "sglang:tp=2,shared-experts=replicated"), "infer.json");
  EXPECT_FALSE((*Place(rep, gate)).contains("tp"));
  const json dense = File(Gen(Tiny("deepseek_v3"), "hf", "sglang:tp=2,dense-tp=1"), "infer.json");
  EXPECT_FALSE((*Place(dense, "model.layers.{layer}.mlp.gate_proj.weight")).contains("tp"));
  EXPECT_EQ((*Place(dense, gate))["tp"], json({{"shard", 0}}));
  // SGLang's default for DeepSeek-V3-sized MoE (256 routed experts, one shared) at EP 1 is fusion.
  json v3 = Tiny("deepseek_v3");
  v3["n_routed_experts"] = 256;
  EXPECT_EQ(ErrorOf([&] { Gen(v3, "hf", "sglang:tp=2"); }),
            "--infer 'sglang:tp=2': SGLang holds a fused shared expert in slot 256 of every rank's w13_weight / "
            "w2_weight (layers/moe/fused_moe_triton/layer.py FusedMoE), a place reshard's layouts cannot name yet; "
            "start SGLang with --disable-shared-experts-fusion and write shared-experts=tp");
  const Result tp = Gen(v3, "hf", "sglang:tp=2,shared-experts=tp");
  EXPECT_EQ((*Place(File(tp, "infer.json"), gate))["tp"], json({{"shard", 0}}));
  EXPECT_FALSE(HasNote(tp, "--infer: SGLang fuses"));
  CompileAndValidate(Gen(v3, "hf", "sglang:tp=2,ep=2"));  // EP: no fusion by default
}

// The vocabulary padded to 64, or to 64 x the group size when 64's padding
// does not divide (VocabParallelEmbedding).
TEST(InitSglang, VocabPadding) {
  json c = Tiny("llama");
  c["num_attention_heads"] = 6;
  c["num_key_value_heads"] = 6;
  c["intermediate_size"] = 96;
  const Result r = Gen(c, "hf", "sglang:tp=3");
  const json i = File(r, "infer.json");
  EXPECT_EQ((*Rule(i, "model.embed_tokens.weight"))["shape"], json({192, 64}));
  EXPECT_TRUE(HasNote(r, "--infer: SGLang pads the vocabulary of embed_tokens 512 -> 576 (192 rows per rank of 3)"));
  CompileAndValidate(r);
}

TEST(InitSglang, RefusedWithSglangsReason) {
  const json moe = Tiny("qwen3_moe");  // 8 experts, 4 heads, 2 KV heads
  EXPECT_EQ(ErrorOf([&] { Gen(moe, "hf", "sglang:tp=6,ep=3"); }),
            "--infer 'sglang:tp=6,ep=3': SGLang's FusedMoE asserts num_experts % ep_size == 0 "
            "(layers/moe/fused_moe_triton/layer.py FusedMoE: _num_global_routed % storage_ep_size == 0): 8 experts "
            "over ep 3");
  EXPECT_EQ(ErrorOf([&] { Gen(moe, "hf", "sglang:tp=2,ep=4"); }),
            "--infer 'sglang:tp=2,ep=4': SGLang runs expert parallelism inside the TP group (runtime_context.py "
            "derive_spawn_ranks: moe_ep_rank = tp_rank // (tp_size // ep_size)): ep (4) must divide tp (2)");
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("llama"), "hf", "sglang:tp=2,attn-dp=2"); }),
            "--infer 'sglang:tp=2,attn-dp=2': reshard init describes attention DP for qwen3_moe, deepseek_v3 and "
            "kimi_k2 only; SGLang's llama model runs its attention over the whole TP group");
  EXPECT_EQ(ErrorOf([&] { Gen(moe, "hf", "sglang:tp=4,attn-dp=3"); }),
            "--infer 'sglang:tp=4,attn-dp=3': SGLang needs tp_size divisible by attn_dp_size (4 % 3 != 0; "
            "arg_groups/parallel_hook.py): attention DP groups split the TP group");
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("llama"), "hf", "sglang:tp=2,ep=2"); }),
            "--infer 'sglang:tp=2,ep=2': the model has no experts; leave out ep");
  EXPECT_EQ(ErrorOf([&] { Gen(moe, "hf", "sglang:tp=2,quant=fp8"); }),
            "--infer 'sglang:tp=2,quant=fp8': 'quant' expects one of none, fp8-block, got 'fp8'; did you mean "
            "'fp8-block'?");
  EXPECT_EQ(ErrorOf([&] { Gen(moe, "hf", "sglang:tp=2,shared-experts=fused"); }),
            "--infer 'sglang:tp=2,shared-experts=fused': the model has no shared experts; leave out shared-experts");
  EXPECT_EQ(ErrorOf([&] { Gen(Tiny("gpt_oss"), "hf", "sglang:tp=2"); }),
            "--infer 'sglang:tp=2': reshard init describes SGLang engines for llama, qwen2, qwen3, qwen3_moe, "
            "deepseek_v3 and kimi_k2; 'gpt_oss' is not described yet");
  EXPECT_EQ(ErrorOf([&] { Gen(moe, "hf", "sglang:tp=2,quant=fp8-block"); }),
            "--infer 'sglang:tp=2,quant=fp8-block': SGLang serves FP8 block-quantized weights from an FP8 block "
            "checkpoint (quantization_config with weight_block_size); this config has none");
}

// FP8 block checkpoints: the scales beside every quantized linear, and the
// splits fp8.py rejects, with its own words.
TEST(InitSglang, Fp8Blocks) {
  json c = Tiny("deepseek_v3");
  c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {16, 16}}};
  const Result ok = Gen(c, "hf", "sglang:tp=2");
  const json i = File(ok, "infer.json");
  EXPECT_EQ((*Rule(i, "model.layers.{layer}.mlp.experts.w13_weight"))["quant"]["scale_name"],
            "model.layers.{layer}.mlp.experts.w13_weight_scale_inv");
  EXPECT_EQ((*Rule(i, "model.layers.{layer}.self_attn.fused_qkv_a_proj_with_mqa.weight"))["quant"]["block"],
            json({16, 16}));
  EXPECT_TRUE(HasNote(ok, "--infer: FP8 block scales as the checkpoint holds them (weight_scale_inv, fp32), what "
                         "SGLang keeps on Hopper; with DeepGEMM on Blackwell (sm100) it requantizes them to powers of "
                         "two in place (layers/quantization/fp8.py, requant_block_scale_ue8m0_for_deepgemm)"));
  CompileAndValidate(ok);
  // 4 heads of 24 q rows over TP4: 24-row slices of 16-row blocks.
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "sglang:tp=4"); }),
            "--infer 'sglang:tp=4': SGLang refuses it (layers/quantization/fp8.py "
            "Fp8LinearMethod.validate_block_quant_shapes): \"Weight output_partition_size = 24 is not divisible by "
            "weight quantization block_n = 16.\" (model.layers.{layer}.self_attn.q_b_proj.weight); use tp=1 or "
            "tp=2, or quant=none (BF16 weights)");
  // Attention DP 2 keeps attention at TP2 and EP keeps experts whole, but the
  // shared expert is still cut over all 4 ranks (8 rows of each part).
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "sglang:tp=4,ep=4,attn-dp=2"); }),
            "--infer 'sglang:tp=4,ep=4,attn-dp=2': SGLang refuses it (layers/quantization/fp8.py "
            "Fp8LinearMethod.validate_block_quant_shapes): \"Weight output_partition_size = 8 is not divisible by "
            "weight quantization block_n = 16.\" (model.layers.{layer}.mlp.shared_experts.gate_proj.weight); use "
            "quant=none (BF16 weights)");
  CompileAndValidate(Gen(c, "hf", "sglang:tp=4,ep=4,attn-dp=2,shared-experts=replicated"));
}

}  // namespace
}  // namespace reshard::init
