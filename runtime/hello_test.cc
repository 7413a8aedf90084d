// The hello at connect: ranks on different plans, or two processes on one
// plan rank, end on every rank with the same error before a run moves a byte.
#include "runtime/hello.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <regex>

#include "runtime/error.h"
#include "runtime/gloo_transport.h"
#include "runtime/session.h"
#include "runtime/synthetic.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using testing::BuildPlan;
using testing::ForwardPlan;
using testing::RunRanks;
using testing::TempDir;

Hello Make(uint64_t digest, uint32_t plan_rank, uint32_t transport_rank, const char* plan) {
  Hello h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, "RSHELLO1", 8);
  h.digest_hi = digest;
  h.digest_lo = digest * 3;
  h.plan_rank = plan_rank;
  h.transport_rank = transport_rank;
  h.num_plan_ranks = 4;
  h.pid = 100 + transport_rank;
  std::strcpy(h.host, "node7");
  std::strcpy(h.plan, plan);
  return h;
}

TEST(HelloTest, OnePlanDistinctRanksPasses) {
  std::vector<Hello> all;
  for (uint32_t r = 0; r < 4; ++r) all.push_back(Make(1, r, r, "a.rsplan"));
  EXPECT_EQ(CheckHellos(all), "");
}

TEST(HelloTest, DifferentPlansAreListedByRanks) {
  std::vector<Hello> all = {Make(1, 0, 0, "a.rsplan"), Make(1, 1, 1, "a.rsplan"), Make(2, 2, 2, "b.rsplan"),
                            Make(2, 3, 3, "b.rsplan"), Make(1, 4, 4, "a.rsplan")};
  EXPECT_EQ(CheckHellos(all),
            "the ranks do not run one plan: ranks 0, 1, 4 run 'a.rsplan' (content digest "
            "00000000000000010000000000000003, 4 plan ranks); ranks 2, 3 run 'b.rsplan' (content digest "
            "00000000000000020000000000000006, 4 plan ranks). Every rank must open the same plan file (compare "
            "`reshard show PLAN`'s content digest); nothing was sent");
}

TEST(HelloTest, TwoProcessesOnOnePlanRankAreNamed) {
  std::vector<Hello> all = {Make(1, 0, 0, "a.rsplan"), Make(1, 1, 1, "a.rsplan"), Make(1, 1, 2, "a.rsplan")};
  EXPECT_EQ(CheckHellos(all),
            "plan rank 1 is played by 2 processes: transport rank 1 (pid 101 on node7) and transport rank 2 (pid 102 "
            "on node7); each plan rank needs exactly one process; nothing was sent");
}

TEST(HelloTest, AStrangerIsNamed) {
  std::vector<Hello> all = {Make(1, 0, 0, "a.rsplan"), Make(1, 1, 1, "a.rsplan")};
  std::memset(all[1].magic, 'x', 8);
  EXPECT_EQ(CheckHellos(all),
            "transport rank(s) 1 sent no reshard hello (another program, or another reshard version, on that rank)");
}

TEST(HelloTest, TheDigestIsTheFilesContent) {
  std::vector<uint8_t> a = BuildPlan(ForwardPlan());
  testing::PlanSpec other = ForwardPlan();
  other.staging_limit = 1;
  Plan pa = Plan::from_bytes(a, "a.rsplan"), pa2 = Plan::from_bytes(a, "copy.rsplan"),
       pb = Plan::from_bytes(BuildPlan(other), "b.rsplan");
  EXPECT_FALSE(pa.carries_content_digest());
  EXPECT_EQ(pa.content_digest(), pa2.content_digest());
  EXPECT_NE(pa.content_digest(), pb.content_digest());
  EXPECT_EQ(pa.content_digest().hex().size(), 32u);
}

// Ranks 0-1 open one plan, ranks 2-3 another of the same shape: every rank
// ends with the same error at connect, fast, and none runs a step.
TEST(HelloTest, RanksOnDifferentPlansAllFailAtConnect) {
  TempDir dir;
  testing::PlanSpec other = ForwardPlan();
  other.staging_limit = 1;
  std::vector<uint8_t> a = BuildPlan(ForwardPlan()), b = BuildPlan(other);
  const std::string da = Plan::from_bytes(a, "a").content_digest().hex(),
                    db = Plan::from_bytes(b, "b").content_digest().hex();
  auto out = RunRanks(
      4,
      [&](int r) -> std::string {
        Plan plan = Plan::from_bytes(r < 2 ? a : b, r < 2 ? "a.rsplan" : "b.rsplan");
        GlooOptions options;
        options.store_dir = dir.path();
        options.timeout = std::chrono::milliseconds(10000);
        GlooTransport gloo(static_cast<uint32_t>(r), 4, options);
        RunSynthetic(plan, static_cast<uint32_t>(r), gloo);
        return "ran";
      },
      30);
  const std::string a_first = "ranks 0, 1 run 'a.rsplan' (content digest " + da + ", 4 plan ranks); ranks 2, 3 run "
                              "'b.rsplan' (content digest " + db + ", 4 plan ranks)";
  const std::string b_first = "ranks 2, 3 run 'b.rsplan' (content digest " + db + ", 4 plan ranks); ranks 0, 1 run "
                              "'a.rsplan' (content digest " + da + ", 4 plan ranks)";
  const std::string list = da < db ? a_first : b_first;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(out[r].exit_code, 1) << r;
    EXPECT_EQ(out[r].message, "rank " + std::to_string(r) + ": the ranks do not run one plan: " + list +
                                  ". Every rank must open the same plan file (compare `reshard show PLAN`'s content "
                                  "digest); nothing was sent");
    EXPECT_LT(out[r].seconds, 5.0) << r;
  }
}

}  // namespace
}  // namespace reshard
