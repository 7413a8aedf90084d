#include "runtime/content_digest.h"

#include <cstdio>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "plan_generated.h"
#include "runtime/error.h"

namespace reshard {

std::string ContentDigest::hex() const {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

ContentDigest DigestBytes(const uint8_t* data, size_t size, size_t zero_at) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  if (zero_at == SIZE_MAX || zero_at > size || size - zero_at < 16) {
    XXH3_128bits_update(&state, data, size);
  } else {
    static const uint8_t zeros[16] = {};
    XXH3_128bits_update(&state, data, zero_at);
    XXH3_128bits_update(&state, zeros, sizeof zeros);
    XXH3_128bits_update(&state, data + zero_at + 16, size - zero_at - 16);
  }
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return {h.high64, h.low64};
}

void StampContentDigest(uint8_t* data, size_t size) {
  const fb::Digest128* field = fb::GetPlan(data)->content_digest();
  if (field == nullptr) throw Error("internal: the plan was written without its content_digest field");
  const size_t at = reinterpret_cast<const uint8_t*>(field) - data;
  if (at + sizeof(fb::Digest128) > size) throw Error("internal: content_digest outside the plan");
  const ContentDigest d = DigestBytes(data, size, at);
  // Structs are stored little-endian, in declaration order (lo, hi).
  flatbuffers::WriteScalar(data + at, d.lo);
  flatbuffers::WriteScalar(data + at + 8, d.hi);
}

}  // namespace reshard
