#include "compiler/round_estimate.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace reshard::routing {
namespace {

constexpr double kNic = 100, kNvlink = 400;  // bytes per second

// Two pairs swap which is busy between two rounds: each pair goes on as soon
// as its own round is done (2 + 1 s and 1 + 2 s), not when the busiest pair
// of the round is (2 + 2 s).
TEST(RoundEstimateTest, RanksDoNotWaitForStrangersAtRoundEnds) {
  RoundTraffic t(4);
  t.Add(0, 0, 1, 200, true);
  t.Add(0, 2, 3, 100, true);
  t.Add(1, 0, 1, 100, true);
  t.Add(1, 2, 3, 200, true);
  EXPECT_DOUBLE_EQ(t.FlowSeconds(kNic, kNvlink).value(), 3.0);
  EXPECT_DOUBLE_EQ(t.ReplaySeconds(kNic, kNvlink), 3.0);
}

// A message waits for both of its ends: rank 2 is idle in round 0, but its
// round-1 message to rank 1 starts only when rank 1 has finished round 0.
TEST(RoundEstimateTest, AMessageStartsWhenBothEndsHaveStartedItsRound) {
  RoundTraffic t(3);
  t.Add(0, 0, 1, 300, true);
  t.Add(1, 2, 1, 100, true);
  EXPECT_DOUBLE_EQ(t.FlowSeconds(kNic, kNvlink).value(), 4.0);
  EXPECT_DOUBLE_EQ(t.ReplaySeconds(kNic, kNvlink), 4.0);
  // Sent to rank 3, idle in round 0 as well, the same message is done at 1 s
  // and the plan when ranks 0 and 1 are, at 3 s.
  RoundTraffic u(4);
  u.Add(0, 0, 1, 300, true);
  u.Add(1, 2, 3, 100, true);
  EXPECT_DOUBLE_EQ(u.FlowSeconds(kNic, kNvlink).value(), 3.0);
  EXPECT_DOUBLE_EQ(u.ReplaySeconds(kNic, kNvlink), 3.0);
}

// Each direction of a NIC and of an NVLink port has its own bandwidth: a
// rank's sends and receives overlap, and so do its two paths.
TEST(RoundEstimateTest, DirectionsAndPathsAtTheirOwnBandwidths) {
  RoundTraffic t(3);
  t.Add(0, 0, 1, 100, true);     // 1 s over the NIC
  t.Add(0, 1, 0, 100, true);     // the other direction, at the same time
  t.Add(0, 0, 2, 800, false);    // 2 s over NVLink
  t.Add(0, 1, 1, 100000, true);  // a rank to itself: not traffic
  EXPECT_DOUBLE_EQ(t.FlowSeconds(kNic, kNvlink).value(), 2.0);
  EXPECT_DOUBLE_EQ(t.ReplaySeconds(kNic, kNvlink), 2.0);
  EXPECT_DOUBLE_EQ(RoundTraffic(5).FlowSeconds(kNic, kNvlink).value(), 0.0);
  EXPECT_DOUBLE_EQ(RoundTraffic(5).ReplaySeconds(kNic, kNvlink), 0.0);
}

// A round's messages between two ranks on one path are one message: two
// of 100 bytes take 2 s, as one of 200 would.
TEST(RoundEstimateTest, MessagesOfARoundBetweenTwoRanksAreMerged) {
  RoundTraffic t(2);
  t.Add(0, 0, 1, 100, true);
  t.Add(0, 0, 1, 100, true);
  EXPECT_DOUBLE_EQ(t.FlowSeconds(kNic, kNvlink).value(), 2.0);
}

// Repeats of a message (same round, pair and path) in any order, near each
// other or far apart (RoundTraffic joins the ones it added lately, and keeps
// the others apart), give both estimates exactly what the messages summed
// once give: 20,000 messages over up to 6,000 keys, more than the keys it
// keeps.
TEST(RoundEstimateTest, RepeatsAnywhereEstimateAsTheirSum) {
  std::mt19937 rng(7);
  struct Message {
    uint32_t round, a, b;
    uint64_t bytes;
    bool net;
  };
  std::vector<Message> keys;
  for (int k = 0; k < 6000; ++k) {  // few pairs, many rounds: keys alike but for their round
    const uint32_t a = rng() % 4, b = (a + 1 + rng() % 3) % 4;
    keys.push_back({static_cast<uint32_t>(rng() % 1000), a, b, 0, rng() % 2 == 0});
  }
  RoundTraffic repeated(4), summed(4);
  size_t last = 0;
  for (int m = 0; m < 20000; ++m) {
    // Half the time the key just added again, else any key.
    if (rng() % 2 == 0) last = rng() % keys.size();
    Message& k = keys[last];
    const uint64_t bytes = 1 + rng() % 1000;
    k.bytes += bytes;
    repeated.Add(k.round, k.a, k.b, bytes, k.net);
  }
  for (const Message& k : keys) summed.Add(k.round, k.a, k.b, k.bytes, k.net);
  EXPECT_EQ(repeated.FlowSeconds(kNic, kNvlink).value(), summed.FlowSeconds(kNic, kNvlink).value());
  EXPECT_EQ(repeated.ReplaySeconds(kNic, kNvlink), summed.ReplaySeconds(kNic, kNvlink));
}

// A rank is done with a round when its messages are, and they may be held
// up by their other ends: rank 3 receives 100 bytes from rank 0, whose NIC
// also sends 300 to rank 1. Sharing it, rank 3's message arrives at 2 s, not
// 1 s, so its 300-byte round-1 send to rank 4 ends at 5 s. The replay,
// charging each rank only its own bytes per round, says 4 s.
TEST(RoundEstimateTest, ARankWaitsForItsMessagesSharingBusierLinks) {
  RoundTraffic t(5);
  t.Add(0, 0, 1, 300, true);
  t.Add(0, 0, 3, 100, true);
  t.Add(1, 3, 4, 300, true);
  EXPECT_DOUBLE_EQ(t.FlowSeconds(kNic, kNvlink).value(), 5.0);
  EXPECT_DOUBLE_EQ(t.ReplaySeconds(kNic, kNvlink), 4.0);
}

// Max-min fairness, not equal shares: rank 2's NIC takes three messages (a
// third each), so rank 1's message to it is held to a third, and rank 1's
// other message, to rank 3, gets the rest of rank 1's NIC: two thirds,
// done at 3 s (an equal share of rank 1's NIC, a half, would take 4 s).
// Rank 3 then sends 400 bytes: done at 7 s.
TEST(RoundEstimateTest, SharesAreMaxMinFair) {
  RoundTraffic t(6);
  t.Add(0, 0, 2, 200, true);
  t.Add(0, 1, 2, 200, true);
  t.Add(0, 4, 2, 200, true);
  t.Add(0, 1, 3, 200, true);
  t.Add(1, 3, 5, 400, true);
  EXPECT_NEAR(t.FlowSeconds(kNic, kNvlink).value(), 7.0, 1e-9);
}

// Rates follow the messages that start and end. Rank 0's first round (1)
// sends 1000 bytes to rank 1, alone on rank 0's NIC until rank 2, busy with
// 500 bytes to rank 3 in round 0, posts round 1 at 5 s: from then rank 0's
// 100 bytes to rank 2 share the NIC (50 B/s each), done at 7 s, when rank 2
// posts round 2, 800 bytes to rank 3 (posted by rank 3 at 5 s): done at
// 15 s. Rank 0's message, 400 bytes left at 7 s, is done at 11 s.
TEST(RoundEstimateTest, RatesChangeAsMessagesStartAndEnd) {
  RoundTraffic t(4);
  t.Add(1, 0, 1, 1000, true);
  t.Add(1, 0, 2, 100, true);
  t.Add(0, 2, 3, 500, true);
  t.Add(2, 2, 3, 800, true);
  EXPECT_DOUBLE_EQ(t.FlowSeconds(kNic, kNvlink).value(), 15.0);
  // Without rank 2's last round, rank 0's message ends last, at 11 s.
  RoundTraffic u(4);
  u.Add(1, 0, 1, 1000, true);
  u.Add(1, 0, 2, 100, true);
  u.Add(0, 2, 3, 500, true);
  EXPECT_DOUBLE_EQ(u.FlowSeconds(kNic, kNvlink).value(), 11.0);
}

// The flow estimate gives up past its budget of steps, where the replay
// still answers: 512 ranks each sending to 64 random peers in each of 8
// rounds (each re-solve then looks at thousands of flows; without the
// budget this took minutes). A fan of 4 stays well within it.
// (Under the sanitizers only 4 peers each: the default budget's 200M steps,
// taken to the end, are 70 s there; every plain build runs both.)
TEST(RoundEstimateTest, DenseRoundsExceedTheFlowBudget) {
#ifdef RESHARD_SANITIZE
  const std::vector<uint32_t> fans = {4u};
#else
  const std::vector<uint32_t> fans = {4u, 64u};
#endif
  for (const uint32_t fan : fans) {
    SCOPED_TRACE(fan);
    RoundTraffic t(512);
    std::mt19937 rng(1);
    for (uint32_t r = 0; r < 8; ++r)
      for (uint32_t a = 0; a < 512; ++a)
        for (uint32_t k = 0; k < fan; ++k) t.Add(r, a, rng() % 512, (1 + rng() % 64) << 20, true);
    EXPECT_EQ(t.FlowSeconds(50e9, 450e9).has_value(), fan == 4);
    EXPECT_GT(t.ReplaySeconds(50e9, 450e9), 0);
  }
  // And any traffic gives up with a budget of one step.
  RoundTraffic u(3);
  u.Add(0, 0, 1, 100, true);
  u.Add(0, 2, 1, 100, true);
  EXPECT_FALSE(u.FlowSeconds(kNic, kNvlink, 1).has_value());
}

}  // namespace
}  // namespace reshard::routing
