// Box algebra, strided regions and layout expansion.
#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include "compiler/box.h"
#include "compiler/expand.h"
#include "compiler/program.h"
#include "compiler/test.h"

namespace reshard {
namespace {

Box B(std::vector<int64_t> lo, std::vector<int64_t> hi) { return Box::FromVectors(lo, hi); }

TEST(Box, IntersectContainVolume) {
  Box a = B({0, 0}, {4, 8}), b = B({2, 4}, {6, 12});
  EXPECT_EQ(a.intersect(b), B({2, 4}, {4, 8}));
  EXPECT_EQ(a.intersect(b).volume(), 8);
  EXPECT_TRUE(a.intersects(b));
  EXPECT_FALSE(a.intersects(B({4, 0}, {5, 8})));  // half-open: touching is not overlapping
  EXPECT_TRUE(a.contains(B({1, 1}, {3, 8})));
  EXPECT_FALSE(a.contains(b));
  EXPECT_TRUE(a.intersect(B({5, 0}, {6, 1})).empty());
  EXPECT_EQ(a.str(), "[0:4, 0:8]");
}

TEST(Box, StackRangesStayRanges) {
  // 58 MoE layers x 256 experts x a TP32 slice of [2048, 7168] is one box.
  Box need = B({3, 0, 64, 0}, {61, 256, 128, 7168});
  Box stage = B({7, 16, 0, 0}, {11, 32, 2048, 7168});
  Box piece = need.intersect(stage);
  EXPECT_EQ(piece, B({7, 16, 64, 0}, {11, 32, 128, 7168}));
  EXPECT_EQ(piece.volume(), 4 * 16 * 64 * 7168);
}

TEST(Box, SplitCutsOuterDimsFirstAndCoversExactly) {
  Box b = B({0, 0, 0}, {3, 5, 8});
  for (int64_t max : {1, 7, 8, 16, 39, 40, 120, 1000}) {
    std::vector<Box> parts = SplitBox(b, max);
    int64_t total = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      EXPECT_LE(parts[i].volume(), max) << max;
      EXPECT_TRUE(b.contains(parts[i]));
      total += parts[i].volume();
      for (size_t j = i + 1; j < parts.size(); ++j) EXPECT_FALSE(parts[i].intersects(parts[j]));
    }
    EXPECT_EQ(total, b.volume()) << max;
  }
  EXPECT_EQ(SplitBox(b, 40).size(), 3u);  // whole [5, 8] rows stay together
}

TEST(Region, CoalesceMergesContiguousModesAndKeepsBufferModes) {
  StridedRegion r;
  r.ndim = 4;
  r.shape = {4, 16, 64, 7168};
  r.stride = {16, 1, 7168, 1};
  r.buffer_modes = 0b0011;  // layers and experts step through buffers
  StridedRegion c = r.Coalesced();
  EXPECT_EQ(c.str(), "(64,458752):(b1,1)");
  EXPECT_FALSE(c.contiguous());
  StridedRegion one;
  one.ndim = 2;
  one.shape = {1, 1};
  one.stride = {8, 1};
  EXPECT_EQ(one.Coalesced().str(), "(1):(1)");
  StridedRegion rows;
  rows.ndim = 2;
  rows.shape = {4, 8};
  rows.stride = {16, 1};
  EXPECT_EQ(rows.Coalesced().str(), "(4,8):(16,1)");
}

TEST(Region, OfFragmentFollowsItsAffineMap) {
  Fragment f;
  f.box = B({0, 8, 0}, {4, 16, 64});  // layers 0-3, rows 8-15 of a [16, 64] tensor
  f.buffer = 10;
  f.buffer_dims = 1;                   // one buffer per layer
  f.stride = {1, 64, 1};
  f.offset = 0;
  StridedRegion r = f.RegionOf(B({1, 10, 0}, {3, 12, 64}));
  EXPECT_EQ(r.buffer, 11u);
  EXPECT_EQ(r.offset, 128u);
  EXPECT_EQ(r.Coalesced().str(), "(2,128):(b1,1)");
}

// ModesFit never says yes where the coalesced region does not fit, over
// random fragments (buffer modes, strides up to past 2^32) and sub-boxes of
// up to kMaxDims dims; and it leaves to the full check the regions that fit
// only once coalesced (extent-1 modes of a 5-dim box, strides past 2^32 on
// an extent-1 mode).
TEST(Expand, ModesFitOnlyWhereTheCoalescedRegionFits) {
  std::mt19937_64 rng(11);
  int yes = 0, left = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    Fragment f;
    const int ndim = 1 + static_cast<int>(rng() % kMaxDims);
    std::vector<int64_t> lo(ndim), hi(ndim), slo(ndim), shi(ndim);
    for (int d = 0; d < ndim; ++d) {
      const int64_t extent = rng() % 4 == 0 ? 1 : 1 + static_cast<int64_t>(rng() % 6);
      lo[d] = 0, hi[d] = extent;
      slo[d] = static_cast<int64_t>(rng() % static_cast<uint64_t>(extent));
      shi[d] = slo[d] + 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(extent - slo[d]));
    }
    f.box = B(lo, hi);
    f.buffer_dims = static_cast<uint32_t>(rng() % (1u << ndim));
    int64_t s = 1;  // row-major, with a chance of a huge stride on some dim
    for (int d = ndim - 1; d >= 0; --d) {
      f.stride[d] = rng() % 8 == 0 ? (int64_t{1} << 32) + static_cast<int64_t>(rng() % 8) : s;
      s = f.stride[d] * f.box.extent(d);
    }
    const Box sub = B(slo, shi);
    const bool fits = RegionFits(f.RegionOf(sub).Coalesced());
    if (f.ModesFit(sub)) {
      ++yes;
      EXPECT_TRUE(fits) << f.box.str() << " sub " << sub.str();
    } else if (fits) {
      ++left;
    }
  }
  EXPECT_GT(yes, 1000);  // both answers occur
  EXPECT_GT(left, 100);
}

// Golden fragments of the tiny dense Megatron layout: fused QKV interleaved in
// 2 groups, TP2, uneven pipeline stages [1, 3], local layer numbering.
TEST(Expand, TinyDenseMegatronGolden) {
  CompileInputs in = LoadInputs(testing::Sample("tiny-dense/model.json"), testing::Sample("tiny-dense/train.json"),
                                testing::Sample("tiny-dense/infer.json"), testing::Sample("clusters/dgx-h100.json"));
  Expansion e = Expand(in.model, in.src);
  // Rank 5 = pp 1, dp 0, tp 1: layers 1..3, second half of every TP shard.
  const RankLayout& r5 = e.ranks[5];
  std::vector<std::string> names;
  for (const BufferDesc& b : r5.buffers) names.push_back(b.name);
  // Global layers 1..3 are local 0..2: one fused QKV buffer per local layer.
  auto qkv = std::find(names.begin(), names.end(), "decoder.layers.0.self_attention.linear_qkv.weight");
  ASSERT_NE(qkv, names.end());
  size_t qkv0 = static_cast<size_t>(qkv - names.begin());
  EXPECT_EQ(names[qkv0 + 2], "decoder.layers.2.self_attention.linear_qkv.weight");
  EXPECT_EQ(std::count(names.begin(), names.end(), "decoder.layers.3.self_attention.linear_qkv.weight"), 0);
  int q = -1, k = -1, v = -1;
  for (int t = 0; t < static_cast<int>(in.model.tensors.size()); ++t) {
    const std::string& n = in.model.tensors[t].name;
    if (n == "model.layers.{layer}.self_attn.q_proj.weight") q = t;
    if (n == "model.layers.{layer}.self_attn.k_proj.weight") k = t;
    if (n == "model.layers.{layer}.self_attn.v_proj.weight") v = t;
  }
  std::vector<std::string> got;
  for (const Fragment& f : r5.fragments)
    if (f.tensor == q || f.tensor == k || f.tensor == v)
      got.push_back(std::to_string(f.tensor) + " " + f.box.str() + " -> buffer " + std::to_string(f.buffer) + " @" +
                    std::to_string(f.offset) + " " + f.RegionOf(f.box).Coalesced().str());
  // tp 1 holds group 1 of 2: q rows 32:64, k rows 16:32, v rows 16:32; the
  // buffer holds [q | k | v] of that group = [32 | 16 | 16] rows of 64.
  std::vector<std::string> want = {
      std::to_string(q) + " [1:4, 32:64, 0:64] -> buffer " + std::to_string(qkv0) + " @0 (3,2048):(b1,1)",
      std::to_string(k) + " [1:4, 16:32, 0:64] -> buffer " + std::to_string(qkv0) + " @2048 (3,1024):(b1,1)",
      std::to_string(v) + " [1:4, 16:32, 0:64] -> buffer " + std::to_string(qkv0) + " @3072 (3,1024):(b1,1)"};
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace reshard

namespace reshard {
namespace {

// Golden fragments of the tiny MoE vLLM layout: experts stay a leading
// physical dim of w13_weight [E, 2 * I / (dp * tp), H], gate then up (vLLM's
// built-in DP2 without EP shards each expert over DP x TP = 8 ranks).
TEST(Expand, TinyMoeVllmStackedExpertsGolden) {
  CompileInputs in = LoadInputs(testing::Sample("tiny-moe/model.json"), testing::Sample("tiny-moe/train.json"),
                                testing::Sample("tiny-moe/infer.json"), testing::Sample("clusters/dgx-h100.json"));
  Expansion e = Expand(in.model, in.dst);
  const RankLayout& r1 = e.ranks[1];  // dp 0, tp 1
  std::vector<std::string> got;
  for (const Fragment& f : r1.fragments) {
    const std::string& t = in.model.tensors[f.tensor].name;
    if (t.find("experts.{expert}.gate_proj") == std::string::npos && t.find("experts.{expert}.up_proj") == std::string::npos)
      continue;
    const BufferDesc& b = r1.buffers[f.buffer];
    std::string shape;
    for (int64_t x : b.shape) {
      if (!shape.empty()) shape += ",";
      shape += std::to_string(x);
    }
    got.push_back(t.substr(t.rfind('.', t.size() - 8) + 1) + " " + f.box.str() + " -> " + b.name + "[" + shape + "] @" +
                  std::to_string(f.offset) + " " + f.RegionOf(f.box).Coalesced().str());
  }
  std::vector<std::string> want = {
      "gate_proj.weight [0:4, 0:8, 12:24, 0:64] -> model.layers.0.mlp.experts.routed_experts.w13_weight[8,24,64] @0 "
      "(4,8,768):(b1,1536,1)",
      "up_proj.weight [0:4, 0:8, 12:24, 0:64] -> model.layers.0.mlp.experts.routed_experts.w13_weight[8,24,64] @768 "
      "(4,8,768):(b1,1536,1)"};
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace reshard
