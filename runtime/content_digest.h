// The content digest of a plan file: XXH3-128 of its bytes with the 16 bytes
// of Plan.content_digest taken as zero, so that the file can carry it.
// Ranks compare it at connect (runtime/hello.h); `show` prints it; `validate`
// recomputes it. A change detector, not a signature.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace reshard {

struct ContentDigest {
  uint64_t hi = 0, lo = 0;
  bool operator==(const ContentDigest& o) const { return hi == o.hi && lo == o.lo; }
  bool operator!=(const ContentDigest& o) const { return !(*this == o); }
  /// 32 lower-case hex digits, the high half first.
  std::string hex() const;
};

/// XXH3-128 of `data[0, size)` with `data[zero_at, zero_at + 16)` read as zero
/// bytes (zero_at == SIZE_MAX: the bytes as they are).
ContentDigest DigestBytes(const uint8_t* data, size_t size, size_t zero_at = SIZE_MAX);

/// Computes the digest of a finished plan buffer and writes it into the
/// buffer's content_digest field (which the emitter added as zeros).
void StampContentDigest(uint8_t* data, size_t size);

}  // namespace reshard
