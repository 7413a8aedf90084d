// GPU tests (ctest label `gpu`): the device kernels against the CPU reference
// on fresh random data, and a plan replayed through one-rank NCCL
// communicators (loopback), every byte checked. Each skips without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "runtime/cuda/device_kernels.h"
#include "runtime/cuda/loopback_plan.h"
#include "runtime/cuda/nccl_transport.h"
#include "runtime/cuda/region_plan.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/quant.h"
#include "runtime/session.h"
#include "runtime/synthetic.h"

namespace reshard {
namespace {

using D = fb::Dtype;
using cuda::CopyKind;

std::string NoDevice() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  }
  return n == 0 ? "no CUDA device" : "";
}

#define REQUIRE_GPU()                                                                 \
  do {                                                                                \
    const std::string why = NoDevice();                                               \
    if (!why.empty()) GTEST_SKIP() << "GPU test skipped: " << why;                    \
  } while (0)

void Check(cudaError_t e) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + cudaGetErrorString(e));
}

// `count` device buffers of `bytes` each with host mirrors and a pointer table
// for each side.
struct Buffers {
  size_t bytes;
  std::vector<std::vector<char>> host;
  std::vector<char*> host_ptrs, dev_ptrs;

  Buffers(size_t count, size_t bytes_each) : bytes(bytes_each), host(count, std::vector<char>(bytes_each)) {
    for (auto& h : host) {
      host_ptrs.push_back(h.data());
      void* d = nullptr;
      Check(cudaMalloc(&d, bytes_each));
      dev_ptrs.push_back(static_cast<char*>(d));
    }
  }
  ~Buffers() {
    for (char* d : dev_ptrs) cudaFree(d);
  }
  // FP8 NaN (0x7f) everywhere: never the quantization of a finite value.
  void Poison() {
    for (auto& h : host) std::memset(h.data(), 0x7f, h.size());
  }
  void Upload() {
    for (size_t i = 0; i < host.size(); ++i) Check(cudaMemcpy(dev_ptrs[i], host[i].data(), bytes, cudaMemcpyHostToDevice));
  }
  std::vector<char> Download() const {
    std::vector<char> out(host.size() * bytes);
    for (size_t i = 0; i < host.size(); ++i) {
      Check(cudaMemcpy(out.data() + i * bytes, dev_ptrs[i], bytes, cudaMemcpyDeviceToHost));
    }
    return out;
  }
  std::vector<char> Host() const {
    std::vector<char> out;
    for (const auto& h : host) out.insert(out.end(), h.begin(), h.end());
    return out;
  }
};

using cuda::ViewOver;

struct Case {
  const char* name;
  size_t src_count, src_bytes;
  uint64_t src_offset;
  std::vector<uint64_t> src_shape, src_stride;
  D src_dtype;
  uint8_t src_modes;
  size_t dst_count, dst_bytes;
  uint64_t dst_offset;
  std::vector<uint64_t> dst_shape, dst_stride;
  D dst_dtype;
  uint8_t dst_modes;
  CopyKind kind;
};

// Random source bits, a poisoned destination on both sides; the device copy
// must equal CopyRegion's byte for byte, and must have written something.
void RunCase(const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.name);
  std::mt19937_64 rng(seed);
  Buffers src(c.src_count, c.src_bytes), dst(c.dst_count, c.dst_bytes);
  for (auto& h : src.host) {
    for (char& b : h) b = static_cast<char>(rng());
  }
  for (auto& h : dst.host) std::memset(h.data(), 0x7d, h.size());
  src.Upload();
  dst.Upload();
  const std::vector<char> poisoned = dst.Host();
  CopyRegion(ViewOver(src.host_ptrs.data(), c.src_offset, c.src_shape, c.src_stride, c.src_dtype, c.src_modes),
             ViewOver(dst.host_ptrs.data(), c.dst_offset, c.dst_shape, c.dst_stride, c.dst_dtype, c.dst_modes));
  const std::vector<char> want = dst.Host();
  ASSERT_NE(want, poisoned);
  ASSERT_NE(want, std::vector<char>(want.size(), 0));

  cudaStream_t stream;
  Check(cudaStreamCreate(&stream));
  cuda::DeviceKernels kernels(0, stream);
  const bool memcpy2d = c.kind == CopyKind::kMemcpy2D;  // only on request (region_plan.h)
  kernels.set_memcpy2d(memcpy2d);
  RegionView s = ViewOver(src.dev_ptrs.data(), c.src_offset, c.src_shape, c.src_stride, c.src_dtype, c.src_modes);
  RegionView d = ViewOver(dst.dev_ptrs.data(), c.dst_offset, c.dst_shape, c.dst_stride, c.dst_dtype, c.dst_modes);
  EXPECT_EQ(cuda::CopyKindName(cuda::PlanCopy(s, d, memcpy2d).kind), cuda::CopyKindName(c.kind));
  kernels.Copy(s, d);
  kernels.Finish();
  Check(cudaStreamDestroy(stream));
  const std::vector<char> got = dst.Download();
  size_t wrong = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      ++wrong;
      first = std::min(first, i);
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << got.size() << " bytes, first at byte " << first;
}

TEST(GpuKernelTest, EveryCopyKindMatchesTheCpuReference) {
  REQUIRE_GPU();
  const Case cases[] = {
      {"contiguous", 1, 1 << 20, 0, {1 << 18}, {1}, D::fp32, 0, 1, 1 << 20, 0, {1 << 18}, {1}, D::fp32, 0,
       CopyKind::kMemcpy},
      {"rows (2-D), cudaMemcpy2DAsync", 1, 2048 * 1024 * 2, 64, {2048, 512}, {1024, 1}, D::bf16, 0, 1,
       2048 * 512 * 2, 0, {2048 * 512}, {1}, D::bf16, 0, CopyKind::kMemcpy2D},
      {"rows (2-D), kernel", 1, 2048 * 1024 * 2, 64, {2048, 512}, {1024, 1}, D::bf16, 0, 1, 2048 * 512 * 2, 0,
       {2048 * 512}, {1}, D::bf16, 0, CopyKind::kKernel},
      {"pack bf16 -> fp32", 1, 2048 * 1024 * 2, 256, {2048, 512}, {1024, 1}, D::bf16, 0, 1, 2048 * 512 * 4, 0,
       {2048 * 512}, {1}, D::fp32, 0, CopyKind::kKernel},
      {"unpack fp32 -> fp16", 1, 1000 * 300 * 4, 0, {300000}, {1}, D::fp32, 0, 1, 1000 * 640 * 2, 8, {1000, 300},
       {640, 1}, D::fp16, 0, CopyKind::kKernel},
      {"transpose fp16", 1, 512 * 384 * 2, 0, {384, 512}, {1, 384}, D::fp16, 0, 1, 512 * 384 * 2, 0, {384, 512},
       {512, 1}, D::fp16, 0, CopyKind::kKernel},
      {"4-d fp32 -> bf16", 1, 8 * 6 * 40 * 64 * 4, 3, {8, 6, 40, 48}, {6 * 40 * 64, 40 * 64, 64, 1}, D::fp32, 0, 1,
       8 * 6 * 40 * 48 * 2, 0, {6, 8, 40, 48}, {40 * 48, 6 * 40 * 48, 48, 1}, D::bf16, 0, CopyKind::kKernel},
      {"100 expert buffers -> staging", 100, 16 * 256 * 2, 256, {100, 8, 256}, {1, 256, 1}, D::bf16, 0b001, 1,
       100 * 8 * 256 * 2, 0, {100 * 8 * 256}, {1}, D::bf16, 0, CopyKind::kKernel},
      {"staging -> innermost buffer mode", 1, 64 * 100 * 4, 0, {64, 100}, {100, 1}, D::fp32, 0, 100, 64 * 2, 0,
       {64, 100}, {1, 1}, D::bf16, 0b10, CopyKind::kKernel},
  };
  uint64_t seed = std::random_device{}();
  for (const Case& c : cases) RunCase(c, seed++);
}

// Random bf16 values over a wide range of magnitudes in every buffer of `b`.
void FillBf16(Buffers& b, std::mt19937_64& rng) {
  for (auto& h : b.host) {
    for (size_t i = 0; i + 2 <= h.size(); i += 2) {
      const float f = std::ldexp(static_cast<float>(rng() % 2001) - 1000.0f, static_cast<int>(rng() % 40) - 20);
      const uint16_t v = FloatToBf16(f);
      std::memcpy(h.data() + i, &v, 2);
    }
  }
}

// Block-scaled FP8 on the device against the CPU reference (QuantRegion):
// 2 experts in 2 buffers (a buffer mode) of 300 x 520 bf16 values in blocks
// of 128x128 (partial at both edges); the destination keeps rows 64..264,
// cols 128..512; then dequantized back. Every FP8 byte, scale and value
// compared, for fp32 and e8m0 scales.
TEST(GpuKernelTest, QuantizeAndDequantizeMatchTheCpuReference) {
  REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  for (D scale_dtype : {D::fp32, D::e8m0}) {
    SCOPED_TRACE(DtypeName(scale_dtype));
    const size_t ss = DtypeSize(scale_dtype);
    Buffers src(2, 300 * 520 * 2), q(2, 200 * 384), sc(2, 3 * 5 * ss), back(2, 200 * 384 * 4);
    FillBf16(src, rng);
    for (Buffers* b : {&q, &sc, &back}) b->Poison();
    for (Buffers* b : {&src, &q, &sc, &back}) b->Upload();
    auto args = [&](bool device) {
      QuantArgs a;
      auto ptrs = [&](Buffers& b) { return device ? b.dev_ptrs.data() : b.host_ptrs.data(); };
      a.src = ViewOver(ptrs(src), 0, {2, 300, 520}, {1, 520, 1}, D::bf16, 1);
      a.dst = ViewOver(ptrs(q), 0, {2, 200, 384}, {1, 384, 1}, D::fp8_e4m3, 1);
      a.scale = ViewOver(ptrs(sc), 0, {2, 3, 5}, {1, 5, 1}, scale_dtype, 1);
      a.block[0] = a.block[1] = 128;
      a.origin[0] = 64, a.origin[1] = 128;
      QuantArgs d;
      d.kind = fb::QuantKind::dequantize;
      d.src = a.dst;
      d.dst = ViewOver(ptrs(back), 0, {2, 200, 384}, {1, 384, 1}, D::fp32, 1);
      d.scale = ViewOver(ptrs(sc), 1, {2, 3, 3}, {1, 5, 1}, scale_dtype, 1);
      d.block[0] = d.block[1] = 128;
      d.origin[0] = 64, d.origin[1] = 0;
      return std::pair{a, d};
    };
    auto [ha, hd] = args(false);
    QuantRegion(ha);
    QuantRegion(hd);
    cudaStream_t stream;
    Check(cudaStreamCreate(&stream));
    cuda::DeviceKernels kernels(0, stream);
    auto [da, dd] = args(true);
    kernels.Quant(da);
    kernels.Quant(dd);
    kernels.Finish();
    Check(cudaStreamDestroy(stream));
    EXPECT_EQ(q.Download(), q.Host());
    EXPECT_EQ(sc.Download(), sc.Host());
    EXPECT_EQ(back.Download(), back.Host());
    const std::vector<char> fp8 = q.Host();
    EXPECT_EQ(std::count(fp8.begin(), fp8.end(), 0x7f), 0);  // every kept value written
  }
}

// The amax path on the device against the CPU reference: partial amaxes of
// two halves (cols 0..260 and 260..520) of 2 experts' 300 x 520 bf16 values
// over one grid of per-channel blocks (1 x 520) each, the scales of the
// largest, then rows 64..264 quantized with them. Every amax, scale and FP8
// byte compared, for fp32 and e8m0 scales.
TEST(GpuKernelTest, AmaxKindsMatchTheCpuReference) {
  REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  for (D scale_dtype : {D::fp32, D::e8m0}) {
    SCOPED_TRACE(DtypeName(scale_dtype));
    const size_t ss = DtypeSize(scale_dtype);
    Buffers src(2, 300 * 520 * 2), grids(2, 2 * 300 * 4), sc(2, 300 * ss), q(2, 200 * 520);
    FillBf16(src, rng);
    for (Buffers* b : {&grids, &sc, &q}) b->Poison();
    for (Buffers* b : {&src, &grids, &sc, &q}) b->Upload();
    auto run = [&](bool device, Kernels& k) {
      auto ptrs = [&](Buffers& b) { return device ? b.dev_ptrs.data() : b.host_ptrs.data(); };
      for (int half = 0; half < 2; ++half) {
        QuantArgs a;
        a.kind = fb::QuantKind::amax;
        a.src = ViewOver(ptrs(src), 260 * half, {2, 300, 260}, {1, 520, 1}, D::bf16, 1);
        a.dst = ViewOver(ptrs(grids), 300 * half, {2, 300, 1}, {1, 1, 1}, D::fp32, 1);
        a.origin[1] = 260 * half;
        a.block[0] = 1, a.block[1] = 520;
        k.Quant(a);
      }
      QuantArgs s;
      s.kind = fb::QuantKind::scale_from_amax;
      s.src = ViewOver(ptrs(grids), 0, {2, 2, 300, 1}, {300, 1, 1, 1}, D::fp32, 2);
      s.dst = ViewOver(ptrs(sc), 0, {2, 300, 1}, {1, 1, 1}, scale_dtype, 1);
      s.block[0] = 1, s.block[1] = 520;
      k.Quant(s);
      QuantArgs z;
      z.kind = fb::QuantKind::quantize_scaled;
      z.src = ViewOver(ptrs(src), 64 * 520, {2, 200, 520}, {1, 520, 1}, D::bf16, 1);
      z.dst = ViewOver(ptrs(q), 0, {2, 200, 520}, {1, 520, 1}, D::fp8_e4m3, 1);
      z.scale = ViewOver(ptrs(sc), 64, {2, 200, 1}, {1, 1, 1}, scale_dtype, 1);
      z.block[0] = 1, z.block[1] = 520;
      k.Quant(z);
    };
    run(false, CpuKernels());
    cudaStream_t stream;
    Check(cudaStreamCreate(&stream));
    cuda::DeviceKernels kernels(0, stream);
    run(true, kernels);
    kernels.Finish();
    Check(cudaStreamDestroy(stream));
    EXPECT_EQ(grids.Download(), grids.Host());
    EXPECT_EQ(sc.Download(), sc.Host());
    EXPECT_EQ(q.Download(), q.Host());
    const std::vector<char> fp8 = q.Host();
    EXPECT_EQ(std::count(fp8.begin(), fp8.end(), 0x7f), 0);  // every value written
  }
}

TEST(GpuKernelTest, HostMemoryIsRefusedAtBind) {
  REQUIRE_GPU();
  Plan plan = Plan::from_bytes(testing::BuildPlan(testing::LoopbackPlan()), "loopback.rsplan");
  auto transport = NcclTransport::Loopback(0, 0, 2, std::chrono::milliseconds(10000));
  Session session(plan, 0, *transport);
  std::vector<uint16_t> w(64 * 96);
  try {
    session.bind("w", w.data(), D::bf16, {64, 96});
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 0: buffer 'w' is host memory; a session on cuda:0 binds device memory");
  }
}

// Device buffers for every program buffer, sources filled and destinations
// poisoned on the host as `reshard run` does, then uploaded.
struct DeviceRun {
  std::vector<std::vector<char>> host;
  std::vector<char*> host_ptrs, dev;

  DeviceRun(const Plan& plan, const fb::Program& p) {
    for (const fb::Buffer* b : *p.buffers()) {
      host.emplace_back(BufferElements(*b) * DtypeSize(b->dtype()));
      void* d = nullptr;
      Check(cudaMalloc(&d, host.back().size()));
      dev.push_back(static_cast<char*>(d));
    }
    for (auto& h : host) host_ptrs.push_back(h.data());
    PoisonDestinations(p, host_ptrs);
    FillSources(plan, p, host_ptrs);
    for (size_t i = 0; i < host.size(); ++i) {
      Check(cudaMemcpy(dev[i], host[i].data(), host[i].size(), cudaMemcpyHostToDevice));
    }
  }
  ~DeviceRun() {
    for (char* d : dev) cudaFree(d);
  }
  void Bind(Session& s, const fb::Program& p) {
    for (size_t i = 0; i < dev.size(); ++i) {
      const fb::Buffer* b = p.buffers()->Get(i);
      s.bind(b->name()->str(), dev[i], b->dtype(), std::vector<uint64_t>(b->shape()->begin(), b->shape()->end()));
    }
  }
  void Download() {
    for (size_t i = 0; i < host.size(); ++i) {
      Check(cudaMemcpy(host[i].data(), dev[i], host[i].size(), cudaMemcpyDeviceToHost));
    }
  }
};

TEST(GpuNcclTest, LoopbackPlanReplaysWithEveryElementRight) {
  REQUIRE_GPU();
  Plan plan = Plan::from_bytes(testing::BuildPlan(testing::LoopbackPlan()), "loopback.rsplan");
  const fb::Program& p = plan.program(0);
  auto transport = NcclTransport::Loopback(0, 0, 2, std::chrono::milliseconds(20000));
  Session session(plan, 0, *transport);
  DeviceRun run(plan, p);
  run.Bind(session, p);
  for (int rep = 0; rep < 2; ++rep) {  // a second run reuses staging and sequence numbers
    RunStats stats = session.run();
    EXPECT_EQ(stats.channels[0].bytes_sent, 4096u + 12288 + 2048);
    EXPECT_EQ(stats.channels[1].bytes_received, 3072u + 2048);
    run.Download();
    CheckResult check = CheckDestinations(plan, p, run.host_ptrs);
    EXPECT_EQ(check.checked, 64u * 32 + 16 * 96 + 48 * 64 + 64 * 16 + 1024 + 64 * 8);
    EXPECT_EQ(check.wrong, 0u) << (check.first.empty() ? "" : FormatWrong(check.first[0]));
  }
}

TEST(GpuNcclTest, MissingPeerAbortsTheCommunicatorsAndNamesTheStep) {
  REQUIRE_GPU();
  // Rank 2 of the forward plan receives from rank 0 in round 0; looped back,
  // nothing is ever sent to it. NCCL 2.28 (the H200 machines' PyTorch 2.11)
  // sees a receive from self without a send in the group and refuses it at
  // ncclGroupEnd; older NCCLs post it and the round times out. Either way the
  // communicators are aborted and the error names the step, round and peer.
  Plan plan = Plan::from_bytes(testing::BuildPlan(testing::ForwardPlan()), "forward.rsplan");
  const fb::Program& p = plan.program(2);
  auto transport = NcclTransport::Loopback(0, 2, 4, std::chrono::milliseconds(1000));
  Session session(plan, 2, *transport);
  DeviceRun run(plan, p);
  run.Bind(session, p);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    session.run();
    FAIL();
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string head = "rank 2: step 0 (recv) of round 0 from peer 0 failed: ";
    const std::string tail = "the communicators were aborted; none of its 1 destination buffers is completely written";
    ASSERT_EQ(what.substr(0, head.size()), head) << what;
    ASSERT_GE(what.size(), head.size() + tail.size()) << what;
    EXPECT_EQ(what.substr(what.size() - tail.size()), tail) << what;
    const std::string cause = what.substr(head.size(), what.size() - head.size() - tail.size());
    const bool timed_out = cause == "timed out after 1.0 s receiving 256 bytes; ";
    const bool refused = cause.rfind("nccl: invalid usage", 0) == 0 &&
                         cause.find("Trying to recv to self without a matching send") != std::string::npos;
    EXPECT_TRUE(timed_out || refused) << "cause: " << cause;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_TRUE(transport->aborted());
  try {
    session.run();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aborted after an earlier failure"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace reshard
