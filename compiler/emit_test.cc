// Pass 5 (emit.cc): what the plan file shares between ranks.
#include <gtest/gtest.h>

#include "compiler/test.h"
#include "runtime/plan.h"

namespace reshard {
namespace {

TEST(Emit, RanksWithTheSameBuffersShareOneList) {
  // tiny-dense served by vLLM TP1 x DP4: the four inference ranks bind the
  // same names and shapes, so their programs point at one buffer list.
  std::vector<uint8_t> bytes =
      testing::CompileJson(testing::LoadSample("tiny-dense/model.json"), testing::LoadSample("tiny-dense/train.json"),
                           testing::LoadSample("tiny-dense/infer-tp1-dp4.json"), testing::TinyCluster());
  ValidateReport v = testing::ValidateBytes(bytes);
  EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
  Plan plan = Plan::from_bytes(bytes, "p.rsplan");
  const auto& root = plan.root();
  ASSERT_EQ(root.dst_global()->size(), 4u);
  const fb::Program& first = plan.program(root.dst_global()->Get(0));
  ASSERT_GT(first.buffers()->size(), 0u);
  for (uint32_t j = 1; j < 4; ++j) {
    const fb::Program& p = plan.program(root.dst_global()->Get(j));
    EXPECT_EQ(p.buffers(), first.buffers()) << "inference rank " << j;
  }
  // A training rank binds other buffers: its own list, its own names.
  const fb::Program& train = plan.program(root.src_global()->Get(0));
  EXPECT_NE(train.buffers(), first.buffers());
  bool differs = train.buffers()->size() != first.buffers()->size();
  for (uint32_t k = 0; !differs && k < train.buffers()->size(); ++k)
    differs = train.buffers()->Get(k)->name()->str() != first.buffers()->Get(k)->name()->str();
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace reshard
