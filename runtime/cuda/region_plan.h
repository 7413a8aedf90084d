// How a region copy (pack, unpack, copy) runs on a device, decided on the
// host: nothing, one cudaMemcpyAsync (contiguous on both sides, one dtype), or
// launches of the strided copy kernel (copy_launch.h); rows of one dtype may
// go to cudaMemcpy2DAsync instead, which on an H200 moves them much slower
// than the kernel (tools/bench/gpu_kernel_bench.cu measures both), so only
// when asked. Plain C++: the CPU tests check every
// decision and run the kernel's launches on the host against CopyRegion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/cuda/copy_launch.h"
#include "runtime/cuda/quant_launch.h"
#include "runtime/kernels.h"

namespace reshard::cuda {

enum class CopyKind { kNone, kMemcpy, kMemcpy2D, kKernel };

/// "none", "memcpy", "memcpy2d", "kernel".
const char* CopyKindName(CopyKind k);

struct CopyPlan {
  CopyKind kind = CopyKind::kNone;
  /// kMemcpy: `width` bytes from src to dst (height 1). kMemcpy2D: `height`
  /// rows of `width` bytes, row r at src + r*spitch and dst + r*dpitch.
  char* dst = nullptr;
  const char* src = nullptr;
  size_t dpitch = 0, spitch = 0, width = 0, height = 0;
  /// kKernel: the launches, in order (one unless a side selects more
  /// buffers than kMaxSlots).
  std::vector<CopyLaunch> launches;
};

/// The plan of copying `src` into `dst` with CopyRegion's contract (pairing by
/// row-major index, converting bf16/fp16/fp32). Throws reshard::Error when the
/// element counts differ or a dtype is one the kernels do not convert.
/// `memcpy2d`: rows of one dtype (both sides) become one cudaMemcpy2DAsync
/// rather than kernel launches (benchmarks compare the two).
CopyPlan PlanCopy(const RegionView& src, const RegionView& dst, bool memcpy2d = false);
/// The plan of TransformRegion(src, dst, o) (kernels.h): kernel launches
/// that apply the offsets, never a memcpy. Throws reshard::Error as PlanCopy,
/// and for a dtype that takes no offset (fp8, e8m0).
CopyPlan PlanTransform(const RegionView& src, const RegionView& dst, const Offsets& o);

/// Blocks and threads per block of a kernel launch of `groups` groups: one
/// group per thread, at most kMaxBlocks blocks (threads then loop).
struct LaunchShape {
  uint32_t blocks = 0;
  uint32_t threads = 0;
};
constexpr uint32_t kThreadsPerBlock = 256;
constexpr uint32_t kMaxBlocks = 8192;
LaunchShape ShapeFor(uint64_t groups);

/// A view over `buffers` from its parts (tests and benchmarks).
RegionView ViewOver(char* const* buffers, uint64_t offset, const std::vector<uint64_t>& shape,
                    const std::vector<uint64_t>& stride, fb::Dtype dtype, uint8_t buffer_modes = 0);

/// Executes a plan on host memory with the kernel's own per-group code (tests).
void RunOnHost(const CopyPlan& plan);

/// The launches of a quant op (QuantArgs, runtime/quant.h): at most
/// kMaxSlots outer combinations each. Throws reshard::Error on what
/// CheckQuantArgs refuses, or rows and cols that select buffers.
std::vector<QuantLaunch> PlanQuant(const QuantArgs& args);

/// Executes quant launches on host memory with the kernels' own per-element
/// and per-block code, blocks in order (tests).
void RunQuantOnHost(const std::vector<QuantLaunch>& launches);

}  // namespace reshard::cuda
