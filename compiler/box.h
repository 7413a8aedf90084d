// N-d box algebra over logical tensor coordinates. A box is a half-open
// interval per dim; stack dims (layers, experts) are dims like any other, so a
// box over 58 layers x 256 experts is one box, never 14848 entries.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/spec.h"

namespace reshard {

struct Interval {
  int64_t lo = 0, hi = 0;
  int64_t size() const { return hi - lo; }
  bool empty() const { return hi <= lo; }
  bool operator==(const Interval&) const = default;
};

struct Box {
  int ndim = 0;
  std::array<int64_t, kMaxDims> lo{}, hi{};

  static Box FromVectors(const std::vector<int64_t>& lo, const std::vector<int64_t>& hi);
  int64_t extent(int d) const { return hi[d] - lo[d]; }
  int64_t volume() const;
  bool empty() const;
  bool contains(const Box& o) const;
  bool intersects(const Box& o) const;
  Box intersect(const Box& o) const;  // may be empty
  bool operator==(const Box& o) const;
  bool operator<(const Box& o) const;  // lexicographic on (lo, hi)
  /// "[0:4, 16:32, 0:7168]"
  std::string str() const;
};

/// A strided view of memory (CuTe shape:stride). Modes whose bit is set in
/// `buffer_modes` step through the rank's buffer table instead of elements.
struct StridedRegion {
  uint32_t buffer = 0;
  uint64_t offset = 0;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{}, stride{};
  uint32_t buffer_modes = 0;

  int64_t elements() const;
  /// Drops extent-1 modes and merges neighbours that are contiguous with each
  /// other (outer stride == inner extent * inner stride, same kind), keeping
  /// each merged extent and stride below 2^32.
  StridedRegion Coalesced() const;
  /// One run of elements in one buffer, stride 1.
  bool contiguous() const;
  /// "(4,16,458752):(b16,b1,1)"
  std::string str() const;
};

/// The row-major image of `sub` inside a block of memory holding `whole`
/// row-major from element `base` of `buffer` (a staging area: 0xFFFFFFFF);
/// one mode per dim of `whole`, extent-1 modes kept.
StridedRegion RowMajorRegion(const Box& whole, const Box& sub, uint64_t base, uint32_t buffer);

/// The blocks (in block coordinates) that `b` touches, for blocks of
/// `block` over its last two dims and of 1 over the others.
Box BlocksOf(const Box& b, const std::array<int64_t, 2>& block);

/// Splits `b` into boxes of at most `max_elements` elements, cutting the
/// outermost dims first (whole rows of inner dims stay together when they fit).
std::vector<Box> SplitBox(const Box& b, int64_t max_elements);

}  // namespace reshard
