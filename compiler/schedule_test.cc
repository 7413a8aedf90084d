// Schedule's choice between fills (route_schedule.cc), through BuildPlan.
#include <gtest/gtest.h>

#include "compiler/compile.h"

namespace reshard {
namespace {

CompileInputs Qwen3Tp8() {
  const std::string s = std::string(RESHARD_SOURCE_DIR) + "/samples/";
  return LoadInputs(s + "qwen3-235b/model.json", s + "qwen3-235b/train-tp4-pp8-ep16.json",
                    s + "qwen3-235b/infer-tp8-dp16.json", s + "clusters/dgx-h100.json");
}

// Qwen3-235B TP4 PP8 EP16 -> TP8 DP16: the flow estimate finds the coarse
// shares fastest (simulate: 1.0185x against the greedy fill's 1.0212x); where
// it gives up (a budget of one step) every fill is compared by the replay,
// which keeps the greedy fill, as it did before the flow estimate.
TEST(ScheduleTest, FallsBackToTheReplayPastTheFlowBudget) {
  const CompileInputs in = Qwen3Tp8();
  CompileOptions opt;
  const PlanIR flows = BuildPlan(in, opt);
  EXPECT_TRUE(flows.round_fill.proportional);
  EXPECT_DOUBLE_EQ(flows.round_fill.min_share, 0.25);
  opt.flow_budget = 1;
  const PlanIR replay = BuildPlan(in, opt);
  EXPECT_FALSE(replay.round_fill.proportional);
  EXPECT_DOUBLE_EQ(replay.round_fill.staging_fill, 0.9);
}

}  // namespace
}  // namespace reshard
