// The strided copy kernel's launcher (copy_kernels.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "runtime/cuda/copy_launch.h"
#include "runtime/cuda/quant_launch.h"

namespace reshard::cuda {

/// Launches `l` on `stream` with `blocks` x `threads` (region_plan.h
/// ShapeFor); returns the launch's error (cudaGetLastError).
cudaError_t LaunchCopy(const CopyLaunch& l, uint32_t blocks, uint32_t threads, cudaStream_t stream);

/// Launches the quantize or dequantize kernel of `l` on `stream`: one thread
/// per element (dequantize), one thread block per scale block (quantize).
cudaError_t LaunchQuant(const QuantLaunch& l, cudaStream_t stream);

}  // namespace reshard::cuda
