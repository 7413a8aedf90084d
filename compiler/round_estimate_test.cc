#include "compiler/round_estimate.h"

#include <gtest/gtest.h>

namespace reshard::routing {
namespace {

constexpr double kNic = 100, kNvlink = 400;  // bytes per second

// Two pairs swap which is busy between two rounds: in lockstep every round
// waits for its busiest pair (2 + 2 s); replayed, each pair goes on as soon
// as its own round is done (2 + 1 s and 1 + 2 s).
TEST(RoundEstimateTest, RanksDoNotWaitForStrangersAtRoundEnds) {
  RoundTraffic t(4);
  t.Add(0, 0, 1, 200, true);
  t.Add(0, 2, 3, 100, true);
  t.Add(1, 0, 1, 100, true);
  t.Add(1, 2, 3, 200, true);
  EXPECT_DOUBLE_EQ(t.LockstepSeconds(kNic, kNvlink), 4.0);
  EXPECT_DOUBLE_EQ(t.ReplaySeconds(kNic, kNvlink), 3.0);
}

// A message waits for both of its ends: rank 2 is idle in round 0, but its
// round-1 message to rank 1 starts only when rank 1 has finished round 0.
TEST(RoundEstimateTest, AMessageStartsWhenBothEndsHaveStartedItsRound) {
  RoundTraffic t(3);
  t.Add(0, 0, 1, 300, true);
  t.Add(1, 2, 1, 100, true);
  EXPECT_DOUBLE_EQ(t.ReplaySeconds(kNic, kNvlink), 4.0);
  // Sent to rank 3, idle in round 0 as well, the same message is done at 1 s
  // and the plan when ranks 0 and 1 are, at 3 s.
  RoundTraffic u(4);
  u.Add(0, 0, 1, 300, true);
  u.Add(1, 2, 3, 100, true);
  EXPECT_DOUBLE_EQ(u.ReplaySeconds(kNic, kNvlink), 3.0);
}

// A round lasts as long as a rank's busiest direction, NIC or NVLink at its
// own bandwidth; a rank's sends and receives overlap.
TEST(RoundEstimateTest, BusiestDirectionAtItsBandwidth) {
  RoundTraffic t(3);
  t.Add(0, 0, 1, 100, true);     // 1 s over the NIC
  t.Add(0, 1, 0, 100, true);     // the other direction, at the same time
  t.Add(0, 0, 2, 800, false);    // 2 s over NVLink
  t.Add(0, 1, 1, 100000, true);  // a rank to itself: not traffic
  EXPECT_DOUBLE_EQ(t.ReplaySeconds(kNic, kNvlink), 2.0);
  EXPECT_DOUBLE_EQ(t.LockstepSeconds(kNic, kNvlink), 2.0);
  EXPECT_DOUBLE_EQ(RoundTraffic(5).ReplaySeconds(kNic, kNvlink), 0.0);
}

}  // namespace
}  // namespace reshard::routing
