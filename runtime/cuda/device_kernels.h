// The kernels of a CUDA device: staging from cudaMalloc (exactly the plan's
// staging_bytes), region copies on one stream as cudaMemcpyAsync or the
// strided copy kernel (region_plan.h decides).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "runtime/kernels.h"

namespace reshard::cuda {

/// Sets the calling thread's current device for a scope, restoring the old one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int old_ = -1;
};

class DeviceKernels : public Kernels {
 public:
  /// Copies run on `stream` of `device` (the stream stays the caller's).
  DeviceKernels(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  /// cudaMalloc of exactly `bytes` (nothing for 0).
  char* Allocate(size_t bytes) override;
  void Release(char* p) noexcept override;
  /// Accepts device (or managed) memory of this device only.
  void CheckMemory(const void* p, size_t bytes, const std::string& what) const override;
  void Copy(const RegionView& src, const RegionView& dst) override;
  /// The quantize or dequantize kernel (quant_launch.h), on the same stream.
  void Quant(const QuantArgs& args) override;
  void Transform(const RegionView& src, const RegionView& dst, const Offsets& o) override;
  /// cudaStreamSynchronize; reports a kernel's fault with the copy that ran last.
  void Finish() override;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  /// Whether row copies go to cudaMemcpy2DAsync or (default) the copy kernel.
  void set_memcpy2d(bool on) { memcpy2d_ = on; }

 private:
  int device_;
  cudaStream_t stream_;
  bool memcpy2d_ = false;
};

}  // namespace reshard::cuda
