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

// Where the tensors of a swap sit in a rank's buffers: the held one in
// buffer `held_buffer` from element 0, the received one in `got_buffer` from
// element `got`; row r of either at r * width, its elements `step` apart.
struct SwapLayout {
  std::vector<testing::BufferSpec> buffers;
  uint32_t held_buffer, got_buffer;
  uint64_t got;
  uint32_t width, step;
};

// Ranks 0 and 1 swap fp32 [rounds, kCols] tensors row by row: in round r
// each packs its row r into staging, sends it, receives the peer's row r and
// unpacks it. Steps are in plan order send-before-receive. `alternate`:
// round r uses staging arena r % 2 (as the compiler allocates); otherwise
// every round reuses the same bytes, and no phase may overlap another round.
PlanSpec Swap(uint32_t rounds, bool alternate, const std::vector<SwapLayout>& at) {
  PlanSpec spec;
  spec.tensors.push_back({"a", D::fp32, {0, 0}, {rounds, kCols}});
  spec.tensors.push_back({"b", D::fp32, {0, 0}, {rounds, kCols}});
  std::vector<ProgramSpec> p(2);
  const uint64_t row = kCols * 4;
  for (uint32_t k = 0; k < 2; ++k) {
    const SwapLayout& l = at[k];
    p[k].rank = k;
    p[k].buffers = l.buffers;
    p[k].fragments.push_back(MakeFragment(k, l.held_buffer, 0, {0, 0}, {rounds, kCols}, {l.width, l.step}, 0));
    p[k].fragments.push_back(MakeFragment(1 - k, l.got_buffer, l.got, {0, 0}, {rounds, kCols}, {l.width, l.step}, 1));
    p[k].staging_bytes = 4 * row;
    for (uint32_t r = 0; r < rounds; ++r) {
      const uint64_t base = alternate ? (r % 2) * 2 * row : 0;
      uint32_t src = p[k].Region(MakeRegion(l.held_buffer, uint64_t{r} * l.width, {kCols}, {l.step}));
      uint32_t dst = p[k].Region(MakeRegion(l.got_buffer, l.got + uint64_t{r} * l.width, {kCols}, {l.step}));
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

// Each rank's tensor and the peer's in two buffers of their own.
PlanSpec SwapPlan(uint32_t rounds, bool alternate) {
  std::vector<SwapLayout> at;
  for (uint32_t k = 0; k < 2; ++k)
    at.push_back({{{k == 0 ? "a" : "b", D::fp32, {rounds, kCols}}, {k == 0 ? "b" : "a", D::fp32, {rounds, kCols}}},
                  0, 1, 0, kCols, 1});
  return Swap(rounds, alternate, at);
}

// Both tensors in one buffer per rank, as a colocated GPU's flat buffer
// holds its training and inference weights. Apart: rank k holds its tensor
// in buffer rows [0, rounds) and receives the peer's into rows [rounds, 2
// rounds). Interleaved: the buffer is [rounds + 1, 2 kCols], the held tensor
// in the even columns of rows [0, rounds), the received one in the odd
// columns of rows [1, rounds + 1): round r's unpack and round r+1's pack
// touch different elements of buffer row r+1, but each one's span (the
// schedule's footprint) covers the other's.
PlanSpec OneBufferSwapPlan(uint32_t rounds, bool interleaved) {
  const uint32_t width = interleaved ? 2 * kCols : kCols;
  const SwapLayout l{{{"ab", D::fp32, {interleaved ? rounds + 1 : 2 * rounds, width}}},
                     0, 0, interleaved ? width + 1 : uint64_t{rounds} * kCols, width, interleaved ? 2u : 1u};
  return Swap(rounds, true, {l, l});
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

TEST(PipelineTest, DisjointPartsOfOneBufferOverlap) {
  // Round r unpacks into rows the next round's pack does not read: the
  // rounds pipeline as if they were two buffers (a schedule comparing whole
  // buffers would run them in series).
  Plan plan = Plan::from_bytes(BuildPlan(OneBufferSwapPlan(3, false)), "one.rsplan");
  PipelineSchedule s = SchedulePipeline(plan.program(0));
  EXPECT_EQ(s.early_pack, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(s.late_unpack, (std::vector<uint8_t>{1, 1, 0}));
  // And every element arrives: each rank's received rows hold the peer's tensor.
  const PlanSpec spec = OneBufferSwapPlan(3, false);
  TempDir dir;
  std::vector<uint8_t> bytes = BuildPlan(spec);
  auto res = RunRanks(2, [&](int r) -> std::string {
    Plan p = Plan::from_bytes(bytes, "one.rsplan");
    GlooOptions o;
    o.store_dir = dir.path();
    o.timeout = std::chrono::seconds(20);
    GlooTransport t(static_cast<uint32_t>(r), 2, o);
    const fb::Program& prog = p.program(static_cast<uint32_t>(r));
    const size_t half = 3 * kCols;
    std::vector<float> buf(2 * half, -1.0f);
    for (size_t i = 0; i < half; ++i) buf[i] = static_cast<float>(r * 1000000 + i);
    std::vector<char> staging(prog.staging_bytes());
    Executor ex(prog, t);
    if (ex.schedule().overlapped_packs != 2) return "the executor did not overlap both packs";
    ex.Run({reinterpret_cast<char*>(buf.data())}, staging.data());
    for (size_t i = 0; i < half; ++i) {
      if (buf[i] != static_cast<float>(r * 1000000 + i)) return "held element " + std::to_string(i) + " changed";
      if (buf[half + i] != static_cast<float>((1 - r) * 1000000 + i))
        return "received element " + std::to_string(i) + " wrong";
    }
    return "";
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(res[r].exit_code, 0) << res[r].message;
}

TEST(PipelineTest, InterleavedPartsOfOneBufferRunInSeries) {
  // The footprint of a strided region is its span: where one round's unpack
  // and the next round's pack interleave in one buffer row, they do not swap.
  Plan plan = Plan::from_bytes(BuildPlan(OneBufferSwapPlan(3, true)), "one.rsplan");
  PipelineSchedule s = SchedulePipeline(plan.program(0));
  EXPECT_EQ(s.overlapped_packs, 0u);
  EXPECT_EQ(s.overlapped_unpacks, 0u);
}

}  // namespace
}  // namespace reshard
