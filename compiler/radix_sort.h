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
// significant 11-bit digit first (each pass is stable), with only the passes
// the largest key needs; a pass whose digit is the same everywhere is
// skipped. `tmp` is scratch, kept by the caller to reuse its memory.
template <class T>
void SortByKeyDescending(std::vector<T>& v, std::vector<T>& tmp) {
  constexpr int kBits = 11;
  constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  uint64_t top = 0;
  for (const T& x : v) top = std::max(top, x.key);
  tmp.resize(v.size());
  for (int shift = 0; shift < 64 && (top >> shift) != 0; shift += kBits) {
    size_t start[kMask + 2] = {};
    for (const T& x : v) ++start[((top - x.key) >> shift & kMask) + 1];
    if (*std::max_element(start + 1, start + kMask + 2) == v.size()) continue;
    for (uint64_t d = 1; d <= kMask + 1; ++d) start[d] += start[d - 1];
    for (const T& x : v) tmp[start[(top - x.key) >> shift & kMask]++] = x;
    v.swap(tmp);
  }
}

}  // namespace reshard::routing
