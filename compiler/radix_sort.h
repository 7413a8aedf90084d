// A stable sort by descending integer key, for the round fill's per-round
// ordering of its pairs (route_schedule.cc: tens of thousands of pairs,
// hundreds of rounds) and the estimate's messages (round_estimate.cc).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace reshard::routing {

namespace radix {

// How a sort cuts its keys into digits: the low bits every key shares are
// left out (the round fill's keys, bytes left at two NICs, are all
// multiples of 1 KiB on DeepSeek-V3), and the rest of the keys' spread
// (largest - smallest) goes in passes of up to 13 bits: there, 25 bits in 2
// passes, where 12-bit digits of the whole spread take 3. (Each pass moves
// every element, and the moves are a large part of a large compile's
// instructions by callgrind: fewer, wider passes pay.)
struct Digits {
  int low = 0;     // the bits below it are the same in every key
  int bits = 0;    // of the spread above `low`
  int passes = 0;  // 0: all keys equal
  int width = 0;   // bits a pass
};

// From the largest and smallest key and the bits in which some key differs from another.
inline Digits DigitsOf(uint64_t top, uint64_t least, uint64_t differ) {
  constexpr int kMaxBits = 13;
  Digits d;
  if (differ == 0) return d;
  d.low = __builtin_ctzll(differ);  // every (top - key) is a multiple of 2^low
  const uint64_t spread = (top - least) >> d.low;
  while (d.bits < 64 && (spread >> d.bits) != 0) ++d.bits;
  d.passes = (d.bits + kMaxBits - 1) / kMaxBits;
  d.width = (d.bits + d.passes - 1) / d.passes;
  return d;
}

// The stable passes, least significant digit first, over the digits of
// value(x) from bit `shift` on; every pass's counts taken in one read, a
// pass whose digit is the same everywhere skipped. Count: the counters'
// type (32 bits keep 8192 buckets within 32 KiB where sizes allow).
template <class Count, class T, class Value>
void Passes(std::vector<T>& v, std::vector<T>& tmp, const Digits& d, int shift, Value value) {
  if (d.passes == 0) return;
  const uint64_t mask = (uint64_t{1} << d.width) - 1;
  const size_t buckets = size_t{1} << d.width;
  std::vector<Count> start(static_cast<size_t>(d.passes) * (buckets + 1), 0);
  for (const T& x : v) {
    const uint64_t k = value(x) >> shift;
    for (int p = 0; p < d.passes; ++p) ++start[p * (buckets + 1) + (k >> (p * d.width) & mask) + 1];
  }
  tmp.resize(v.size());
  for (int p = 0; p < d.passes; ++p) {
    Count* s = start.data() + p * (buckets + 1);
    if (*std::max_element(s + 1, s + buckets + 1) == v.size()) continue;
    for (size_t b = 1; b <= buckets; ++b) s[b] += s[b - 1];
    const int at = shift + p * d.width;
    for (const T& x : v) tmp[s[value(x) >> at & mask]++] = x;
    v.swap(tmp);
  }
}

}  // namespace radix

// Sorts `v` (elements with a uint64_t `key`) by descending key, equal keys
// keeping their order: a radix sort of (largest key - key) with the digits
// of radix::DigitsOf. `tmp` is scratch, kept by the caller to reuse its memory.
template <class T>
void SortByKeyDescending(std::vector<T>& v, std::vector<T>& tmp) {
  if (v.size() < 2) return;
  uint64_t top = 0, least = UINT64_MAX, differ = 0;  // differ: the bits in which some key differs from the first
  const uint64_t first = v.front().key;
  for (const T& x : v) top = std::max(top, x.key), least = std::min(least, x.key), differ |= x.key ^ first;
  const radix::Digits d = radix::DigitsOf(top, least, differ);
  radix::Passes<size_t>(v, tmp, d, d.low, [top](const T& x) { return top - x.key; });
}

// The positions of `keys` by descending key, equal keys in position order
// (SortByKeyDescending of {keys[i], i}): into `order`. Where the keys' spread
// (less the low bits all share) fits 32 bits, each position travels packed
// with its key's digits in one 64-bit word, half the bytes a pass moves of
// a {key, position} pair (the round fill's per-round order of its pairs).
// `packed` and `tmp` are scratch, kept by the caller to reuse their memory.
inline void OrderByKeyDescending(const std::vector<uint64_t>& keys, std::vector<uint64_t>& packed,
                                 std::vector<uint64_t>& tmp, std::vector<uint32_t>& order) {
  const size_t n = keys.size();
  order.resize(n);
  uint64_t top = 0, least = UINT64_MAX, differ = 0;
  for (const uint64_t k : keys) top = std::max(top, k), least = std::min(least, k), differ |= k ^ keys.front();
  const radix::Digits d = radix::DigitsOf(top, least, differ);
  if (d.bits > 32 || n > UINT32_MAX) {  // too wide to pack: pairs
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
  for (size_t i = 0; i < n; ++i) packed[i] = ((top - keys[i]) >> d.low) << 32 | i;
  radix::Passes<uint32_t>(packed, tmp, d, 32, [](uint64_t x) { return x; });
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(packed[i]);
}

}  // namespace reshard::routing
