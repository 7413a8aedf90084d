#include "runtime/cuda/comm_check.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/error.h"

namespace reshard::cuda {
const char kExpectedComm[] =
    "(expected an ncclComm_t: pass the communicator object or its pointer, e.g. reshard.nccl.Communicator, "
    "PyNcclCommunicator, ProcessGroupNCCL)";

namespace {

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%#" PRIxPTR, reinterpret_cast<uintptr_t>(p));
  return buf;
}

}  // namespace

bool ReadableInMaps(uintptr_t addr, size_t bytes, std::istream& maps) {
  if (bytes == 0) return true;
  const uintptr_t end = addr + bytes;
  if (end < addr) return false;
  // The lines are in ascending order: walk `at` across adjacent readable
  // mappings until it passes `end`.
  uintptr_t at = addr;
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s", &lo, &hi, perms) != 3) continue;
    if (hi <= at) continue;
    if (lo > at || perms[0] != 'r') return false;
    at = static_cast<uintptr_t>(hi);
    if (at >= end) return true;
  }
  return false;
}

bool IsReadable(const void* p, size_t bytes) {
  if (bytes == 0) return true;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  if (addr == 0 || addr + bytes < addr) return false;
  // Reading our own memory through the kernel: an address that is not mapped,
  // or not readable, fails with EFAULT (or reads short) instead of faulting.
  char buf[64];
  size_t done = 0;
  while (done < bytes) {
    const size_t n = bytes - done < sizeof buf ? bytes - done : sizeof buf;
    iovec local{buf, n};
    iovec remote{reinterpret_cast<void*>(addr + done), n};
    const ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (got == static_cast<ssize_t>(n)) {
      done += n;
      continue;
    }
    if (got >= 0 || errno == EFAULT) return false;
    // ENOSYS, EPERM (seccomp, ptrace policy): ask /proc/self/maps instead.
    std::ifstream maps("/proc/self/maps");
    if (!maps) return true;  // nothing can tell: let the caller's checks decide
    return ReadableInMaps(addr, bytes, maps);
  }
  return true;
}

void CheckCommPointer(const void* comm, const char* which) {
  const std::string name = std::string("the ") + which + " communicator";
  if (comm == nullptr) throw Error(name + " is null " + kExpectedComm);
  // NCCL's CommCheck reads startMagic, the first 8 bytes, first (and endMagic,
  // at the struct's end, only when startMagic matches NCCL_MAGIC): those are
  // the bytes that must not fault.
  if (!IsReadable(comm, sizeof(uint64_t))) {
    throw Error(name + " " + Hex(comm) + " is not an address in this process " + kExpectedComm);
  }
  if (reinterpret_cast<uintptr_t>(comm) % alignof(uint64_t) != 0) {
    throw Error(name + " " + Hex(comm) + " is not aligned to 8 bytes, as an ncclComm_t is " + kExpectedComm);
  }
}

}  // namespace reshard::cuda
