// The GPU memory check: per rank, or per GPU where both sides share it.
#include "compiler/memory_check.h"

#include <gtest/gtest.h>

#include "compiler/test.h"

namespace reshard {
namespace {

LayoutSpec Layout(const std::string& file, const std::string& name) {
  LayoutSpec l;
  l.file = file;
  l.name = name;
  return l;
}

TEST(MemoryCheck, DisjointSidesEachNameTheirHeaviestRank) {
  ClusterSpec c;
  c.file = "c.json";
  const LayoutSpec t = Layout("t.json", "train"), i = Layout("i.json", "infer");
  EXPECT_TRUE(CheckGpuMemory(c, t, {100, 200}, i, {300}).empty());  // no gpu_memory_GB: no check
  c.gpu_memory_GB = 1;
  EXPECT_TRUE(CheckGpuMemory(c, t, {1000000000, 7}, i, {999999999}).empty());  // at the limit fits
  const auto w = CheckGpuMemory(c, t, {1500000000, 2500000000, 900}, i, {7});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].side, "train");
  EXPECT_EQ(w[0].rank, 1);
  EXPECT_EQ(w[0].bytes, 2500000000u);
  EXPECT_EQ(w[0].limit_bytes, 1000000000u);
  EXPECT_EQ(w[0].ranks_over, 2);
  EXPECT_EQ(w[0].message,
            "t.json (train): rank 1 holds 2.50 GB of weights (2500000000 bytes), more than its GPU's 1 GB (c.json: "
            "/gpu_memory_GB); 2 of its 3 ranks do");
  const nlohmann::ordered_json j = MemoryWarningsJson(w);
  EXPECT_EQ(j[0]["rank"], 1);
  EXPECT_EQ(j[0]["bytes"], 2500000000u);
  EXPECT_EQ(j[0]["limit_bytes"], 1000000000u);
}

TEST(MemoryCheck, ColocatedRanksAddUpOnTheirGpu) {
  ClusterSpec c;
  c.file = "c.json";
  c.colocated = true;
  c.gpu_memory_GB = 1;
  // Each side fits alone; GPU 1 holds 0.6 + 0.5 GB.
  const auto w = CheckGpuMemory(c, Layout("t.json", "train"), {600000000, 600000000}, Layout("i.json", "infer"),
                                {300000000, 500000000});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].side, "train+infer");
  EXPECT_EQ(w[0].message,
            "t.json + i.json (colocated): GPU 1 holds 1.10 GB of weights (train rank 1: 0.60 GB, infer rank 1: 0.50 "
            "GB; 1100000000 bytes), more than its 1 GB (c.json: /gpu_memory_GB); 1 of the 2 GPUs do");
}

TEST(MemoryCheck, RankWeightBytesCountEveryBufferWithItsDtype) {
  Expansion e;
  e.ranks.resize(2);
  e.ranks[0].buffers.push_back({"a", Dtype::bf16, {3, 4}});
  e.ranks[0].buffers.push_back({"b", Dtype::fp32, {5}});
  e.ranks[1].buffers.push_back({"c", Dtype::fp8_e4m3, {0, 4}});  // a zero-size buffer (an empty shard)
  EXPECT_EQ(RankWeightBytes(e), std::vector<uint64_t>({3 * 4 * 2 + 5 * 4, 0}));
}

TEST(MemoryCheck, ClusterFieldIsOptionalAndChecked) {
  nlohmann::json c = testing::TinyCluster();
  EXPECT_EQ(ParseCluster(c, "c.json").gpu_memory_GB, 0);
  c["gpu_memory_GB"] = 80;
  EXPECT_EQ(ParseCluster(c, "c.json").gpu_memory_GB, 80);
  c["gpu_memory_GB"] = "80";
  EXPECT_EQ(testing::ErrorOf([&] { ParseCluster(c, "c.json"); }), "c.json: /gpu_memory_GB: expected a number, got a string");
  c["gpu_memory_GB"] = 0;
  EXPECT_EQ(testing::ErrorOf([&] { ParseCluster(c, "c.json"); }), "c.json: /gpu_memory_GB: expected a positive number, got 0");
  // The bundled clusters say theirs.
  for (const auto& [name, text] : BuiltinClusters()) {
    SCOPED_TRACE(name);
    EXPECT_GT(ParseCluster(ParseJson(text, name), name).gpu_memory_GB, 0);
  }
}

}  // namespace
}  // namespace reshard
