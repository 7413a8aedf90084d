// Under AddressSanitizer with leak checks (tools/test.d/40-sanitize.sh): the
// leak check at exit survives a block of dynamic TLS that starts 16 bytes past
// a 4 KiB boundary. clang 14's runtime takes such a block for a pre-2.25
// glibc one and records the two words before it as the block's range
// (compiler-rt, sanitizer_tls_get_addr.cpp, DTLS_on_tls_get_addr;
// google/sanitizers#1322); LeakSanitizer's tracer then reads that range and
// dies ("Tracer caught signal 11"), exit non-zero. The stage's
// intercept_tls_get_addr=0 keeps it from recording the range.
//
// The block is placed there on purpose: 64-byte chunks of ASan's allocator
// are handed out one after another, so this takes them until the next one
// starts 16 bytes into a page, then makes glibc allocate the block. Exit 3
// if the block lands elsewhere: then this check no longer tests anything.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODULE\n", argv[0]);
    return 2;
  }
  void* module = dlopen(argv[1], RTLD_NOW);
  if (module == nullptr) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  auto touch = reinterpret_cast<char* (*)()>(dlsym(module, "TouchBlock"));
  if (touch == nullptr) {
    std::fprintf(stderr, "%s: no TouchBlock\n", argv[1]);
    return 2;
  }
  std::vector<void*> taken;
  taken.reserve(1 << 16);
  for (int i = 0; i < (1 << 16); ++i) {
    void* chunk = std::malloc(40);
    taken.push_back(chunk);
    if ((reinterpret_cast<uintptr_t>(chunk) + 64) % 4096 == 16) break;
  }
  const uintptr_t block = reinterpret_cast<uintptr_t>(touch());
  std::printf("TLS block at %#lx (%lu bytes into its page), %zu chunks taken\n",
              static_cast<unsigned long>(block), static_cast<unsigned long>(block % 4096), taken.size());
  for (void* chunk : taken) std::free(chunk);
  if (block % 4096 != 16) {
    std::fprintf(stderr, "the TLS block did not land 16 bytes into a page: nothing was checked\n");
    return 3;
  }
  return 0;
}
