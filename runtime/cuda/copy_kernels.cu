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

}  // namespace

cudaError_t LaunchCopy(const CopyLaunch& l, uint32_t blocks, uint32_t threads, cudaStream_t stream) {
  DispatchCopy(l, [&]<typename S, typename D, int V>() { CopyKernel<S, D, V><<<blocks, threads, 0, stream>>>(l); });
  return cudaGetLastError();
}

}  // namespace reshard::cuda
