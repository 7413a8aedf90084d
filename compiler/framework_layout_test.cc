// Layouts the frameworks really hold (issue 13): a fused buffer sharded as a
// whole (Megatron's linear_qkv at TP > query groups), ranks that hold only
// vocabulary padding, row-interleaved buffers as strided regions, declared
// heads that no layout may cut, and layouts that must name every buffer.
// The layouts live in tests/data/layouts/; tests/e2e runs them under
// `run --local` (runtime/framework_layout_e2e_test.cc).
#include <gtest/gtest.h>

#include "compiler/expand.h"
#include "compiler/test.h"

namespace reshard {
namespace {

using nlohmann::json;
using testing::ErrorOf;

json Layouts(const std::string& rel) { return LoadJson(testing::SourceDir() + "/tests/data/layouts/" + rel); }

struct Expanded {
  ModelSpec model;
  LayoutSpec layout;
  Expansion e;
};

Expanded ExpandFiles(const json& model, const json& layout) {
  Expanded x;
  x.model = ParseModel(model, "model.json");
  x.layout = ParseLayout(layout, "train.json", x.model);
  x.e = Expand(x.model, x.layout);
  return x;
}

// The rows [lo, hi) of tensor `name` (instance `layer` 0) that `rank` holds,
// with the buffer row of each fragment's first row.
struct Rows {
  int64_t lo, hi, buffer_row;
  bool operator==(const Rows& o) const { return lo == o.lo && hi == o.hi && buffer_row == o.buffer_row; }
};
std::vector<Rows> RowsOf(const Expanded& x, int rank, const std::string& name, int64_t row_elems) {
  std::vector<Rows> out;
  const RankLayout& rl = x.e.ranks[rank];
  for (const Fragment& f : rl.fragments) {
    if (x.model.tensors[f.tensor].name != name || f.box.lo[0] != 0) continue;
    out.push_back({f.box.lo[1], f.box.hi[1], static_cast<int64_t>(f.offset) / row_elems});
  }
  std::sort(out.begin(), out.end(), [](const Rows& a, const Rows& b) { return a.lo < b.lo; });
  return out;
}

const std::string kQ = "model.layers.{layer}.self_attn.q_proj.weight";
const std::string kK = "model.layers.{layer}.self_attn.k_proj.weight";
const std::string kV = "model.layers.{layer}.self_attn.v_proj.weight";

TEST(FrameworkLayout, QkvShardedAsAWholeWhenTpExceedsTheQueryGroups) {
  Expanded x = ExpandFiles(Layouts("qkv-tp4-2groups/model.json"), Layouts("qkv-tp4-2groups/train.json"));
  // [q_g0 (32 rows); k_g0 (8); v_g0 (8); q_g1; k_g1; v_g1] = 96 rows, 24 per rank.
  using R = std::vector<Rows>;
  EXPECT_EQ(RowsOf(x, 0, kQ, 64), (R{{0, 24, 0}}));
  EXPECT_EQ(RowsOf(x, 0, kK, 64), R{});
  EXPECT_EQ(RowsOf(x, 1, kQ, 64), (R{{24, 32, 0}}));
  EXPECT_EQ(RowsOf(x, 1, kK, 64), (R{{0, 8, 8}}));
  EXPECT_EQ(RowsOf(x, 1, kV, 64), (R{{0, 8, 16}}));
  EXPECT_EQ(RowsOf(x, 2, kQ, 64), (R{{32, 56, 0}}));
  EXPECT_EQ(RowsOf(x, 3, kQ, 64), (R{{56, 64, 0}}));
  EXPECT_EQ(RowsOf(x, 3, kK, 64), (R{{8, 16, 8}}));
  EXPECT_EQ(RowsOf(x, 3, kV, 64), (R{{8, 16, 16}}));
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(x.e.ranks[r].buffers[0].name, "decoder.layers.0.self_attention.linear_qkv.weight");
    EXPECT_EQ(x.e.ranks[r].buffers[0].shape, (std::vector<int64_t>{24, 64}));
  }
}

TEST(FrameworkLayout, QkvShardedAsAWholeCompilesAndValidates) {
  std::vector<uint8_t> plan =
      testing::CompileJson(Layouts("qkv-tp4-2groups/model.json"), Layouts("qkv-tp4-2groups/train.json"),
                           Layouts("qkv-tp4-2groups/infer.json"), testing::TinyCluster());
  ValidateReport v = testing::ValidateBytes(plan);
  EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
}

TEST(FrameworkLayout, AllPaddingRankHoldsItsBufferAndNothingWritesIt) {
  Expanded x = ExpandFiles(Layouts("padded-vocab/model.json"), Layouts("padded-vocab/train.json"));
  ASSERT_EQ(x.e.ranks.size(), 4u);
  const RankLayout& last = x.e.ranks[3];
  std::vector<std::string> names;
  for (const BufferDesc& b : last.buffers) names.push_back(b.name);
  EXPECT_EQ(names, (std::vector<std::string>{"embedding.word_embeddings.weight", "output_layer.weight",
                                             "decoder.final_layernorm.weight"}));
  EXPECT_EQ(last.buffers[0].shape, (std::vector<int64_t>{128, 16}));
  for (const Fragment& f : last.fragments) EXPECT_EQ(x.model.tensors[f.tensor].name, "model.norm.weight");
  // Rank 2 holds the last 44 real rows in a 128-row buffer.
  const RankLayout& r2 = x.e.ranks[2];
  EXPECT_EQ(r2.buffers[0].shape, (std::vector<int64_t>{128, 16}));
  EXPECT_EQ(r2.fragments[0].box.lo[0], 256);
  EXPECT_EQ(r2.fragments[0].box.hi[0], 300);
}

TEST(FrameworkLayout, RowInterleavedBufferIsOneStridedFragment) {
  Expanded x = ExpandFiles(Layouts("interleaved-w13/model.json"), Layouts("interleaved-w13/infer.json"));
  // Per rank: one fragment each for gate and up (all experts, 24 rows, row stride 2 x 32), one for down.
  for (int r = 0; r < 2; ++r) {
    const RankLayout& rl = x.e.ranks[r];
    ASSERT_EQ(rl.fragments.size(), 3u) << "rank " << r;  // both layers in each
    for (const Fragment& f : rl.fragments) {
      const std::string& name = x.model.tensors[f.tensor].name;
      if (name.find("down_proj") != std::string::npos) continue;
      const bool up = name.find("up_proj") != std::string::npos;
      EXPECT_EQ(f.box.lo[2], 24 * r);
      EXPECT_EQ(f.box.hi[2], 24 * (r + 1));
      EXPECT_EQ(f.stride[2], 2 * 32) << name;
      EXPECT_EQ(f.offset % (48 * 32), up ? 32u : 0u) << name;  // up rows sit one row after gate rows
    }
  }
}

TEST(FrameworkLayout, InterleavedBufferShardedAsAWholeHoldsTheSameRows) {
  Expanded per_part = ExpandFiles(Layouts("interleaved-w13/model.json"), Layouts("interleaved-w13/infer.json"));
  Expanded whole = ExpandFiles(Layouts("interleaved-w13/model.json"), Layouts("interleaved-w13/infer-whole.json"));
  for (int r = 0; r < 2; ++r) {
    const RankLayout &a = per_part.e.ranks[r], &b = whole.e.ranks[r];
    ASSERT_EQ(a.fragments.size(), b.fragments.size());
    for (size_t i = 0; i < a.fragments.size(); ++i) {
      EXPECT_EQ(a.fragments[i].box, b.fragments[i].box) << "rank " << r << " fragment " << i;
      EXPECT_EQ(a.fragments[i].offset, b.fragments[i].offset) << "rank " << r << " fragment " << i;
      EXPECT_EQ(a.fragments[i].stride, b.fragments[i].stride) << "rank " << r << " fragment " << i;
    }
    EXPECT_EQ(a.buffers[0].shape, b.buffers[0].shape);
  }
}

TEST(FrameworkLayout, InterleavedPlanIsAsSmallAsItsConcatenatedControl) {
  const json m = Layouts("interleaved-w13/model.json"), t = Layouts("interleaved-w13/train.json");
  std::vector<uint8_t> il = testing::CompileJson(m, t, Layouts("interleaved-w13/infer.json"), testing::TinyCluster());
  std::vector<uint8_t> cc =
      testing::CompileJson(m, t, Layouts("interleaved-w13/infer-concat.json"), testing::TinyCluster());
  EXPECT_LE(static_cast<double>(il.size()), 1.15 * static_cast<double>(cc.size()))
      << il.size() << " bytes against " << cc.size();
  ValidateReport v = testing::ValidateBytes(il);
  EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
}

// --- wrong specs are refused, saying how to fix them ---

json LlamaModel() {
  return json::parse(R"({"format": "reshard.model/1", "name": "llama", "dtype": "bf16", "dims": {"layer": 2},
    "tensors": [{"name": "q", "shape": [512, 64], "heads": {"dim": 0, "size": 32}},
                {"name": "k", "shape": [256, 64], "heads": {"dim": 0, "size": 32}},
                {"name": "v", "shape": [256, 64], "heads": {"dim": 0, "size": 32}}]})");
}

json Tp16(const json& kv_axis) {
  json l = json::parse(R"({"format": "reshard.layout/1", "name": "vllm-tp16", "ranks": 16, "meshes": {"tp": [["tp", 16]]},
    "placements": [{"match": "q", "tp": {"shard": 0}}, {"match": "*"}],
    "buffers": [{"name": "qkv", "parts": ["q", "k", "v"], "concat": 0}]})");
  l["placements"][1]["tp"] = kv_axis;
  return l;
}

std::string ExpandError(const json& model, const json& layout) {
  return ErrorOf([&] { ExpandFiles(model, layout); });
}

TEST(FrameworkLayoutErrors, KvHeadSplitAcrossRanks) {
  // 8 KV heads at TP16 without "parts": each rank would hold half a head.
  EXPECT_EQ(ExpandError(LlamaModel(), Tp16({{"shard", 0}})),
            "train.json: /placements/1: rank 0 holds indices 0:16 of dim 0 of 'k', which cuts a head of 32 "
            "(model.json: /tensors/1/heads); give every rank whole heads (when TP exceeds the KV heads, replicate "
            "them with \"parts\"), or set \"split_heads\": true on the placement if the cut is intended");
  EXPECT_EQ(ExpandError(LlamaModel(), Tp16({{"shard", 0}, {"parts", 8}})), "");
  json intended = Tp16({{"shard", 0}});
  intended["placements"][1]["split_heads"] = true;
  EXPECT_EQ(ExpandError(LlamaModel(), intended), "");
}

TEST(FrameworkLayoutErrors, HeadsThatDoNotDivideTheDim) {
  json m = LlamaModel();
  m["tensors"][0]["heads"]["size"] = 48;
  EXPECT_EQ(ErrorOf([&] { ParseModel(m, "model.json"); }),
            "model.json: /tensors/0/heads/size: dim 0 (size 512) is not a whole number of heads of 48");
  m["tensors"][0]["heads"] = {{"dim", 2}, {"size", 32}};
  EXPECT_EQ(ErrorOf([&] { ParseModel(m, "model.json"); }),
            "model.json: /tensors/0/heads/dim: the shape has 2 dims, dim 2 does not exist");
}

TEST(FrameworkLayoutErrors, PartLeftOutOfAFusedBuffer) {
  json l = testing::LoadSample("tiny-dense/train.json");
  json* qkv = nullptr;  // the linear_qkv rule (found by name: the sample is generated by reshard init)
  for (json& b : l["buffers"])
    if (b["name"] == "decoder.layers.{layer.local}.self_attention.linear_qkv.weight") qkv = &b;
  ASSERT_NE(qkv, nullptr);
  ASSERT_EQ((*qkv)["parts"][2], "model.layers.{layer}.self_attn.v_proj.weight");
  (*qkv)["parts"].erase(2);  // v_proj forgotten in linear_qkv
  EXPECT_EQ(ExpandError(testing::LoadSample("tiny-dense/model.json"), l),
            "train.json: /buffers: no buffer rule names 'model.layers.{layer}.self_attn.v_proj.weight'; a layout "
            "with buffer rules must name every tensor it holds, as the framework names it (add it to a rule's "
            "\"parts\", or a rule {\"name\": ..., \"tensor\": ...}), or set \"default_buffers\": true to keep the "
            "model's names for tensors no rule names");
  l["default_buffers"] = true;  // today's behaviour, asked for: v_proj keeps its model name
  Expanded x = ExpandFiles(testing::LoadSample("tiny-dense/model.json"), l);
  bool hf_named = false;
  for (const BufferDesc& b : x.e.ranks[0].buffers) hf_named |= b.name == "model.layers.0.self_attn.v_proj.weight";
  EXPECT_TRUE(hf_named);
}

TEST(FrameworkLayoutErrors, ManyUnnamedTensorsAreCounted) {
  json l = Layouts("qkv-tp4-2groups/train.json");
  l["buffers"] = json::array({l["buffers"][1]});
  EXPECT_EQ(ExpandError(Layouts("qkv-tp4-2groups/model.json"), l),
            "train.json: /buffers: no buffer rule names 'model.layers.{layer}.self_attn.q_proj.weight', "
            "'model.layers.{layer}.self_attn.k_proj.weight', 'model.layers.{layer}.self_attn.v_proj.weight' and 1 "
            "more; a layout with buffer rules must name every tensor it holds, as the framework names it (add it to "
            "a rule's \"parts\", or a rule {\"name\": ..., \"tensor\": ...}), or set \"default_buffers\": true to "
            "keep the model's names for tensors no rule names");
}

TEST(FrameworkLayoutErrors, WholeShardNeedsReplicatedParts) {
  json l = Layouts("qkv-tp4-2groups/train.json");
  l["placements"][0]["tp"] = {{"shard", 0}};
  EXPECT_EQ(ExpandError(Layouts("qkv-tp4-2groups/model.json"), l),
            "train.json: /buffers/0/shard: part 'model.layers.{layer}.self_attn.q_proj.weight' is already cut on axis "
            "'tp' by /placements/0/tp; when the buffer is sharded as a whole, its parts replicate that axis (leave it "
            "out of the placement)");
  l = Layouts("qkv-tp4-2groups/train.json");
  l["buffers"][0]["shard"] = "pp";
  EXPECT_EQ(ExpandError(Layouts("qkv-tp4-2groups/model.json"), l),
            "train.json: /buffers/0/shard: 'pp' is not an axis of mesh 'dense', where "
            "'model.layers.{layer}.self_attn.q_proj.weight' is placed (/placements/0)");
  l = Layouts("qkv-tp4-2groups/train.json");
  l["buffers"][2]["shard"] = "tp";
  EXPECT_EQ(ExpandError(Layouts("qkv-tp4-2groups/model.json"), l),
            "train.json: /buffers/2/shard: only a fused buffer (\"concat\" or \"interleave\") is sharded as a "
            "whole; shard a single tensor in its placement");
}

TEST(FrameworkLayoutErrors, WholeShardMustDivideEvenly) {
  json l = Layouts("qkv-tp4-2groups/train.json");
  l["meshes"]["dense"] = json::array({json::array({"tp", 5})});
  l["ranks"] = 5;
  EXPECT_EQ(ExpandError(Layouts("qkv-tp4-2groups/model.json"), l),
            "train.json: /buffers/0/shard: the fused dim 0 of the buffer (96 rows of all parts together) does not "
            "divide evenly over 5 positions of axis 'tp'; {\"axis\": ..., \"split\": \"chunk\"} cuts it as torch.chunk "
            "does");
}

TEST(FrameworkLayoutErrors, WholeShardCuttingAHead) {
  // TP 8 over 96 rows: 12 rows a rank, inside heads of 8.
  json l = Layouts("qkv-tp4-2groups/train.json");
  l["meshes"]["dense"] = json::array({json::array({"tp", 8})});
  l["ranks"] = 8;
  EXPECT_EQ(ExpandError(Layouts("qkv-tp4-2groups/model.json"), l),
            "train.json: /buffers/0/shard: rank 0 holds indices 0:12 of dim 0 of "
            "'model.layers.{layer}.self_attn.q_proj.weight', which cuts a head of 8 (model.json: /tensors/0/heads); "
            "give every rank whole heads (when TP exceeds the KV heads, replicate them with \"parts\"), or set "
            "\"split_heads\": true on the placement if the cut is intended");
}

}  // namespace
}  // namespace reshard
