// Multi-rank runs of hand-built plans over Gloo, one forked process per rank,
// every destination element checked against the synthetic values.
#include "runtime/gloo_transport.h"

#include <gtest/gtest.h>

#include <regex>

#include "runtime/error.h"
#include "runtime/synthetic.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using testing::BuildPlan;
using testing::MakeFragment;
using testing::MakeRegion;
using testing::MakeStep;
using testing::PlanSpec;
using testing::ProgramSpec;
using testing::RankOutcome;
using testing::RunRanks;
using testing::StagingRegion;
using testing::TempDir;
using K = fb::StepKind;
using D = fb::Dtype;
using fb::Channel;

// Runs rank `rank` of the plan over Gloo; "" when every element is right.
std::string RunRank(const std::vector<uint8_t>& bytes, int rank, const std::string& dir,
                    std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  Plan plan = Plan::from_bytes(bytes, "p.rsplan");
  GlooOptions options;
  options.store_dir = dir;
  options.timeout = timeout;
  GlooTransport transport(static_cast<uint32_t>(rank), plan.num_ranks(), options);
  SyntheticRun run = RunSynthetic(plan, static_cast<uint32_t>(rank), transport);
  if (run.check.wrong == 0) return "";
  std::string msg = std::to_string(run.check.wrong) + " wrong of " + std::to_string(run.check.checked);
  for (const WrongElement& w : run.check.first) msg += "\n" + FormatWrong(w);
  return msg;
}

void ExpectAllSucceed(const std::vector<RankOutcome>& out) {
  for (size_t r = 0; r < out.size(); ++r) {
    EXPECT_EQ(out[r].exit_code, 0) << "rank " << r << ": " << out[r].message;
    EXPECT_FALSE(out[r].timed_out) << "rank " << r;
  }
}

// Tensor w bf16 [8,16] held whole by rank 0. Rank 1 needs columns 4..12 as
// fp32 (pack on 0, unpack converting on 1) and rows 0..4 as bf16, sent
// straight from rank 0's buffer into its own.
PlanSpec PackAndDirectPlan() {
  PlanSpec spec;
  spec.tensors.push_back({"w", D::bf16, {0, 0}, {8, 16}});
  ProgramSpec p0, p1;
  p0.rank = 0;
  p0.buffers = {{"w", D::bf16, {8, 16}}};
  p0.fragments.push_back(MakeFragment(0, 0, 0, {0, 0}, {8, 16}, {16, 1}, 0));
  p0.staging_bytes = 128;
  uint32_t cols = p0.Region(MakeRegion(0, 4, {8, 8}, {16, 1}));
  uint32_t rows = p0.Region(MakeRegion(0, 0, {4, 16}, {16, 1}));
  p0.Step(MakeStep(K::pack, kNone, cols, kNone, 0, 128, D::bf16));
  p0.Step(MakeStep(K::send, 1, kNone, kNone, 0, 128, D::bf16));
  p0.Step(MakeStep(K::send, 1, rows, kNone, 0, 128, D::bf16));
  p1.rank = 1;
  p1.buffers = {{"w.cols", D::fp32, {8, 8}}, {"w.rows", D::bf16, {4, 16}}};
  p1.fragments.push_back(MakeFragment(0, 0, 0, {0, 4}, {8, 12}, {8, 1}, 1));
  p1.fragments.push_back(MakeFragment(0, 1, 0, {0, 0}, {4, 16}, {16, 1}, 1));
  p1.staging_bytes = 128;
  uint32_t dcols = p1.Region(MakeRegion(0, 0, {8, 8}, {8, 1}));
  uint32_t drows = p1.Region(MakeRegion(1, 0, {64}, {1}));
  p1.Step(MakeStep(K::recv, 0, kNone, kNone, 0, 128, D::bf16));
  p1.Step(MakeStep(K::recv, 0, kNone, drows, 0, 128, D::bf16));
  p1.Step(MakeStep(K::unpack, kNone, kNone, dcols, 0, 128, D::bf16));
  spec.programs = {p0, p1};
  return spec;
}

TEST(GlooTest, PackSendRecvUnpackAndDirect) {
  TempDir dir;
  std::vector<uint8_t> bytes = BuildPlan(PackAndDirectPlan());
  ExpectAllSucceed(RunRanks(2, [&](int r) { return RunRank(bytes, r, dir.path()); }));
}

// Tensor u fp32 [4,32]: rank 0 holds rows 0..2, rank 1 rows 2..4; ranks 2 and
// 3 each need all of u. Round 0: 0 -> 2 and 1 -> 3 straight from the buffers
// into staging. Round 1: 2 and 3 forward what they got to each other (nvlink);
// both unpack both halves, rank 3 through a staging region in fp16 ... as fp32.
PlanSpec ForwardPlan() {
  PlanSpec spec;
  spec.tensors.push_back({"u", D::fp32, {0, 0}, {4, 32}});
  std::vector<ProgramSpec> p(4);
  for (int s = 0; s < 2; ++s) {
    p[s].rank = s;
    p[s].buffers = {{"u.half", D::fp32, {2, 32}}};
    p[s].fragments.push_back(MakeFragment(0, 0, 0, {static_cast<uint32_t>(2 * s), 0},
                                          {static_cast<uint32_t>(2 * s + 2), 32}, {32, 1}, 0));
    uint32_t all = p[s].Region(MakeRegion(0, 0, {2, 32}, {32, 1}));
    p[s].Step(MakeStep(K::send, 2 + s, all, kNone, 0, 256, D::fp32));
  }
  for (int d = 2; d < 4; ++d) {
    const uint32_t other = d == 2 ? 3 : 2;
    const uint64_t mine = d == 2 ? 0 : 256, theirs = d == 2 ? 256 : 0;  // staging offsets of rows 0..2 / 2..4
    p[d].rank = d;
    p[d].buffers = {{"u", D::fp32, {4, 32}}};
    p[d].fragments.push_back(MakeFragment(0, 0, 0, {0, 0}, {4, 32}, {32, 1}, 1));
    p[d].staging_bytes = 512;
    p[d].Step(MakeStep(K::recv, d - 2, kNone, kNone, mine, 256, D::fp32));
    p[d].Round();
    p[d].Step(MakeStep(K::forward, other, kNone, kNone, mine, 256, D::fp32, Channel::nvlink));
    p[d].Step(MakeStep(K::recv, other, kNone, kNone, theirs, 256, D::fp32, Channel::nvlink));
    // Rows 0..4 lie in staging in order; unpack them as one staging region.
    uint32_t stage = p[d].Region(StagingRegion(0, {4, 32}, {32, 1}));
    uint32_t dst = p[d].Region(MakeRegion(0, 0, {4, 32}, {32, 1}));
    p[d].Step(MakeStep(K::unpack, kNone, stage, dst, 0, 512, D::fp32));
  }
  spec.programs = p;
  return spec;
}

TEST(GlooTest, FourRanksWithForwardOverTwoRounds) {
  TempDir dir;
  std::vector<uint8_t> bytes = BuildPlan(ForwardPlan());
  ExpectAllSucceed(RunRanks(4, [&](int r) { return RunRank(bytes, r, dir.path()); }));
}

TEST(GlooTest, StatsCountBytesPerChannelAndRound) {
  TempDir dir;
  std::vector<uint8_t> bytes = BuildPlan(ForwardPlan());
  auto out = RunRanks(4, [&](int r) -> std::string {
    Plan plan = Plan::from_bytes(bytes, "p.rsplan");
    GlooOptions options;
    options.store_dir = dir.path();
    GlooTransport transport(static_cast<uint32_t>(r), 4, options);
    SyntheticRun run = RunSynthetic(plan, static_cast<uint32_t>(r), transport);
    if (r != 2) return "";
    const RunStats& s = run.stats;
    if (s.rounds.size() != 2) return "rounds " + std::to_string(s.rounds.size());
    if (s.channels[0].bytes_received != 256 || s.channels[1].bytes_received != 256 ||
        s.channels[1].bytes_sent != 256 || s.channels[0].bytes_sent != 0) {
      return "channel bytes";
    }
    if (s.rounds[1].bytes_local != 512 || s.steps != 4) return "round bytes";
    return "";
  });
  ExpectAllSucceed(out);
}

// Wraps a transport and kills the process when it is asked to post message
// `die_at` to any peer: a rank dying in the middle of a run.
class DyingTransport : public Transport {
 public:
  DyingTransport(Transport& inner, int die_at) : inner_(inner), die_at_(die_at) {}
  uint32_t rank() const override { return inner_.rank(); }
  uint32_t size() const override { return inner_.size(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  size_t post_send(uint32_t peer, uint64_t seq, const void* data, size_t bytes) override {
    if (posted_++ == die_at_) _exit(9);
    return inner_.post_send(peer, seq, data, bytes);
  }
  size_t post_recv(uint32_t peer, uint64_t seq, void* data, size_t bytes) override {
    if (posted_++ == die_at_) _exit(9);
    return inner_.post_recv(peer, seq, data, bytes);
  }
  void wait(size_t handle, Clock::time_point deadline) override { inner_.wait(handle, deadline); }
  void reset() override { inner_.reset(); }

 private:
  Transport& inner_;
  int die_at_;
  int posted_ = 0;
};

// Rank 3 dies as it posts its first message of round 1: rank 2 gets round 0
// done, then its recv from 3 fails within the 2 s timeout.
TEST(GlooTest, PeerDyingMidRunIsReported) {
  TempDir dir;
  std::vector<uint8_t> bytes = BuildPlan(ForwardPlan());
  auto out = RunRanks(
      4,
      [&](int r) -> std::string {
        Plan plan = Plan::from_bytes(bytes, "p.rsplan");
        GlooOptions options;
        options.store_dir = dir.path();
        options.timeout = std::chrono::milliseconds(2000);
        GlooTransport gloo(static_cast<uint32_t>(r), 4, options);
        DyingTransport dying(gloo, r == 3 ? 1 : -1);
        RunSynthetic(plan, static_cast<uint32_t>(r), dying);
        return "";
      },
      20);
  EXPECT_EQ(out[3].exit_code, 9);
  EXPECT_EQ(out[0].exit_code, 0) << out[0].message;
  EXPECT_EQ(out[1].exit_code, 0) << out[1].message;
  ASSERT_EQ(out[2].exit_code, 1) << out[2].message;
  EXPECT_LT(out[2].seconds, 8.0);
  // How Gloo words the failure depends on whether it saw the connection
  // close or only the silence; the rest of the message is fixed.
  std::regex want(
      "rank 2: step (1 \\(forward\\) of round 1 to|2 \\(recv\\) of round 1 from) peer 3 failed: (.+); none of its 1 "
      "destination buffers is completely written");
  EXPECT_TRUE(std::regex_match(out[2].message, want)) << out[2].message;
}

// Rank 1 stalls (never runs its program): rank 0 times out after 2 s.
TEST(GlooTest, StalledPeerTimesOut) {
  TempDir dir;
  std::vector<uint8_t> bytes = BuildPlan(PackAndDirectPlan());
  auto out = RunRanks(
      2,
      [&](int r) -> std::string {
        Plan plan = Plan::from_bytes(bytes, "p.rsplan");
        GlooOptions options;
        options.store_dir = dir.path();
        options.timeout = std::chrono::milliseconds(2000);
        GlooTransport gloo(static_cast<uint32_t>(r), 2, options);
        if (r == 1) {
          sleep(3);
          return "";
        }
        RunSynthetic(plan, 0, gloo);
        return "";
      },
      20);
  EXPECT_EQ(out[0].exit_code, 1);
  EXPECT_EQ(out[0].message,
            "rank 0: step 1 (send) of round 0 to peer 1 failed: timed out after 2.0 s sending 128 bytes; this rank has "
            "no destination buffers");
}

TEST(GlooTest, MissingRankFailsToConnect) {
  TempDir dir;
  GlooOptions options;
  options.store_dir = dir.path();
  options.timeout = std::chrono::milliseconds(1000);
  auto out = RunRanks(1, [&](int r) -> std::string {
    GlooTransport gloo(0, 2, options);
    return "";
  });
  EXPECT_EQ(out[0].exit_code, 1);
  EXPECT_EQ(out[0].message.rfind("rank 0: gloo: cannot connect 2 ranks through '" + dir.path() + "' within 1.0 s: ", 0),
            0u)
      << out[0].message;
}

}  // namespace
}  // namespace reshard
