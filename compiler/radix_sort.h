// A stable sort by descending integer key, for the round fill's per-round
// ordering of its pairs (route_schedule.cc: tens of thousands of pairs,
// hundreds of rounds) and the estimate's messages (round_estimate.cc).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace reshard::routing {

// Sorts `v` (elements with a uint64_t `key`) by descending key, equal keys
// keeping their order: a radix sort of (largest key - key), least
// significant 12-bit digit first (each pass is stable), with only the passes
// the keys' spread (largest - smallest) needs, every pass's digit counts
// taken in one read of the keys; a pass whose digit is the same everywhere
// is skipped. `tmp` is scratch, kept by the caller to reuse its memory.
// (The round fill's keys, bytes left at two NICs, spread over 33-36 bits on
// DeepSeek-V3: 3 passes of 12 bits where 11-bit digits took 4 - a quarter
// of the sort's element moves, which were a tenth of that compile's
// instructions by callgrind.)
template <class T>
void SortByKeyDescending(std::vector<T>& v, std::vector<T>& tmp) {
  constexpr int kBits = 12, kMaxPasses = (64 + kBits - 1) / kBits;
  constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  uint64_t top = 0, least = UINT64_MAX;
  for (const T& x : v) top = std::max(top, x.key), least = std::min(least, x.key);
  const uint64_t spread = v.empty() ? 0 : top - least;  // the largest (top - key)
  int passes = 0;
  while (passes < kMaxPasses && (spread >> (passes * kBits)) != 0) ++passes;
  // Every pass's counts in one read of the keys, not one read per pass.
  std::vector<size_t> start(static_cast<size_t>(passes) * (kMask + 2), 0);
  for (const T& x : v) {
    const uint64_t k = top - x.key;
    for (int p = 0; p < passes; ++p) ++start[p * (kMask + 2) + (k >> (p * kBits) & kMask) + 1];
  }
  tmp.resize(v.size());
  for (int p = 0; p < passes; ++p) {
    size_t* s = start.data() + p * (kMask + 2);
    if (*std::max_element(s + 1, s + kMask + 2) == v.size()) continue;
    for (uint64_t d = 1; d <= kMask + 1; ++d) s[d] += s[d - 1];
    const int shift = p * kBits;
    for (const T& x : v) tmp[s[(top - x.key) >> shift & kMask]++] = x;
    v.swap(tmp);
  }
}

}  // namespace reshard::routing
