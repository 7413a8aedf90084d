// The strided copy kernel: one thread per group of `vec` elements, looping
// over the grid. The per-group work (addresses, conversion, wide loads) is
// CopyGroup in copy_launch.h, which the CPU tests run against CopyRegion.
#include "runtime/cuda/copy_kernels.h"

namespace reshard::cuda {
namespace {

// __grid_constant__ keeps the launch (its slot table is indexed at run time)
// in parameter memory instead of a per-thread copy.
template <typename S, typename D, int V>
__global__ void __launch_bounds__(256) CopyKernel(const __grid_constant__ CopyLaunch l) {
  const uint64_t groups = l.count / V;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t g = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += step) {
    CopyGroup<S, D, V>(l, g);
  }
}

__global__ void __launch_bounds__(256) DequantKernel(const __grid_constant__ QuantLaunch l) {
  const uint64_t total = static_cast<uint64_t>(l.outer) * l.rows * l.cols;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    DequantElement(l, i);
  }
}

// One thread block per scale block: the block's amax by a shared-memory max
// reduction (exact in any order: a max of finite magnitudes), its scale by
// thread 0, then the FP8 values of the elements dst keeps.
// The largest of the thread block's `amax`es, for every thread of it. `red`
// (blockDim.x floats of shared memory) is free again after the caller's next
// __syncthreads().
__device__ float BlockMax(float amax, float* red) {
  red[threadIdx.x] = amax;
  __syncthreads();
  for (uint32_t s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  return red[0];
}

__global__ void __launch_bounds__(256) QuantizeKernel(const __grid_constant__ QuantLaunch l) {
  __shared__ float red[256];
  const uint64_t blocks = static_cast<uint64_t>(l.outer) * BlockRows(l) * BlockCols(l);
  for (uint64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    uint32_t o;
    uint64_t r, c;
    const float scale = ScaleFromAmax(BlockMax(BlockAmax(l, b, threadIdx.x, blockDim.x), red), l.e8m0);
    if (threadIdx.x == 0) {
      uint64_t br, bc;
      BlockCoords(l, b, o, br, bc);
      StoreScale(l, o, br, bc, scale);
    }
    for (uint64_t k = threadIdx.x; BlockElement(l, b, k, o, r, c); k += blockDim.x) {
      QuantizeBlockElement(l, o, r, c, scale);
    }
    __syncthreads();  // red[] is reused by the next block
  }
}

// Elementwise launches: quantize_scaled over src elements, scale_from_amax over grid blocks.
__global__ void __launch_bounds__(256) ElementwiseQuantKernel(const __grid_constant__ QuantLaunch l) {
  const uint64_t total = static_cast<uint64_t>(l.outer) * l.rows * l.cols;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    if (l.mode == QuantMode::quantize_scaled)
      QuantizeScaledElement(l, i);
    else
      ScaleFromAmaxElement(l, i);
  }
}

// One thread block per grid block: the partial amax of the src elements in it.
__global__ void __launch_bounds__(256) AmaxKernel(const __grid_constant__ QuantLaunch l) {
  __shared__ float red[256];
  const uint64_t blocks = static_cast<uint64_t>(l.outer) * l.dst_rows * l.dst_cols;
  for (uint64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const float block_amax = BlockMax(BlockAmax(l, b, threadIdx.x, blockDim.x), red);
    if (threadIdx.x == 0) StoreAmax(l, b, block_amax);
    __syncthreads();  // red[] is reused by the next block
  }
}

}  // namespace

cudaError_t LaunchQuant(const QuantLaunch& l, cudaStream_t stream) {
  constexpr uint32_t kThreads = 256, kMaxGrid = 8192;
  if (l.mode == QuantMode::amax) {
    const uint64_t blocks = static_cast<uint64_t>(l.outer) * l.dst_rows * l.dst_cols;
    const uint32_t grid = static_cast<uint32_t>(blocks < kMaxGrid ? (blocks ? blocks : 1) : kMaxGrid);
    AmaxKernel<<<grid, kThreads, 0, stream>>>(l);
  } else if (l.mode == QuantMode::quantize_scaled || l.mode == QuantMode::scale_from_amax) {
    const uint64_t total = static_cast<uint64_t>(l.outer) * l.rows * l.cols;
    const uint64_t want = (total + kThreads - 1) / kThreads;
    const uint32_t grid = static_cast<uint32_t>(want < kMaxGrid ? (want ? want : 1) : kMaxGrid);
    ElementwiseQuantKernel<<<grid, kThreads, 0, stream>>>(l);
  } else if (l.mode == QuantMode::quantize) {
    const uint64_t blocks = static_cast<uint64_t>(l.outer) * BlockRows(l) * BlockCols(l);
    const uint32_t grid = static_cast<uint32_t>(blocks < kMaxGrid ? (blocks ? blocks : 1) : kMaxGrid);
    QuantizeKernel<<<grid, kThreads, 0, stream>>>(l);
  } else {
    const uint64_t total = static_cast<uint64_t>(l.outer) * l.rows * l.cols;
    const uint64_t want = (total + kThreads - 1) / kThreads;
    const uint32_t grid = static_cast<uint32_t>(want < kMaxGrid ? (want ? want : 1) : kMaxGrid);
    DequantKernel<<<grid, kThreads, 0, stream>>>(l);
  }
  return cudaGetLastError();
}

cudaError_t LaunchCopy(const CopyLaunch& l, uint32_t blocks, uint32_t threads, cudaStream_t stream) {
  DispatchCopy(l, [&]<typename S, typename D, int V>() { CopyKernel<S, D, V><<<blocks, threads, 0, stream>>>(l); });
  return cudaGetLastError();
}

}  // namespace reshard::cuda
