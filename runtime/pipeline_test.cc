// Receives posted first and rounds pipelined: the executor's order of posts,
// waits and local steps on a two-rank exchange over Gloo, the bytes it
// delivers, and the schedule's refusal to overlap phases that share staging.
#include "runtime/pipeline.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/gloo_transport.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using testing::BuildPlan;
using testing::MakeFragment;
using testing::MakeRegion;
using testing::MakeStep;
using testing::PlanSpec;
using testing::ProgramSpec;
using testing::RunRanks;
using testing::TempDir;
using K = fb::StepKind;
using D = fb::Dtype;

constexpr uint32_t kCols = 1024;

// Ranks 0 and 1 swap an fp32 [rounds, kCols] tensor row by row: in round r
// each packs its row r into staging, sends it, receives the peer's row r and
// unpacks it. Steps are in plan order send-before-receive. `alternate`:
// round r uses staging arena r % 2 (as the compiler allocates); otherwise
// every round reuses the same bytes, and no phase may overlap another round.
PlanSpec SwapPlan(uint32_t rounds, bool alternate) {
  PlanSpec spec;
  spec.tensors.push_back({"a", D::fp32, {0, 0}, {rounds, kCols}});
  spec.tensors.push_back({"b", D::fp32, {0, 0}, {rounds, kCols}});
  std::vector<ProgramSpec> p(2);
  const uint64_t row = kCols * 4;
  for (uint32_t k = 0; k < 2; ++k) {
    p[k].rank = k;
    p[k].buffers = {{k == 0 ? "a" : "b", D::fp32, {rounds, kCols}}, {k == 0 ? "b" : "a", D::fp32, {rounds, kCols}}};
    p[k].fragments.push_back(MakeFragment(k, 0, 0, {0, 0}, {rounds, kCols}, {kCols, 1}, 0));
    p[k].fragments.push_back(MakeFragment(1 - k, 1, 0, {0, 0}, {rounds, kCols}, {kCols, 1}, 1));
    p[k].staging_bytes = 4 * row;
    for (uint32_t r = 0; r < rounds; ++r) {
      const uint64_t base = alternate ? (r % 2) * 2 * row : 0;
      uint32_t src = p[k].Region(MakeRegion(0, uint64_t{r} * kCols, {kCols}, {1}));
      uint32_t dst = p[k].Region(MakeRegion(1, uint64_t{r} * kCols, {kCols}, {1}));
      p[k].Round();
      p[k].Step(MakeStep(K::pack, kNone, src, kNone, base, row, D::fp32));
      p[k].Step(MakeStep(K::send, 1 - k, kNone, kNone, base, row, D::fp32));
      p[k].Step(MakeStep(K::recv, 1 - k, kNone, kNone, base + row, row, D::fp32));
      p[k].Step(MakeStep(K::unpack, kNone, kNone, dst, base + row, row, D::fp32));
    }
  }
  spec.programs = p;
  return spec;
}

// CPU kernels that log each copy.
class LoggingKernels : public Kernels {
 public:
  explicit LoggingKernels(std::string& log) : log_(log) {}
  std::string name() const override { return "cpu"; }
  char* Allocate(size_t bytes) override { return CpuKernels().Allocate(bytes); }
  void Release(char* p) noexcept override { CpuKernels().Release(p); }
  void Copy(const RegionView& src, const RegionView& dst) override {
    log_ += "C ";
    CpuKernels().Copy(src, dst);
  }
  void Finish() override { CpuKernels().Finish(); }

 private:
  std::string& log_;
};

// Gloo, logging posts (R receive, S send), starts (.) and waits (W).
class LoggingGloo : public GlooTransport {
 public:
  LoggingGloo(uint32_t rank, const GlooOptions& o) : GlooTransport(rank, 2, o), kernels_(log) {}
  size_t post_send(uint32_t peer, uint64_t seq, const void* data, size_t bytes) override {
    log += "S ";
    return GlooTransport::post_send(peer, seq, data, bytes);
  }
  size_t post_recv(uint32_t peer, uint64_t seq, void* data, size_t bytes) override {
    log += "R ";
    return GlooTransport::post_recv(peer, seq, data, bytes);
  }
  void start() override { log += ". "; }
  void wait(size_t handle, Clock::time_point deadline) override {
    log += "W ";
    GlooTransport::wait(handle, deadline);
  }
  Kernels& kernels() override { return kernels_; }
  std::string log;

 private:
  LoggingKernels kernels_;
};

// Runs rank r of `bytes` over logging Gloo; returns its log, or "error: ...".
std::string RunLogged(const std::vector<uint8_t>& bytes, uint32_t r, const std::string& dir, uint32_t rounds) {
  Plan plan = Plan::from_bytes(bytes, "swap.rsplan");
  GlooOptions o;
  o.store_dir = dir;
  o.timeout = std::chrono::seconds(20);
  LoggingGloo t(r, o);
  const fb::Program& prog = plan.program(r);
  std::vector<float> src(rounds * kCols), dst(rounds * kCols, -1.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(r * 1000000 + i);
  std::vector<char> staging(prog.staging_bytes());
  Executor ex(prog, t);
  ex.Run({reinterpret_cast<char*>(src.data()), reinterpret_cast<char*>(dst.data())}, staging.data());
  for (size_t i = 0; i < dst.size(); ++i) {
    if (dst[i] != static_cast<float>((1 - r) * 1000000 + i)) return "error: element " + std::to_string(i) + " wrong";
  }
  return t.log;
}

std::vector<std::string> LogsOf(const PlanSpec& spec, uint32_t rounds) {
  TempDir dir;
  std::vector<uint8_t> bytes = BuildPlan(spec);
  std::vector<std::string> logs(2);
  TempDir out;
  auto res = RunRanks(2, [&](int r) -> std::string {
    std::string log = RunLogged(bytes, static_cast<uint32_t>(r), dir.path(), rounds);
    // The parent reads logs from files: the message channel is for failures.
    FILE* f = std::fopen((out.path() + "/" + std::to_string(r)).c_str(), "w");
    std::fputs(log.c_str(), f);
    std::fclose(f);
    return log.rfind("error", 0) == 0 ? log : "";
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(res[r].exit_code, 0) << res[r].message;
    std::ifstream in(out.path() + "/" + std::to_string(r));
    std::getline(in, logs[r]);
  }
  return logs;
}

TEST(PipelineTest, ReceivesFirstAndRoundsOverlapWhereArenasAlternate) {
  const PlanSpec spec = SwapPlan(3, true);
  Plan plan = Plan::from_bytes(BuildPlan(spec), "swap.rsplan");
  PipelineSchedule s = SchedulePipeline(plan.program(0));
  EXPECT_EQ(s.early_pack, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(s.late_unpack, (std::vector<uint8_t>{1, 1, 0}));
  // Round 0: pack, receive, send, start, pack 1 early, waits. Round 1: post,
  // unpack 0 late, pack 2 early, waits. Round 2: post, unpack 1, waits, unpack 2.
  const std::string want = "C R S . C W W R S . C C W W R S . C W W C ";
  for (const std::string& log : LogsOf(spec, 3)) EXPECT_EQ(log, want);
}

TEST(PipelineTest, SharedStagingRunsInSeries) {
  const PlanSpec spec = SwapPlan(3, false);
  Plan plan = Plan::from_bytes(BuildPlan(spec), "swap.rsplan");
  PipelineSchedule s = SchedulePipeline(plan.program(0));
  EXPECT_EQ(s.overlapped_packs, 0u);
  EXPECT_EQ(s.overlapped_unpacks, 0u);
  const std::string want = "C R S . W W C C R S . W W C C R S . W W C ";
  for (const std::string& log : LogsOf(spec, 3)) EXPECT_EQ(log, want);
}

TEST(PipelineTest, OffSwitchRunsInSeries) {
  const PlanSpec spec = SwapPlan(3, true);
  Plan plan = Plan::from_bytes(BuildPlan(spec), "swap.rsplan");
  PipelineSchedule s = SchedulePipeline(plan.program(0), false);
  EXPECT_EQ(s.overlapped_packs + s.overlapped_unpacks, 0u);
  setenv("RESHARD_PIPELINE", "0", 1);
  EXPECT_FALSE(PipelineEnabled());
  const std::string want = "C R S . W W C C R S . W W C C R S . W W C ";
  for (const std::string& log : LogsOf(spec, 3)) EXPECT_EQ(log, want);
  unsetenv("RESHARD_PIPELINE");
  EXPECT_TRUE(PipelineEnabled());
}

}  // namespace
}  // namespace reshard
