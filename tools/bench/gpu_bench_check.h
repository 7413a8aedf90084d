// Exit-on-error checks of the GPU benchmarks (tools/bench/gpu_*): a failed
// CUDA or NCCL call prints where and why and ends the benchmark with 1.
#pragma once

#include <cstdio>
#include <cstdlib>

// One macro for both libraries: `ok` is the call's success value, `name`
// turns its result into text.
#define RESHARD_BENCH_CHECK(call, ok, name)                                                    \
  do {                                                                                         \
    const auto r_ = (call);                                                                    \
    if (r_ != (ok)) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, name(r_));            \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)
#define CHECK_CUDA(call) RESHARD_BENCH_CHECK(call, cudaSuccess, cudaGetErrorString)
#define CHECK_NCCL(call) RESHARD_BENCH_CHECK(call, ncclSuccess, ncclGetErrorString)
