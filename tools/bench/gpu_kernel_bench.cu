// Throughput of the device copy path (runtime/cuda/) on large regions against
// a device-to-device cudaMemcpyAsync measured in the same run. GB/s counts
// bytes read plus bytes written. Run by tools/gpu-check.sh; needs a GPU.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "runtime/cuda/device_kernels.h"
#include "runtime/cuda/region_plan.h"
#include "runtime/plan.h"
#include "tools/bench/gpu_bench_check.h"

namespace {

using reshard::RegionView;
using D = reshard::fb::Dtype;


RegionView View(char* const* ptrs, std::vector<uint64_t> shape, std::vector<uint64_t> stride, D dtype,
                uint8_t buffer_modes = 0) {
  return reshard::cuda::ViewOver(ptrs, 0, shape, stride, dtype, buffer_modes);
}

// Milliseconds per call of `fn` on `stream`, the mean of 10 after 2 warm-ups.
double Time(cudaStream_t stream, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) fn();
  CHECK_CUDA(cudaEventRecord(a, stream));
  constexpr int kReps = 10;
  for (int i = 0; i < kReps; ++i) fn();
  CHECK_CUDA(cudaEventRecord(b, stream));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / kReps;
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("gpu_kernel_bench: no CUDA device, nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  reshard::cuda::DeviceKernels kernels(0, stream);
  constexpr size_t kBig = size_t{512} << 20;
  char *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, kBig));
  CHECK_CUDA(cudaMalloc(&b, kBig));
  CHECK_CUDA(cudaMemsetAsync(a, 0x3c, kBig, stream));
  // 256 expert buffers of 1 MiB inside `a`, for the buffer-selecting case.
  std::vector<char*> experts;
  for (int e = 0; e < 256; ++e) experts.push_back(a + (static_cast<size_t>(e) << 20));
  char* const pa[1] = {a};
  char* const pb[1] = {b};

  struct Row {
    std::string name;
    RegionView src, dst;
  };
  const uint64_t kRows = 8192;
  const std::vector<Row> rows = {
      {"pack 2-D bf16 (half the columns)", View(pa, {kRows, 8192}, {16384, 1}, D::bf16),
       View(pb, {kRows * 8192}, {1}, D::bf16)},
      {"pack 3-D bf16", View(pa, {4096, 4, 4096}, {65536, 16384, 1}, D::bf16),
       View(pb, {4096 * 4 * 4096}, {1}, D::bf16)},
      {"unpack 3-D bf16", View(pb, {4096 * 4 * 4096}, {1}, D::bf16),
       View(pa, {4096, 4, 4096}, {65536, 16384, 1}, D::bf16)},
      {"pack 2-D bf16 -> fp32", View(pa, {kRows, 4096}, {16384, 1}, D::bf16), View(pb, {kRows * 4096}, {1}, D::fp32)},
      {"unpack 2-D fp32 -> bf16", View(pb, {kRows * 4096}, {1}, D::fp32), View(pa, {kRows, 4096}, {16384, 1}, D::bf16)},
      {"transpose fp16 8192x8192", View(pa, {8192, 8192}, {1, 8192}, D::fp16), View(pb, {8192, 8192}, {8192, 1}, D::fp16)},
      {"pack 256 expert buffers bf16", View(experts.data(), {256, 256, 1024}, {1, 2048, 1}, D::bf16, 0b001),
       View(pb, {256 * 256 * 1024}, {1}, D::bf16)},
  };

  const size_t copy_bytes = size_t{256} << 20;
  const double copy_ms = Time(stream, [&] { CHECK_CUDA(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice, stream)); });
  const double copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  std::printf("device: %s\n", prop.name);
  std::printf("%-34s %-9s %10s %9s %9s\n", "case", "path", "MiB moved", "GB/s", "of d2d");
  std::printf("%-34s %-9s %10.0f %9.1f %8.0f%%\n", "cudaMemcpyAsync d2d", "memcpy", 2.0 * copy_bytes / (1 << 20),
              copy_gbs, 100.0);
  for (const Row& r : rows) {
    // Row copies twice: through the copy kernel (the default) and as
    // cudaMemcpy2DAsync.
    for (const bool memcpy2d : {false, true}) {
      const auto plan = reshard::cuda::PlanCopy(r.src, r.dst, memcpy2d);
      if (memcpy2d && plan.kind != reshard::cuda::CopyKind::kMemcpy2D) continue;
      kernels.set_memcpy2d(memcpy2d);
      const double bytes = static_cast<double>(reshard::ViewElements(r.src)) *
                           (reshard::DtypeSize(r.src.dtype) + reshard::DtypeSize(r.dst.dtype));
      const double ms = Time(stream, [&] { kernels.Copy(r.src, r.dst); });
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      std::printf("%-34s %-9s %10.0f %9.1f %8.0f%%\n", r.name.c_str(), reshard::cuda::CopyKindName(plan.kind),
                  bytes / (1 << 20), gbs, 100.0 * gbs / copy_gbs);
    }
  }
  kernels.set_memcpy2d(false);
  kernels.Finish();
  cudaFree(a);
  cudaFree(b);
  cudaStreamDestroy(stream);
  return 0;
}
