// Checks of CUDA and NCCL calls, in the manner of nccl-tests' CUDACHECK and
// NCCLCHECK: a failed call throws reshard::Error naming the source file and
// line, the call, and the library's own error string.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace reshard::cuda {

[[noreturn]] void FailCuda(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void FailNccl(ncclResult_t r, const char* call, const char* file, int line);

}  // namespace reshard::cuda

#define RESHARD_CUDA_CHECK(call)                                                         \
  do {                                                                                   \
    const cudaError_t reshard_e_ = (call);                                               \
    if (reshard_e_ != cudaSuccess) ::reshard::cuda::FailCuda(reshard_e_, #call, __FILE__, __LINE__); \
  } while (0)

// ncclInProgress is success for a non-blocking communicator: the caller polls
// ncclCommGetAsyncError until the call has completed.
#define RESHARD_NCCL_CHECK(call)                                                         \
  do {                                                                                   \
    const ncclResult_t reshard_r_ = (call);                                              \
    if (reshard_r_ != ncclSuccess && reshard_r_ != ncclInProgress)                       \
      ::reshard::cuda::FailNccl(reshard_r_, #call, __FILE__, __LINE__);                   \
  } while (0)
