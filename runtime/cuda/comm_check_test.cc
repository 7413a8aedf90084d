// CheckCommPointer and IsReadable (runtime/cuda/comm_check.h): what a caller
// passing an int or a stray pointer as a communicator gets instead of a
// segfault.
#include "runtime/cuda/comm_check.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "runtime/error.h"

namespace reshard::cuda {
namespace {

std::string ErrorOf(const void* comm, const char* which = "net") {
  try {
    CheckCommPointer(comm, which);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const std::string kExpected =
    " (expected an ncclComm_t: pass the communicator object or its pointer, e.g. reshard.nccl.Communicator, "
    "PyNcclCommunicator, ProcessGroupNCCL)";

TEST(CommCheckTest, AnIntThatIsNoAddressIsRefused) {
  EXPECT_EQ(ErrorOf(reinterpret_cast<const void*>(uintptr_t{12345})),
            "the net communicator 0x3039 is not an address in this process" + kExpected);
  EXPECT_EQ(ErrorOf(reinterpret_cast<const void*>(uintptr_t{0x3038}), "nvlink"),
            "the nvlink communicator 0x3038 is not an address in this process" + kExpected);
  // The top of the address space, and a range that wraps around it.
  EXPECT_FALSE(IsReadable(reinterpret_cast<const void*>(~uintptr_t{0} - 7), 8));
  EXPECT_FALSE(IsReadable(reinterpret_cast<const void*>(~uintptr_t{0} - 3), 8));
}

TEST(CommCheckTest, NullIsRefused) {
  EXPECT_EQ(ErrorOf(nullptr), "the net communicator is null" + kExpected);
  EXPECT_FALSE(IsReadable(nullptr, 8));
}

TEST(CommCheckTest, AMisalignedPointerIsRefused) {
  auto heap = std::make_unique<uint64_t[]>(4);
  const char* odd = reinterpret_cast<const char*>(heap.get()) + 1;
  EXPECT_TRUE(IsReadable(odd, 8));
  const std::string e = ErrorOf(odd);
  EXPECT_NE(e.find("is not aligned to 8 bytes"), std::string::npos) << e;
  EXPECT_EQ(e.rfind("the net communicator 0x", 0), 0u) << e;
}

TEST(CommCheckTest, HeapAndStackPointersAreAccepted) {
  auto heap = std::make_unique<uint64_t[]>(64);
  EXPECT_EQ(ErrorOf(heap.get()), "");
  EXPECT_TRUE(IsReadable(heap.get(), 64 * sizeof(uint64_t)));  // more than one read of the buffer
  alignas(8) char stack[16] = {};
  EXPECT_EQ(ErrorOf(stack), "");
}

TEST(CommCheckTest, UnmappedAndUnreadablePagesAreRefused) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Three pages: readable, PROT_NONE, then unmapped.
  char* p = static_cast<char*>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(mprotect(p + page, page, PROT_NONE), 0);
  ASSERT_EQ(munmap(p + 2 * page, page), 0);
  // First, before anything allocates: an allocator (ASan's, in the sanitizer
  // build) may map the freed page again at any later allocation.
  const bool hole_readable = IsReadable(p + 2 * page, 8);
  EXPECT_FALSE(hole_readable);
  EXPECT_EQ(ErrorOf(p), "");
  EXPECT_TRUE(IsReadable(p + page - 8, 8));
  EXPECT_FALSE(IsReadable(p + page - 4, 8));  // runs into the PROT_NONE page
  EXPECT_NE(ErrorOf(p + page).find("is not an address in this process"), std::string::npos);
  munmap(p, 2 * page);
}

TEST(CommCheckTest, MapsFallbackReadsTheTable) {
  const std::string maps =
      "00400000-00401000 r-xp 00000000 08:01 1 /bin/x\n"
      "00401000-00402000 rw-p 00000000 00:00 0\n"
      "00402000-00403000 ---p 00000000 00:00 0\n"
      "7f0000000000-7f0000001000 rw-p 00000000 00:00 0 [heap]\n";
  auto readable = [&](uintptr_t addr, size_t bytes) {
    std::istringstream in(maps);
    return ReadableInMaps(addr, bytes, in);
  };
  EXPECT_FALSE(readable(0x3039, 8));
  EXPECT_TRUE(readable(0x400000, 8));
  EXPECT_TRUE(readable(0x400ffc, 8));   // across two adjacent readable mappings
  EXPECT_FALSE(readable(0x401ffc, 8));  // into the ---p one
  EXPECT_FALSE(readable(0x402000, 8));
  EXPECT_TRUE(readable(0x7f0000000800, 8));
  EXPECT_FALSE(readable(0x7f0000000ffc, 8));  // past the last mapping
  EXPECT_FALSE(readable(0x7f0000001000, 8));
  // This process's own table agrees with process_vm_readv.
  auto heap = std::make_unique<uint64_t[]>(4);
  std::ifstream self("/proc/self/maps");
  if (self) {
    EXPECT_TRUE(ReadableInMaps(reinterpret_cast<uintptr_t>(heap.get()), 8, self));
  }
}

}  // namespace
}  // namespace reshard::cuda
