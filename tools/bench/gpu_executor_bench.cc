// The CUDA/NCCL executor on one GPU: a staged plan (pack, send, receive,
// unpack) replayed through NcclTransport in loopback (one-rank communicators,
// every message sent to this rank itself, runtime/cuda/loopback_plan.h's
// trick), pipelined (runtime/pipeline.h) and in series (RESHARD_PIPELINE=0),
// against the same bytes in as many raw NCCL send/recv groups on the same
// kind of communicator, and against the packs and unpacks alone. One GPU has
// no network: NCCL's self-sends are device copies that share HBM with the
// packs, so this measures the executor's overhead and overlap on a device,
// not a wire. Every number is the median of --reps runs after one warm-up;
// the destination is checked once. Run by tools/gpu-check.sh; needs a GPU.
//
// Usage: gpu_executor_bench [--mib M] [--rounds R] [--cols C] [--reps N]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "runtime/cuda/nccl_transport.h"
#include "runtime/cuda/region_plan.h"
#include "runtime/error.h"
#include "runtime/plan.h"
#include "runtime/session.h"
#include "runtime/test.h"
#include "tools/bench/gpu_bench_check.h"

namespace {

using reshard::kNone;
using reshard::fb::Dtype;
using reshard::fb::StepKind;
using reshard::testing::MakeRegion;
using reshard::testing::MakeStep;
using reshard::testing::PlanSpec;
using reshard::testing::ProgramSpec;
using Clock = std::chrono::steady_clock;

struct Config {
  uint64_t mib = 1024;  // bytes moved (left halves of the buffer)
  uint32_t rounds = 16;
  uint32_t cols = 4096;  // bf16 elements per half row
  int reps = 10;
};

// Both ranks alike (rank r's peer is 1 - r, looped back to r itself): each
// round packs the left halves of a slice of rows into the send half of
// staging arena r % 2, sends it, receives it into the arena's receive half
// and unpacks it into the right halves of the same rows.
PlanSpec StagedPlan(const Config& c) {
  const uint64_t bytes = c.mib << 20;
  const uint32_t rows = static_cast<uint32_t>(bytes / 2 / c.cols);
  const uint32_t per = rows / c.rounds;
  const uint64_t slice = uint64_t{per} * c.cols * 2;
  PlanSpec spec;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ProgramSpec p;
    p.rank = rank;
    p.buffers = {{"w", Dtype::bf16, {rows, 2ull * c.cols}}};
    p.staging_bytes = 4 * slice;
    for (uint32_t r = 0; r < c.rounds; ++r) {
      const uint64_t send_at = (r % 2) * 2 * slice, recv_at = send_at + slice;
      const uint64_t row0 = uint64_t{r} * per * 2 * c.cols;
      p.Round();
      const uint32_t left = p.Region(MakeRegion(0, row0, {per, c.cols}, {2 * c.cols, 1}));
      const uint32_t right = p.Region(MakeRegion(0, row0 + c.cols, {per, c.cols}, {2 * c.cols, 1}));
      p.Step(MakeStep(StepKind::pack, kNone, left, kNone, send_at, slice, Dtype::bf16));
      p.Step(MakeStep(StepKind::send, 1 - rank, kNone, kNone, send_at, slice, Dtype::bf16));
      p.Step(MakeStep(StepKind::recv, 1 - rank, kNone, kNone, recv_at, slice, Dtype::bf16));
      p.Step(MakeStep(StepKind::unpack, kNone, kNone, right, recv_at, slice, Dtype::bf16));
    }
    spec.programs.push_back(std::move(p));
  }
  return spec;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Median seconds of `fn` (which leaves the device idle) over reps, after one warm-up.
double Time(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  return Median(t);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: gpu_executor_bench [--mib M] [--rounds R] [--cols C] [--reps N]\n");
      return 2;
    }
    const unsigned long long v = std::strtoull(argv[++i], nullptr, 10);
    if (a == "--mib") c.mib = v;
    else if (a == "--rounds") c.rounds = static_cast<uint32_t>(v);
    else if (a == "--cols") c.cols = static_cast<uint32_t>(v);
    else if (a == "--reps") c.reps = static_cast<int>(v);
    else {
      std::fprintf(stderr, "gpu_executor_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("gpu_executor_bench: no CUDA device, nothing measured\n");
    return 0;
  }
  try {
    const reshard::Plan plan = reshard::Plan::from_bytes(reshard::testing::BuildPlan(StagedPlan(c)), "staged.rsplan");
    const reshard::fb::Program& prog = plan.program(0);
    const reshard::fb::Buffer* buf = prog.buffers()->Get(0);
    const uint64_t rows = buf->shape()->Get(0), width = buf->shape()->Get(1);
    const size_t buf_bytes = rows * width * 2;
    const size_t moved = rows * c.cols * 2;
    const size_t slice = moved / c.rounds;

    // The buffer: left halves hold their element index (mod 2^16), right halves zero.
    std::vector<uint16_t> host(rows * width, 0);
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t k = 0; k < c.cols; ++k) host[r * width + k] = static_cast<uint16_t>(r * 131 + k);
    }
    char* w = nullptr;
    CHECK_CUDA(cudaMalloc(&w, buf_bytes));
    CHECK_CUDA(cudaMemcpy(w, host.data(), buf_bytes, cudaMemcpyHostToDevice));

    auto piped_t = reshard::NcclTransport::Loopback(0, 0, 2, std::chrono::milliseconds(60000));
    reshard::Session piped(plan, 0, *piped_t);
    setenv("RESHARD_PIPELINE", "0", 1);
    auto serial_t = reshard::NcclTransport::Loopback(0, 0, 2, std::chrono::milliseconds(60000));
    reshard::Session serial(plan, 0, *serial_t);
    unsetenv("RESHARD_PIPELINE");
    const std::vector<uint64_t> shape = {rows, width};
    piped.bind("w", w, Dtype::bf16, shape);
    serial.bind("w", w, Dtype::bf16, shape);

    piped.run();
    std::vector<uint16_t> back(host.size());
    CHECK_CUDA(cudaMemcpy(back.data(), w, buf_bytes, cudaMemcpyDeviceToHost));
    uint64_t wrong = 0;
    const uint64_t used_rows = uint64_t{c.rounds} * (rows / c.rounds);
    for (uint64_t r = 0; r < used_rows; ++r) {
      for (uint64_t k = 0; k < c.cols; ++k) wrong += back[r * width + c.cols + k] != host[r * width + k];
    }
    if (wrong != 0) {
      std::fprintf(stderr, "gpu_executor_bench: %llu elements wrong after the staged plan\n",
                   static_cast<unsigned long long>(wrong));
      return 1;
    }

    const double t_piped = Time(c.reps, [&] { piped.run(); });
    const double t_serial = Time(c.reps, [&] { serial.run(); });

    // Raw NCCL: the same bytes, one send/recv-to-self group per round, on a
    // one-rank communicator; rounds enqueued back to back, then one sync.
    ncclUniqueId id;
    CHECK_NCCL(ncclGetUniqueId(&id));
    ncclComm_t comm;
    CHECK_NCCL(ncclCommInitRank(&comm, 1, id, 0));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    char *src = nullptr, *dst = nullptr;
    CHECK_CUDA(cudaMalloc(&src, moved));
    CHECK_CUDA(cudaMalloc(&dst, moved));
    auto raw = [&](bool sync_each) {
      for (uint32_t r = 0; r < c.rounds; ++r) {
        CHECK_NCCL(ncclGroupStart());
        CHECK_NCCL(ncclSend(src + r * slice, slice, ncclUint8, 0, comm, stream));
        CHECK_NCCL(ncclRecv(dst + r * slice, slice, ncclUint8, 0, comm, stream));
        CHECK_NCCL(ncclGroupEnd());
        if (sync_each) CHECK_CUDA(cudaStreamSynchronize(stream));
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
    };
    const double t_raw = Time(c.reps, [&] { raw(false); });
    const double t_raw_sync = Time(c.reps, [&] { raw(true); });

    // The packs and unpacks alone, through the transport's kernels.
    auto& k = static_cast<reshard::cuda::DeviceKernels&>(piped_t->kernels());
    char* const wp[1] = {w};
    char* const sp[1] = {src};
    const reshard::RegionView left =
        reshard::cuda::ViewOver(wp, 0, {used_rows, c.cols}, {width, 1}, Dtype::bf16);
    const reshard::RegionView right =
        reshard::cuda::ViewOver(wp, c.cols, {used_rows, c.cols}, {width, 1}, Dtype::bf16);
    const reshard::RegionView flat = reshard::cuda::ViewOver(sp, 0, {used_rows * c.cols}, {1}, Dtype::bf16);
    const double t_kernels = Time(c.reps, [&] {
      k.Copy(left, flat);
      k.Copy(flat, right);
      k.Finish();
    });

    cudaDeviceProp prop{};
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    const double gb = static_cast<double>(moved) / 1e9;
    std::printf("device: %s; staged plan: %.0f MiB in %u rounds of %.1f MiB (rows of %u bf16), median of %d\n",
                prop.name, moved / 1048576.0, c.rounds, slice / 1048576.0, c.cols, c.reps);
    std::printf("%-44s %9s %9s %9s\n", "case", "ms", "GB/s", "of raw");
    auto row = [&](const char* name, double t) {
      std::printf("%-44s %9.3f %9.1f %8.0f%%\n", name, t * 1e3, gb / t, 100.0 * t_raw / t);
    };
    row("raw NCCL self send/recv, rounds queued", t_raw);
    row("raw NCCL self send/recv, sync per round", t_raw_sync);
    row("staged plan, pipelined", t_piped);
    row("staged plan, in series (RESHARD_PIPELINE=0)", t_serial);
    row("packs + unpacks alone (no NCCL)", t_kernels);
    std::printf("pipelined / serial: %.2fx faster\n", t_serial / t_piped);
    {
      // The same pipelined plan on blocking communicators (ncclConfig_t.blocking
      // = 1, NCCL's default): no settling after each round's group.
      auto blocking_t = reshard::NcclTransport::Loopback(0, 0, 2, std::chrono::milliseconds(60000), true);
      reshard::Session blocking(plan, 0, *blocking_t);
      blocking.bind("w", w, Dtype::bf16, shape);
      row("staged plan, pipelined, blocking communicators", Time(c.reps, [&] { blocking.run(); }));
    }
    // Where a pipelined run's time goes, by its RunStats: rounds' messages
    // from posting to landing (host view), the rest (enqueueing kernels,
    // waiting for the last unpack).
    for (reshard::Session* s : {&piped, &serial}) {
      const reshard::RunStats st = s->run();
      double comm = 0;
      for (const auto& r : st.rounds) comm += r.comm_seconds;
      std::printf("%s run: %.3f ms, of which %.3f ms with a round's messages in flight (%.1f us a round)\n",
                  s == &piped ? "pipelined" : "serial", st.seconds * 1e3, comm * 1e3, comm * 1e6 / c.rounds);
    }
    // Host time of posting a round (the group, its settling) and of landing
    // it, apart: one round's messages at a time, through the transport alone.
    {
      auto& t = *piped_t;
      std::vector<double> post_us, land_us;
      for (int i = 0; i < 50; ++i) {
        const auto a = Clock::now();
        t.reset();
        const size_t hs = t.post(true, 0, 1, 0, src, slice);
        const size_t hr = t.post(false, 0, 1, 0, dst, slice);
        t.start();
        const auto b = Clock::now();
        t.wait(hs, b + std::chrono::seconds(60));
        t.wait(hr, b + std::chrono::seconds(60));
        const auto e = Clock::now();
        post_us.push_back(std::chrono::duration<double, std::micro>(b - a).count());
        land_us.push_back(std::chrono::duration<double, std::micro>(e - b).count());
      }
      t.reset();
      std::printf("one round through the transport (non-blocking): post %.1f us, land %.1f us (medians of 50)\n",
                  Median(post_us), Median(land_us));
    }

    ncclCommDestroy(comm);
    cudaFree(src);
    cudaFree(dst);
    cudaFree(w);
    cudaStreamDestroy(stream);
  } catch (const reshard::Error& e) {
    std::fprintf(stderr, "gpu_executor_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
