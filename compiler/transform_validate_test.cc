// What `validate` proves of buffers that hold offset values (Buffer.offset):
// every buffer holding a tensor holds it with the offset the tensor table
// gives its side, so that the conversions the steps apply (a sender
// subtracts its buffer's offset, a receiver adds its own: plan_check keeps
// every step that touches such a buffer converting) add up to the tensor's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compiler/test.h"
#include "runtime/test.h"

namespace reshard {
namespace {

std::vector<std::string> Problems(const testing::PlanSpec& spec) {
  return testing::ValidateBytes(testing::BuildPlan(spec)).errors;
}

TEST(TransformValidate, EveryBufferHoldsItsSidesOffset) {
  testing::PlanSpec spec = testing::PackAndDirectPlan();
  spec.staging_limit = 128;
  EXPECT_EQ(Problems(spec), std::vector<std::string>{});
  // The inference side's fp32 columns held with 0.5 added, the tensor table saying none.
  spec.programs[1].buffers[0].offset = 0.5f;
  EXPECT_EQ(Problems(spec), std::vector<std::string>{
                                "rank 1: buffer 'w.cols' holds tensor 'w' with offset 0.5, the plan's inference side "
                                "holds it with offset 0"});
  // The table saying 0.5: now the rows, received straight into their buffer, hold it without.
  spec.tensors[0].infer_offset = 0.5f;
  EXPECT_EQ(Problems(spec), std::vector<std::string>{
                                "rank 1: buffer 'w.rows' holds tensor 'w' with offset 0, the plan's inference side "
                                "holds it with offset 0.5"});
  // The training side likewise.
  spec = testing::PackAndDirectPlan();
  spec.staging_limit = 128;
  spec.tensors[0].train_offset = -1;
  EXPECT_EQ(Problems(spec), std::vector<std::string>{
                                "rank 0: buffer 'w' holds tensor 'w' with offset 0, the plan's training side holds it "
                                "with offset -1"});
}

}  // namespace
}  // namespace reshard
