// Plans with idle ranks (GPUs of partly used NVLink domains that neither side
// uses): a job launches one process per active rank, process i playing plan
// rank active_ranks()[i] over a transport of the active ranks only.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <regex>

#include "runtime/error.h"
#include "runtime/gloo_transport.h"
#include "runtime/rank_map.h"
#include "runtime/session.h"
#include "runtime/synthetic.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using testing::RunRanks;
using testing::Shell;
using testing::ShellResult;
using testing::TempDir;

const std::string kBinary = RESHARD_BINARY;
const std::string kSource = RESHARD_SOURCE_DIR;

// tiny-dense from a 4-rank side to a 4-rank side on 8-GPU domains with
// disjoint placement: plan ranks 0-3 train, 4-7 idle, 8-11 infer.
std::string CompileIdlePlan(const TempDir& dir) {
  const std::string s = kSource + "/samples/tiny-dense/";
  ShellResult r = Shell(kBinary + " compile --model " + s + "model.json --from " + s + "infer-tp2-dp2.json --to " + s +
                        "infer-tp1-dp4.json --cluster " + kSource + "/tests/data/nvl8-spares.json -o " +
                        dir.File("idle.rsplan"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return dir.File("idle.rsplan");
}

// Eight processes over a transport of the active ranks, process p playing
// plan rank `plan_rank(plan, p)`; what each reported.
std::vector<testing::RankOutcome> RunActive(const std::string& path,
                                            const std::function<uint32_t(const Plan&, int)>& plan_rank) {
  TempDir rdzv;
  return RunRanks(
      8,
      [&](int process) -> std::string {
        Plan plan = Plan::open(path);
        GlooOptions o;
        o.rendezvous = rdzv.path();
        o.timeout = std::chrono::milliseconds(20000);
        GlooTransport gloo(static_cast<uint32_t>(process), 8, o);
        SyntheticRun run = RunSynthetic(plan, plan_rank(plan, process), gloo);
        return run.check.wrong == 0 ? "" : "wrong elements";
      },
      60);
}

TEST(IdleRanksTest, ThePlanNamesItsActiveRanks) {
  TempDir dir;
  Plan plan = Plan::open(CompileIdlePlan(dir));
  EXPECT_EQ(plan.num_ranks(), 12u);
  EXPECT_EQ(plan.active_ranks(), (std::vector<uint32_t>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(plan.process_of(9), 5);
  EXPECT_EQ(plan.process_of(5), -1);
  ShellResult r = Shell(kBinary + " show " + dir.File("idle.rsplan") + " --top 0");
  EXPECT_NE(r.out.find("  processes: 8 for the 8 active ranks (4 idle ranks need none); a transport over the active "
                       "ranks: process i plays plan rank Plan.active_ranks[i]: processes 0-3: plan ranks 0-3 (train "
                       "0-3); processes 4-7: plan ranks 8-11 (infer 0-3)\n"),
            std::string::npos)
      << r.out;
}

TEST(IdleRanksTest, RunLaunchesOnlyTheActiveRanks) {
  TempDir dir;
  ShellResult r = Shell(kBinary + " run " + CompileIdlePlan(dir) + " --local --timeout 20");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("ranks:   8, 0 failed, 4 idle ranks need no process\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", 0 wrong\n"), std::string::npos) << r.out;
  // A range of idle ranks only has nothing to run.
  r = Shell(kBinary + " run " + dir.File("idle.rsplan") + " --ranks 4-7 --rendezvous " + dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(r.out, "reshard: error: --ranks 4-7: every one of these plan ranks is idle (no side, buffers or steps): "
                   "nothing to run here\n");
}

// Sessions over a transport of the active ranks move every element right;
// every process plays active_ranks()[its transport rank].
TEST(IdleRanksTest, SessionsOverTheActiveRanksOnly) {
  TempDir dir;
  auto out = RunActive(CompileIdlePlan(dir), [](const Plan& plan, int p) { return plan.active_ranks()[p]; });
  for (int p = 0; p < 8; ++p) EXPECT_EQ(out[p].exit_code, 0) << p << ": " << out[p].message;
}

// A process that plays the wrong plan rank for its transport rank: every
// process ends at the hello with the same message, nothing sent.
TEST(IdleRanksTest, AProcessOnTheWrongPlanRankEndsEveryRank) {
  TempDir dir;
  // The launcher's bug: process i as plan rank i (4 and 5 are idle ranks).
  auto out = RunActive(CompileIdlePlan(dir), [](const Plan&, int p) { return static_cast<uint32_t>(p); });
  for (int p = 0; p < 8; ++p) {
    EXPECT_TRUE(std::regex_match(out[p].message,
                                 std::regex("rank " + std::to_string(p) +
                                            ": transport rank 4 \\(pid [0-9]+ on .*\\) plays plan rank 4, but on a "
                                            "transport over the plan's 8 active ranks it must play plan rank 8 "
                                            "\\(process i plays Plan.active_ranks\\[i\\]\\); nothing was sent")))
        << p << ": " << out[p].message;
    EXPECT_LT(out[p].seconds, 10.0);
  }
}

using Silent = testing::NoTransport;  // cannot gather: the local checks speak

TEST(IdleRanksTest, MismatchesSayWhichProcessPlaysWhichRank) {
  TempDir dir;
  Plan plan = Plan::open(CompileIdlePlan(dir));
  EXPECT_EQ(RankMismatch(plan, 9, Silent(5, 8)), "");
  EXPECT_EQ(RankMismatch(plan, 9, Silent(9, 12)), "");
  EXPECT_EQ(RankMismatch(plan, 5, Silent(5, 8)),
            "plan rank 5 is idle (no side, buffers or steps): it needs no process; the transport's 8 ranks are the "
            "plan's active ranks, and transport rank 5 plays plan rank 9");
  EXPECT_EQ(RankMismatch(plan, 8, Silent(5, 8)),
            "on a transport over the plan's 8 active ranks, plan rank 8 is transport rank 4 and transport rank 5 "
            "plays plan rank 9 (process i plays Plan.active_ranks[i])");
  EXPECT_EQ(RankMismatch(plan, 8, Silent(5, 10)),
            "the transport connects 10 ranks, the plan has 12 ranks, 8 of them active (a transport connects every "
            "plan rank, or only the active ones: Plan.active_ranks)");
}

}  // namespace
}  // namespace reshard
