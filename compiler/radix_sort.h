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
// significant digit first (each pass is stable), with only the passes the
// keys' spread (largest - smallest) needs, every pass's digit counts taken
// in one read of the keys; a pass whose digit is the same everywhere is
// skipped. The low bits every key has alike are left out (the round fill's
// keys, bytes left at two NICs, are all multiples of 1 KiB on DeepSeek-V3),
// and a pass takes up to 13 bits: there, 25 bits in 2 passes, where 12-bit
// digits of the whole spread took 3. `tmp` is scratch, kept by the caller
// to reuse its memory. (11-bit digits took 4 passes where 12-bit ones took
// 3: a quarter of the sort's element moves, which were a tenth of that
// compile's instructions by callgrind.)
template <class T>
void SortByKeyDescending(std::vector<T>& v, std::vector<T>& tmp) {
  constexpr int kMaxBits = 13;
  if (v.size() < 2) return;
  uint64_t top = 0, least = UINT64_MAX, differ = 0;  // differ: the bits in which some key differs from the first
  const uint64_t first = v.front().key;
  for (const T& x : v) top = std::max(top, x.key), least = std::min(least, x.key), differ |= x.key ^ first;
  if (differ == 0) return;  // all keys equal: the order stays
  // Every (top - key) is a multiple of 2^low: the keys agree below bit `low`.
  const int low = __builtin_ctzll(differ);
  const uint64_t spread = (top - least) >> low;
  int bits = 0;
  while (bits < 64 && (spread >> bits) != 0) ++bits;
  const int passes = (bits + kMaxBits - 1) / kMaxBits, width = (bits + passes - 1) / passes;
  const uint64_t mask = (uint64_t{1} << width) - 1;
  const size_t buckets = size_t{1} << width;
  // Every pass's counts in one read of the keys, not one read per pass.
  std::vector<size_t> start(static_cast<size_t>(passes) * (buckets + 1), 0);
  for (const T& x : v) {
    const uint64_t k = (top - x.key) >> low;
    for (int p = 0; p < passes; ++p) ++start[p * (buckets + 1) + (k >> (p * width) & mask) + 1];
  }
  tmp.resize(v.size());
  for (int p = 0; p < passes; ++p) {
    size_t* s = start.data() + p * (buckets + 1);
    if (*std::max_element(s + 1, s + buckets + 1) == v.size()) continue;
    for (size_t d = 1; d <= buckets; ++d) s[d] += s[d - 1];
    const int shift = low + p * width;
    for (const T& x : v) tmp[s[(top - x.key) >> shift & mask]++] = x;
    v.swap(tmp);
  }
}

// The positions of `keys` by descending key, equal keys in position order
// (SortByKeyDescending of {keys[i], i}): into `order`. Where the keys' spread
// (less the low bits all share) fits 32 bits, each position travels packed
// with its key's digits in one 64-bit word, half the bytes a pass moves of
// a {key, position} pair (the round fill's per-round order of its pairs).
// `packed` and `tmp` are scratch, kept by the caller to reuse their memory.
inline void OrderByKeyDescending(const std::vector<uint64_t>& keys, std::vector<uint64_t>& packed,
                                 std::vector<uint64_t>& tmp, std::vector<uint32_t>& order) {
  constexpr int kMaxBits = 13;
  const size_t n = keys.size();
  order.resize(n);
  uint64_t top = 0, least = UINT64_MAX, differ = 0;
  for (const uint64_t k : keys) top = std::max(top, k), least = std::min(least, k), differ |= k ^ keys.front();
  const int low = differ ? __builtin_ctzll(differ) : 0;
  const uint64_t spread = n ? (top - least) >> low : 0;
  int bits = 0;
  while (bits < 64 && (spread >> bits) != 0) ++bits;
  if (bits > 32 || n > UINT32_MAX) {  // too wide to pack: pairs
    struct Keyed {
      uint64_t key;
      uint32_t at;
    };
    std::vector<Keyed> v(n), scratch;
    for (size_t i = 0; i < n; ++i) v[i] = {keys[i], static_cast<uint32_t>(i)};
    SortByKeyDescending(v, scratch);
    for (size_t i = 0; i < n; ++i) order[i] = v[i].at;
    return;
  }
  packed.resize(n);
  for (size_t i = 0; i < n; ++i) packed[i] = ((top - keys[i]) >> low) << 32 | i;
  if (bits > 0) {
    const int passes = (bits + kMaxBits - 1) / kMaxBits, width = (bits + passes - 1) / passes;
    const uint64_t mask = (uint64_t{1} << width) - 1;
    const size_t buckets = size_t{1} << width;
    // Positions fit 32 bits here: the counts of 8192 buckets stay within 32 KiB (L1).
    std::vector<uint32_t> start(static_cast<size_t>(passes) * (buckets + 1), 0);
    for (const uint64_t x : packed)
      for (int p = 0; p < passes; ++p) ++start[p * (buckets + 1) + (x >> (32 + p * width) & mask) + 1];
    tmp.resize(n);
    for (int p = 0; p < passes; ++p) {
      uint32_t* s = start.data() + p * (buckets + 1);
      if (*std::max_element(s + 1, s + buckets + 1) == n) continue;
      for (size_t d = 1; d <= buckets; ++d) s[d] += s[d - 1];
      const int shift = 32 + p * width;
      for (const uint64_t x : packed) tmp[s[x >> shift & mask]++] = x;
      packed.swap(tmp);
    }
  }
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(packed[i]);
}

}  // namespace reshard::routing
