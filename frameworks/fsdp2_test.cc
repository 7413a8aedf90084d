// reshard init --train/--infer fsdp2:...: the layouts FSDP2 ranks hold (1-D,
// HSDP, NeMo RL's TP plan under FSDP2, transformers 5's fused experts), compiled
// into vLLM and HF layouts, and the errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "compiler/expand.h"
#include "compiler/init.h"
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
using Span = std::pair<int64_t, int64_t>;  // [lo, hi)

// The samples' tiny configs, with sizes torch.chunk cuts unevenly where a test
// needs it.
json Dense() {
  json c = testing::LoadSample("tiny-dense/config.json");  // llama: 4 heads of 16 (2 KV), hidden 64, 4 layers
  c["vocab_size"] = 250;                                    // 63, 63, 63, 61 over 4
  c["intermediate_size"] = 46;                              // TP2: 23 | 23, then 12, 11 over dp_shard 2
  return c;
}

json Moe(int64_t experts = 3) {
  json c = testing::LoadSample("tiny-moe/config.json");  // qwen3_moe: 8 heads of 16 (2 KV), hidden 64, I 96
  c["num_experts"] = experts;                             // 3 over 4: the last rank holds none
  return c;
}

bool HasNote(const Result& r, const std::string& part) {
  for (const auto& n : r.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

// One side's layout expanded: every rank's buffers and fragments.
struct Side {
  ModelSpec model;
  Expansion e;
  const BufferDesc* Buffer(int rank, const std::string& name) const {
    for (const BufferDesc& b : e.ranks[rank].buffers)
      if (b.name == name) return &b;
    return nullptr;
  }
  std::vector<int64_t> Shape(int rank, const std::string& name) const {
    const BufferDesc* b = Buffer(rank, name);
    return b ? b->shape : std::vector<int64_t>{-1};
  }
  // [lo, hi) of logical dim `dim` (stack dims first) of the first fragment in buffer `name`.
  std::pair<int64_t, int64_t> Range(int rank, const std::string& name, int dim) const {
    const RankLayout& r = e.ranks[rank];
    for (const Fragment& f : r.fragments)
      if (r.buffers[f.buffer].name == name) return {f.box.lo[dim], f.box.hi[dim]};
    return {-1, -1};
  }
};

Side Expanded(const Result& r, const std::string& file) {
  Side s{ParseModel(File(r, "model.json"), "model.json"), {}};
  s.e = Expand(s.model, ParseLayout(File(r, file), file, s.model));
  return s;
}

// Compiles and validates the generated specs; returns the bytes the plan moves.
uint64_t CompileAndValidate(const Result& r) {
  auto bytes = testing::CompileJson(File(r, "model.json"), File(r, "train.json"), File(r, "infer.json"),
                                    testing::TinyCluster());
  const Plan plan = Plan::from_bytes(bytes, "test.rsplan");
  const uint64_t moved = plan.root().total_net_bytes() + plan.root().total_nvlink_bytes();
  const ValidateReport report = testing::ValidateBytes(std::move(bytes));
  EXPECT_TRUE(report.ok()) << (report.errors.empty() ? "" : report.errors.front());
  return moved;
}

// 1-D FSDP2 over 4 ranks: torch.chunk sizes, fp32 masters that the plan feeds
// with bf16 (as many bytes as a bf16 model moves).
TEST(Fsdp2, OneDimFsdpFp32MastersMoveBf16) {
  const Result fp32 = Gen(Dense(), "fsdp2:dp_shard=4", "vllm:tp=2");
  const json t = File(fp32, "train.json");
  EXPECT_EQ(t["ranks"], 4);
  EXPECT_EQ(t["meshes"], json::parse(R"({"fsdp": [["dp_shard", 4]]})"));
  EXPECT_EQ(t["dtype"], "fp32");
  EXPECT_EQ(t["default_buffers"], true);
  EXPECT_EQ(File(fp32, "model.json")["dtype"], "bf16");
  EXPECT_EQ((*Place(t, "model.embed_tokens.weight"))["dp_shard"], json::parse(R"({"shard": 0, "split": "chunk"})"));
  // k_proj: 32 rows over 4 = 8, heads of 16: FSDP2 cuts heads, said so; q_proj's 16 rows are whole heads.
  EXPECT_EQ((*Place(t, "model.layers.{layer}.self_attn.k_proj.weight"))["split_heads"], true);
  EXPECT_FALSE(Place(t, "model.layers.{layer}.self_attn.q_proj.weight")->contains("split_heads"));
  const Side s = Expanded(fp32, "train.json");
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(s.Shape(r, "model.embed_tokens.weight"), (std::vector<int64_t>{r < 3 ? 63 : 61, 64})) << r;
    EXPECT_EQ(s.Range(r, "model.embed_tokens.weight", 0), Span(63 * r, std::min<int64_t>(250, 63 * (r + 1))));
    EXPECT_EQ(s.Shape(r, "model.layers.2.mlp.gate_proj.weight"), (std::vector<int64_t>{r < 3 ? 12 : 10, 64})) << r;
    for (const BufferDesc& b : s.e.ranks[r].buffers) EXPECT_EQ(b.dtype, Dtype::fp32) << b.name;
  }
  EXPECT_TRUE(HasNote(fp32, "--train: uneven chunks over dp_shard 4 (torch.chunk: the last positions hold less): "
                            "model.embed_tokens.weight 250 rows -> 63, 63, 63, 61"));
  EXPECT_TRUE(HasNote(fp32, "the model is bf16, so the plan moves bf16"));
  EXPECT_EQ(File(fp32, "train.json")["name"], "fsdp2-dp_shard4-fp32");

  const Result bf16 = Gen(Dense(), "fsdp2:dp_shard=4,master=bf16", "vllm:tp=2");
  const json tb = File(bf16, "train.json");
  EXPECT_FALSE(tb.contains("dtype"));
  const Side sb = Expanded(bf16, "train.json");
  for (const BufferDesc& b : sb.e.ranks[0].buffers) EXPECT_EQ(b.dtype, Dtype::bf16) << b.name;
  // The wire carries the model's bf16 either way: fp32 masters move what bf16
  // parameters move (give or take the staging's alignment), about half of
  // what an fp32 model would.
  const uint64_t moved_fp32 = CompileAndValidate(fp32), moved_bf16 = CompileAndValidate(bf16);
  json wide = File(fp32, "model.json");
  wide["dtype"] = "fp32";
  const uint64_t moved_wide = Plan::from_bytes(testing::CompileJson(wide, t, File(fp32, "infer.json"),
                                                                    testing::TinyCluster()), "wide.rsplan")
                                  .root()
                                  .total_nvlink_bytes();
  EXPECT_GT(moved_bf16, 0u);
  EXPECT_LT(moved_fp32, moved_bf16 * 21 / 20);
  EXPECT_LT(moved_fp32, moved_wide * 11 / 20);
  CompileAndValidate(Gen(Dense(), "fsdp2:dp_shard=4", "hf"));
  CompileAndValidate(Gen(Dense(), "hf:tp=2", "fsdp2:dp_shard=4"));  // FSDP2 as the destination
}

// HSDP: (Replicate(), Shard(0)) over (dp_replicate, dp_shard), dp_shard fastest.
TEST(Fsdp2, HsdpReplicatesEachShardGroup) {
  const Result r = Gen(Dense(), "fsdp2:dp_replicate=2,dp_shard=2", "vllm:tp=2");
  const json t = File(r, "train.json");
  EXPECT_EQ(t["meshes"], json::parse(R"({"fsdp": [["dp_replicate", 2], ["dp_shard", 2]]})"));
  EXPECT_EQ(t["ranks"], 4);
  EXPECT_FALSE(Place(t, "model.norm.weight")->contains("dp_replicate"));
  const Side s = Expanded(r, "train.json");
  for (int rank : {0, 2}) EXPECT_EQ(s.Range(rank, "model.embed_tokens.weight", 0), Span(0, 125));
  for (int rank : {1, 3}) EXPECT_EQ(s.Range(rank, "model.embed_tokens.weight", 0), Span(125, 250));
  EXPECT_TRUE(HasNote(r, "DeviceMesh (dp_replicate 2, dp_shard 2), row-major, tp fastest: 4 ranks"));
  CompileAndValidate(r);
}

// NeMo RL's TP plan, then FSDP2 over each TP-local piece (_StridedShard).
TEST(Fsdp2, TpThenFsdpChunksTheTpLocalPiece) {
  const Result r = Gen(Dense(), "fsdp2:dp_shard=2,tp=2", "vllm:tp=2");
  const json t = File(r, "train.json");
  EXPECT_EQ(t["meshes"], json::parse(R"({"fsdp": [["dp_shard", 2], ["tp", 2]]})"));
  const std::string gate = "model.layers.{layer}.mlp.gate_proj.weight";
  EXPECT_EQ(*Place(t, gate), json::parse(R"({"match": ")" + gate + R"(", "mesh": "fsdp",
      "tp": {"shard": 0, "split": "chunk"}, "dp_shard": {"shard": 0, "split": "chunk"}, "order": ["tp", "dp_shard"]})"));
  EXPECT_EQ((*Place(t, "model.layers.{layer}.self_attn.o_proj.weight"))["tp"], json::parse(R"({"shard": 1, "split": "chunk"})"));
  EXPECT_EQ((*Place(t, "model.embed_tokens.weight"))["tp"], json::parse(R"({"shard": 0, "split": "chunk"})"));
  EXPECT_FALSE(Place(t, "model.layers.{layer}.input_layernorm.weight")->contains("tp"));
  // gate_proj [46, 64]: TP 23 | 23, then FSDP 12 | 11 of each piece. Rank = dp_shard x 2 + tp.
  const Side s = Expanded(r, "train.json");
  const std::string g0 = "model.layers.0.mlp.gate_proj.weight";
  EXPECT_EQ(s.Range(0, g0, 1), Span(0, 12));
  EXPECT_EQ(s.Range(1, g0, 1), Span(23, 35));
  EXPECT_EQ(s.Range(2, g0, 1), Span(12, 23));
  EXPECT_EQ(s.Range(3, g0, 1), Span(35, 46));
  // o_proj [64, 64]: columns by TP, rows by FSDP.
  EXPECT_EQ(s.Shape(3, "model.layers.0.self_attn.o_proj.weight"), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(s.Range(3, "model.layers.0.self_attn.o_proj.weight", 2), Span(32, 64));
  EXPECT_TRUE(HasNote(r, "--train: tp 2 follows NeMo RL's TP plan"));
  EXPECT_TRUE(HasNote(r, "model.layers.{layer}.mlp.gate_proj.weight 23 rows per TP piece -> 12, 11"));
  CompileAndValidate(r);
  CompileAndValidate(Gen(Dense(), "fsdp2:dp_replicate=2,dp_shard=3,tp=2", "hf:tp=2"));
  // A TP degree that cuts a head is refused, naming the tensor and the config values.
  EXPECT_EQ(ErrorOf([] { Gen(Dense(), "fsdp2:dp_shard=2,tp=4", "hf"); }),
            "--train 'fsdp2:dp_shard=2,tp=4': tp (4) would cut an attention head: NeMo RL's TP plan shards "
            "model.layers.{layer}.self_attn.k_proj.weight dim 0 (ColwiseParallel), 2 heads of 16 "
            "(num_key_value_heads 2), which tp does not divide; use tp=1 or tp=2");
  EXPECT_NE(ErrorOf([] { Gen(Tiny("deepseek_v3"), "fsdp2:dp_shard=2,tp=2", "hf"); })
                .find("no rule for MLA's q_a_proj / q_b_proj / kv_a_proj_with_mqa / kv_b_proj (deepseek_v3)"),
            std::string::npos);
}

// transformers 5 fuses the experts: gate_up_proj [E, 2I, H] (gate then up)
// and down_proj [E, H, I], Shard(0) over the experts; 3 experts over 4 ranks
// leave the last one empty [0, ...] buffers.
TEST(Fsdp2, FusedExpertsShardedOverExpertsWithEmptyShards) {
  const Result r = Gen(Moe(3), "fsdp2:dp_shard=4", "vllm:tp=2,ep");
  const json t = File(r, "train.json");
  const std::string gu = "model.layers.{layer}.mlp.experts.gate_up_proj";
  EXPECT_EQ(*Rule(t, gu), json::parse(R"({"name": ")" + gu + R"(", "parts": [
      "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight",
      "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight"], "concat": 0})"));
  EXPECT_EQ((*Rule(t, "model.layers.{layer}.mlp.experts.down_proj"))["parts"],
            json({"model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"}));
  EXPECT_EQ((*Place(t, "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight"))["dp_shard"],
            json::parse(R"({"shard": "expert", "split": "chunk"})"));
  const Side s = Expanded(r, "train.json");
  for (int rank = 0; rank < 4; ++rank) {
    const int64_t e = rank < 3 ? 1 : 0;
    EXPECT_EQ(s.Shape(rank, "model.layers.1.mlp.experts.gate_up_proj"), (std::vector<int64_t>{e, 192, 64})) << rank;
    EXPECT_EQ(s.Shape(rank, "model.layers.1.mlp.experts.down_proj"), (std::vector<int64_t>{e, 64, 96})) << rank;
    EXPECT_EQ(s.Shape(rank, "model.layers.1.mlp.gate.weight"), (std::vector<int64_t>{e, 64})) << rank;  // the router
    EXPECT_EQ(s.Buffer(rank, "model.layers.1.mlp.experts.gate_up_proj")->dtype, Dtype::fp32);
  }
  EXPECT_TRUE(HasNote(r, "empty shards (FSDP2's [0, ...] local shards; zero-size buffers in the plan): "
                         "model.layers.{layer}.mlp.gate.weight (3 rows over 4): 1 of 4 ranks; "
                         "model.layers.{layer}.mlp.experts.gate_up_proj (3 experts over 4): 1 of 4 ranks; "
                         "model.layers.{layer}.mlp.experts.down_proj (3 experts over 4): 1 of 4 ranks"));
  CompileAndValidate(r);
  CompileAndValidate(Gen(Moe(3), "fsdp2:dp_shard=4,tp=2,master=bf16", "hf"));

  // experts-dim=1 (a shard_placement_fn's Shard(1)): gate_up_proj's 2I rows
  // chunked as a whole, down_proj's H rows; FSDP2 takes a dim > 0 only evenly.
  const Result d1 = Gen(Moe(8), "fsdp2:dp_shard=4,experts-dim=1", "vllm:tp=2,ep");
  EXPECT_EQ((*Rule(File(d1, "train.json"), gu))["shard"], json::parse(R"({"axis": "dp_shard", "split": "chunk"})"));
  EXPECT_EQ(Expanded(d1, "train.json").Shape(2, "model.layers.0.mlp.experts.gate_up_proj"),
            (std::vector<int64_t>{8, 48, 64}));
  CompileAndValidate(d1);
  json odd = Moe(8);
  odd["moe_intermediate_size"] = 13;
  EXPECT_EQ(ErrorOf([&] { Gen(odd, "fsdp2:dp_shard=4,experts-dim=1", "hf"); }),
            "--train 'fsdp2:dp_shard=4,experts-dim=1': FSDP2 refuses uneven sharding on a dim other than 0 "
            "(torch/distributed/fsdp/_fully_shard/_fsdp_param.py _init_sharded_param: \"FSDP does not support "
            "uneven sharding on dim 1\"): model.layers.{layer}.mlp.experts.gate_up_proj dim 1 is 26, dp_shard 4");
}

// Mixtral's block_sparse_moe is transformers 5's `mlp`; DeepSeek-V3's router
// bias is a module buffer FSDP2 leaves whole, fp32 as the checkpoint stores it.
TEST(Fsdp2, MixtralAndDeepseekNames) {
  const json mix = File(Gen(Tiny("mixtral"), "fsdp2:dp_shard=2", "hf"), "train.json");
  EXPECT_EQ((*Rule(mix, "model.layers.{layer}.mlp.experts.gate_up_proj"))["parts"],
            json({"model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.weight",
                  "model.layers.{layer}.block_sparse_moe.experts.{expert}.w3.weight"}));
  EXPECT_EQ((*Rule(mix, "model.layers.{layer}.mlp.gate.weight"))["parts"],
            json({"model.layers.{layer}.block_sparse_moe.gate.weight"}));
  const Result ds = Gen(Tiny("deepseek_v3"), "fsdp2:dp_shard=4,master=bf16", "vllm:tp=2,ep");
  const json t = File(ds, "train.json");
  const std::string bias = "model.layers.{layer}.mlp.gate.e_score_correction_bias";
  EXPECT_EQ(*Place(t, bias), json::parse(R"({"match": ")" + bias + R"(", "mesh": "fsdp"})"));
  EXPECT_NE(Place(t, "model.layers.{layer}.mlp.shared_experts.up_proj.weight"), nullptr);
  const Side s = Expanded(ds, "train.json");
  EXPECT_EQ(s.Buffer(3, "model.layers.2.mlp.gate.e_score_correction_bias")->dtype, Dtype::fp32);
  EXPECT_EQ(s.Shape(3, "model.layers.2.mlp.gate.e_score_correction_bias"), std::vector<int64_t>{8});
  EXPECT_EQ(s.Buffer(3, "model.layers.2.mlp.gate.weight")->dtype, Dtype::bf16);
  EXPECT_TRUE(HasNote(ds, "model.layers.{layer}.mlp.gate.e_score_correction_bias stays fp32 as the checkpoint stores it"));
  CompileAndValidate(ds);
}

// Every architecture, FSDP2 on either side, 1-D, HSDP and (GQA models) TP.
TEST(Fsdp2, EveryArchitectureCompilesAndValidates) {
  for (const std::string& type : SupportedModelTypes()) {
    // transposed experts: refused (Init.GptOssRefusals, Init.Llama4)
    if (type == "gpt_oss" || type == "llama4" || type == "llama4_text") continue;
    SCOPED_TRACE(type);
    const json c = Tiny(type);
    const bool moe = fixtures::Moe(type);
    const bool mla = type == "deepseek_v3" || type == "kimi_k2";
    CompileAndValidate(Gen(c, "fsdp2:dp_shard=4", moe ? "vllm:tp=2,ep" : "vllm:tp=2"));
    CompileAndValidate(Gen(c, "megatron:tp=2,pp=2" + std::string(moe ? ",ep=2,etp=1" : ""),
                           "fsdp2:dp_replicate=2,dp_shard=3,master=bf16"));
    if (!mla && type != "qwen3_next") CompileAndValidate(Gen(c, "fsdp2:dp_shard=3,tp=2", "hf:tp=2"));  // no TP plan
  }
}

// Qwen3-Next: the checkpoint-fused parameters transformers holds whole
// (q_proj per head [query; gate], in_proj_qkvz, in_proj_ba, conv1d) are
// chunked over dp_shard as whole buffers; their parts are whole on dp_shard.
TEST(Fsdp2, Qwen3NextFusedParametersAreChunkedWhole) {
  const Result r = Gen(Tiny("qwen3_next"), "fsdp2:dp_shard=3", "vllm:tp=2");
  const json t = File(r, "train.json");
  const json* qkvz = Rule(t, "model.layers.{layer}.linear_attn.in_proj_qkvz.weight");
  ASSERT_NE(qkvz, nullptr);
  EXPECT_EQ((*qkvz)["interleave"], json({{"dim", 0}, {"groups", 2}}));
  EXPECT_EQ((*qkvz)["shard"], json({{"axis", "dp_shard"}, {"split", "chunk"}}));
  ASSERT_NE(Rule(t, "model.layers.{layer}.self_attn.q_proj.weight"), nullptr);
  ASSERT_NE(Rule(t, "model.layers.{layer}.linear_attn.conv1d.weight"), nullptr);
  const json* p = Place(t, "model.layers.{layer}.linear_attn.in_proj_qkvz.v.weight");
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(p->contains("dp_shard"));  // whole: the rule cuts the fused buffer
  CompileAndValidate(r);
}

TEST(Fsdp2, BadSettingsNameTheOption) {
  const json c = Dense();
  EXPECT_EQ(ErrorOf([&] { Gen(c, "fsdp2:dp_shard=0", "hf"); }),
            "--train 'fsdp2:dp_shard=0': 'dp_shard' expects a positive integer, got '0'");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "fsdp2:dp_shard=2,dp_replicate=0", "hf"); }),
            "--train 'fsdp2:dp_shard=2,dp_replicate=0': 'dp_replicate' expects a positive integer, got '0'");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "hf", "fsdp2:dp_shards=4"); }),
            "--infer 'fsdp2:dp_shards=4': unknown option 'dp_shards' for fsdp2, expected one of dp_shard, "
            "dp_replicate, tp, master, experts-dim; did you mean 'dp_shard'?");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "fsdp2:dp_shard=4,master=fp16", "hf"); }),
            "--train 'fsdp2:dp_shard=4,master=fp16': 'master' expects fp32 or bf16 (the dtype the sharded parameters "
            "hold), got 'fp16'");  // FP16 is neither: no suggestion of another dtype
  EXPECT_EQ(ErrorOf([&] { Gen(c, "fsdp2:tp=2", "hf"); }),
            "--train 'fsdp2:tp=2': fsdp2 needs dp_shard=N: the size of the DeviceMesh dim fully_shard shards over "
            "(TorchTitan's dp_shard)");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "fsdp2", "hf"); }),
            "--train 'fsdp2': expected fsdp2:key=value,... (dp_shard, dp_replicate, tp, master, experts-dim)");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "fsdp:dp_shard=4", "hf"); }),
            "--train 'fsdp:dp_shard=4': unknown framework 'fsdp', expected megatron:..., vllm:..., sglang:..., "
            "hf[:tp=N] or fsdp2:dp_shard=N,...; did you mean 'fsdp2'?");
  EXPECT_EQ(ErrorOf([&] { Gen(c, "fsdp2:dp_shard=4,experts-dim=1", "hf"); }),
            "--train 'fsdp2:dp_shard=4,experts-dim=1': the model has no experts; leave out experts-dim");
  EXPECT_EQ(ErrorOf([&] { Gen(Moe(), "fsdp2:dp_shard=4,experts-dim=2", "hf"); }),
            "--train 'fsdp2:dp_shard=4,experts-dim=2': 'experts-dim' expects 0 (Shard(0): over the experts) or 1 "
            "(Shard(1), TorchTitan's shard_placement_fn), got '2'");
}

TEST(Fsdp2, HelpStatesTheTpPlan) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen((std::string(RESHARD_BINARY) + " init --help").c_str(), "r"), pclose);
  ASSERT_TRUE(p);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p.get())) > 0;) out.append(buf, n);
  for (const char* s : {"fsdp2:dp_shard=N[,dp_replicate=N][,tp=N][,master=fp32|bf16][,experts-dim=0|1]",
                        "NeMo RL's TP plan", "ColwiseParallel", "RowwiseParallel", "_StridedShard", "fsdp2:dp_shard=8,tp=2"})
    EXPECT_NE(out.find(s), std::string::npos) << s;
}

}  // namespace
}  // namespace reshard::init
