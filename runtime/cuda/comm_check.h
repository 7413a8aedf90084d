// Whether a pointer a caller hands over as an ncclComm_t can be one, checked
// before NCCL dereferences it: from Python a communicator arrives as an int
// (reshard.NcclTransport(net=12345)), and NCCL's first call on a wrong one
// would fault. No CUDA or NCCL here: the CPU tests check it (comm_check_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>

namespace reshard::cuda {

/// Whether `bytes` bytes from `p` are readable memory of this process, found
/// without touching them: process_vm_readv on this process (EFAULT for
/// memory that is not mapped or not readable), else (a kernel or seccomp
/// policy refusing the call) /proc/self/maps. True where neither is
/// available: then nothing can be told, and the caller's own checks decide.
bool IsReadable(const void* p, size_t bytes);

/// Whether /proc/self/maps-formatted `maps` ("start-end perms ..." a line,
/// ascending) covers [addr, addr + bytes) with readable mappings.
bool ReadableInMaps(uintptr_t addr, size_t bytes, std::istream& maps);

/// "(expected an ncclComm_t: pass the communicator object or its pointer,
/// e.g. ...)": what ends the messages about a communicator that is none.
extern const char kExpectedComm[];

/// Throws reshard::Error unless `comm` can be an ncclComm_t of this process:
/// not null, its first 8 bytes (NCCL's startMagic) readable, aligned to 8.
/// `which` names the communicator ("net", "nvlink"). What passes may still be
/// no communicator: NCCL's own CommCheck (startMagic and endMagic against
/// NCCL_MAGIC, at the start of every call taking one) refuses a mapped
/// pointer to something else, as an ncclInvalidArgument.
void CheckCommPointer(const void* comm, const char* which);

}  // namespace reshard::cuda
