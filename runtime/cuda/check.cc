#include "runtime/cuda/check.h"

#include <cstring>
#include <string>

#include "runtime/error.h"

namespace reshard::cuda {
namespace {

// __FILE__ is the absolute path CMake passes; from "runtime/" on is what a
// person looks up.
std::string Where(const char* file, int line) {
  const char* rel = std::strstr(file, "runtime/");
  return std::string(rel ? rel : file) + ":" + std::to_string(line);
}

}  // namespace

void FailCuda(cudaError_t e, const char* call, const char* file, int line) {
  cudaGetLastError();  // clears a non-sticky error, so that later calls start clean
  throw Error("cuda: " + Where(file, line) + ": " + call + " failed: " + cudaGetErrorString(e) + " (" +
              cudaGetErrorName(e) + ")");
}

void FailNccl(ncclResult_t r, const char* call, const char* file, int line) {
  std::string msg = "nccl: " + Where(file, line) + ": " + call + " failed: " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  throw Error(msg);
}

}  // namespace reshard::cuda
