#include "compiler/radix_sort.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace reshard::routing {
namespace {

struct Item {
  uint64_t key;
  uint32_t id;
  bool operator==(const Item& o) const { return key == o.key && id == o.id; }
};

// The same order as std::stable_sort by descending key, ties included, for
// keys of every width (one digit, several, the full 64 bits) and sizes.
TEST(RadixSortTest, MatchesStableSortDescending) {
  std::mt19937_64 rng(7);
  for (uint64_t range : {uint64_t{1}, uint64_t{5}, uint64_t{2048}, uint64_t{1} << 35, ~uint64_t{0}}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}, size_t{50000}}) {
      std::vector<Item> v(n), tmp;
      for (size_t i = 0; i < n; ++i) {
        const uint64_t r = rng();
        v[i] = {range == ~uint64_t{0} ? r : r % range, static_cast<uint32_t>(i)};
      }
      std::vector<Item> want = v;
      std::stable_sort(want.begin(), want.end(), [](const Item& a, const Item& b) { return a.key > b.key; });
      SortByKeyDescending(v, tmp);
      ASSERT_EQ(v, want) << "range " << range << ", n " << n;
    }
  }
}

// Keys that differ only in their top digit, and the extremes 0 and 2^64-1.
TEST(RadixSortTest, HighDigitsAndExtremes) {
  std::vector<Item> v = {{uint64_t{1} << 60, 0}, {0, 1}, {~uint64_t{0}, 2}, {uint64_t{1} << 60, 3}, {0, 4}};
  std::vector<Item> tmp;
  SortByKeyDescending(v, tmp);
  const std::vector<Item> want = {{~uint64_t{0}, 2}, {uint64_t{1} << 60, 0}, {uint64_t{1} << 60, 3}, {0, 1}, {0, 4}};
  EXPECT_EQ(v, want);
}

// Keys in a narrow band far from zero (the passes follow the keys' spread,
// not the largest key): the order is still std::stable_sort's.
TEST(RadixSortTest, NarrowBandOfLargeKeys) {
  std::mt19937_64 rng(11);
  for (uint64_t base : {uint64_t{1} << 36, uint64_t{1} << 63, ~uint64_t{0} - 5000}) {
    for (uint64_t band : {uint64_t{1}, uint64_t{4096}, uint64_t{5000}}) {
      std::vector<Item> v(3000), tmp;
      for (size_t i = 0; i < v.size(); ++i) v[i] = {base + rng() % band, static_cast<uint32_t>(i)};
      std::vector<Item> want = v;
      std::stable_sort(want.begin(), want.end(), [](const Item& a, const Item& b) { return a.key > b.key; });
      SortByKeyDescending(v, tmp);
      ASSERT_EQ(v, want) << "base " << base << ", band " << band;
    }
  }
}

// Keys that agree in their low bits (multiples of 2^low, offset alike: the
// round fill's bytes are multiples of 1 KiB), so that the sort leaves those
// bits out, over spreads that take one, two and several passes: the order
// is still std::stable_sort's, ties included.
TEST(RadixSortTest, KeysAgreeingInTheirLowBits) {
  std::mt19937_64 rng(13);
  for (int low : {1, 10, 20, 40}) {
    for (uint64_t range : {uint64_t{3}, uint64_t{1} << 12, uint64_t{1} << 25, uint64_t{1} << 23}) {
      if (low + 26 > 64) continue;
      for (uint64_t offset : {uint64_t{0}, uint64_t{777}}) {
        std::vector<Item> v(20000), tmp;
        for (size_t i = 0; i < v.size(); ++i)
          v[i] = {((rng() % range) << low) + (offset & ((uint64_t{1} << low) - 1)), static_cast<uint32_t>(i)};
        std::vector<Item> want = v;
        std::stable_sort(want.begin(), want.end(), [](const Item& a, const Item& b) { return a.key > b.key; });
        SortByKeyDescending(v, tmp);
        ASSERT_EQ(v, want) << "low " << low << ", range " << range << ", offset " << offset;
      }
    }
  }
}

// Positions by descending key, ties in position order, for spreads that
// pack (up to 32 bits, after the low bits the keys share) and that do not,
// and for none, one and many keys: the order std::stable_sort gives.
TEST(RadixSortTest, OrderByKeyDescendingMatchesStableSort) {
  std::mt19937_64 rng(17);
  std::vector<uint64_t> packed, tmp;
  std::vector<uint32_t> order;
  for (int low : {0, 10}) {
    for (uint64_t range : {uint64_t{1}, uint64_t{7}, uint64_t{1} << 25, uint64_t{1} << 32, uint64_t{1} << 40}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{5000}}) {
        std::vector<uint64_t> keys(n);
        for (uint64_t& k : keys) k = (uint64_t{1} << 50) + ((rng() % range) << low);
        std::vector<uint32_t> want(n);
        for (size_t i = 0; i < n; ++i) want[i] = static_cast<uint32_t>(i);
        std::stable_sort(want.begin(), want.end(), [&](uint32_t a, uint32_t b) { return keys[a] > keys[b]; });
        OrderByKeyDescending(keys, packed, tmp, order);
        ASSERT_EQ(order, want) << "low " << low << ", range " << range << ", n " << n;
      }
    }
  }
}

}  // namespace
}  // namespace reshard::routing
