#include "runtime/cuda/device_kernels.h"

#include "runtime/cuda/check.h"
#include "runtime/cuda/copy_kernels.h"
#include "runtime/cuda/region_plan.h"
#include "runtime/error.h"

namespace reshard::cuda {

DeviceGuard::DeviceGuard(int device) {
  RESHARD_CUDA_CHECK(cudaGetDevice(&old_));
  if (old_ != device) RESHARD_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != old_) cudaSetDevice(old_);
}

char* DeviceKernels::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  DeviceGuard guard(device_);
  void* p = nullptr;
  RESHARD_CUDA_CHECK(cudaMalloc(&p, bytes));
  return static_cast<char*>(p);
}

void DeviceKernels::Release(char* p) noexcept {
  if (p == nullptr) return;
  int old = -1;
  cudaGetDevice(&old);
  cudaSetDevice(device_);
  cudaFree(p);
  cudaSetDevice(old);
}

void DeviceKernels::CheckMemory(const void* p, size_t bytes, const std::string& what) const {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    attr.type = cudaMemoryTypeUnregistered;
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    throw Error(what + " is host memory; a session on " + name() + " binds device memory");
  }
  if (attr.device != device_) {
    throw Error(what + " is memory of cuda:" + std::to_string(attr.device) + "; the session runs on " + name());
  }
}

void DeviceKernels::Copy(const RegionView& src, const RegionView& dst) {
  const CopyPlan plan = PlanCopy(src, dst, memcpy2d_);
  if (plan.kind == CopyKind::kNone) return;
  DeviceGuard guard(device_);
  switch (plan.kind) {
    case CopyKind::kMemcpy:
      RESHARD_CUDA_CHECK(cudaMemcpyAsync(plan.dst, plan.src, plan.width, cudaMemcpyDeviceToDevice, stream_));
      break;
    case CopyKind::kMemcpy2D:
      RESHARD_CUDA_CHECK(cudaMemcpy2DAsync(plan.dst, plan.dpitch, plan.src, plan.spitch, plan.width, plan.height,
                                           cudaMemcpyDeviceToDevice, stream_));
      break;
    default:
      for (const CopyLaunch& l : plan.launches) {
        const LaunchShape shape = ShapeFor(l.count / l.vec);
        RESHARD_CUDA_CHECK(LaunchCopy(l, shape.blocks, shape.threads, stream_));
      }
  }
}

void DeviceKernels::Transform(const RegionView& src, const RegionView& dst, const Offsets& o) {
  const CopyPlan plan = PlanTransform(src, dst, o);
  if (plan.kind == CopyKind::kNone) return;
  DeviceGuard guard(device_);
  for (const CopyLaunch& l : plan.launches) {
    const LaunchShape shape = ShapeFor(l.count / l.vec);
    RESHARD_CUDA_CHECK(LaunchCopy(l, shape.blocks, shape.threads, stream_));
  }
}

void DeviceKernels::Quant(const QuantArgs& args) {
  const std::vector<QuantLaunch> launches = PlanQuant(args);
  DeviceGuard guard(device_);
  for (const QuantLaunch& l : launches) RESHARD_CUDA_CHECK(LaunchQuant(l, stream_));
}

void DeviceKernels::Finish() {
  DeviceGuard guard(device_);
  RESHARD_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace reshard::cuda
