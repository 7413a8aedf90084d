#include "compiler/box.h"

#include <algorithm>

#include "runtime/modes.h"

namespace reshard {

Box Box::FromVectors(const std::vector<int64_t>& lo, const std::vector<int64_t>& hi) {
  Box b;
  b.ndim = static_cast<int>(lo.size());
  for (int d = 0; d < b.ndim; ++d) b.lo[d] = lo[d], b.hi[d] = hi[d];
  return b;
}

int64_t Box::volume() const {
  int64_t v = 1;
  for (int d = 0; d < ndim; ++d) v *= std::max<int64_t>(0, hi[d] - lo[d]);
  return v;
}

bool Box::empty() const {
  for (int d = 0; d < ndim; ++d)
    if (hi[d] <= lo[d]) return true;
  return false;
}

bool Box::contains(const Box& o) const {
  for (int d = 0; d < ndim; ++d)
    if (o.lo[d] < lo[d] || o.hi[d] > hi[d]) return false;
  return true;
}

bool Box::intersects(const Box& o) const {
  for (int d = 0; d < ndim; ++d)
    if (std::max(lo[d], o.lo[d]) >= std::min(hi[d], o.hi[d])) return false;
  return true;
}

Box Box::intersect(const Box& o) const {
  Box r;
  r.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    r.lo[d] = std::max(lo[d], o.lo[d]);
    r.hi[d] = std::min(hi[d], o.hi[d]);
  }
  return r;
}

bool Box::operator==(const Box& o) const {
  if (ndim != o.ndim) return false;
  for (int d = 0; d < ndim; ++d)
    if (lo[d] != o.lo[d] || hi[d] != o.hi[d]) return false;
  return true;
}

bool Box::operator<(const Box& o) const {
  for (int d = 0; d < ndim; ++d) {
    if (lo[d] != o.lo[d]) return lo[d] < o.lo[d];
    if (hi[d] != o.hi[d]) return hi[d] < o.hi[d];
  }
  return false;
}

std::string Box::str() const {
  std::string s = "[";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(lo[d]) + ":" + std::to_string(hi[d]);
  return s + "]";
}

int64_t StridedRegion::elements() const {
  int64_t n = 1;
  for (int k = 0; k < ndim; ++k) n *= shape[k];
  return n;
}

StridedRegion StridedRegion::Coalesced() const {
  StridedRegion r;
  r.buffer = buffer;
  r.offset = offset;
  // Plan regions hold 32-bit extents.
  r.ndim = CoalesceModes<int64_t>(ndim, shape.data(), stride.data(), buffer_modes, int64_t{1} << 32, r.shape.data(),
                                  r.stride.data(), &r.buffer_modes);
  return r;
}

bool StridedRegion::contiguous() const {
  return buffer_modes == 0 && (ndim == 0 || (ndim == 1 && stride[0] == 1));
}

std::string StridedRegion::str() const {
  if (ndim == 0) return "(1):(1)";
  std::string s = "(";
  for (int k = 0; k < ndim; ++k) {
    if (k) s += ",";
    s += std::to_string(shape[k]);
  }
  s += "):(";
  for (int k = 0; k < ndim; ++k) s += std::string(k ? "," : "") + ((buffer_modes >> k & 1) ? "b" : "") + std::to_string(stride[k]);
  return s + ")";
}

StridedRegion RowMajorRegion(const Box& whole, const Box& sub, uint64_t base, uint32_t buffer) {
  StridedRegion r;
  r.buffer = buffer;
  r.ndim = whole.ndim;
  int64_t stride = 1, off = 0;
  for (int d = whole.ndim - 1; d >= 0; --d) {
    r.shape[d] = sub.extent(d);
    r.stride[d] = stride;
    off += (sub.lo[d] - whole.lo[d]) * stride;
    stride *= whole.extent(d);
  }
  r.offset = base + static_cast<uint64_t>(off);
  return r;
}

Box BlocksOf(const Box& b, const std::array<int64_t, 2>& block) {
  Box out = b;
  for (int q = 0; q < 2; ++q) {
    const int d = b.ndim - 2 + q;
    out.lo[d] = b.lo[d] / block[q];
    out.hi[d] = (b.hi[d] + block[q] - 1) / block[q];
  }
  return out;
}

std::vector<Box> SplitBox(const Box& b, int64_t max_elements) {
  std::vector<Box> out;
  if (b.volume() <= max_elements || max_elements < 1) {
    out.push_back(b);
    return out;
  }
  // Find the outermost dim d such that the inner block (dims > d) fits; cut d into chunks.
  int64_t inner = 1;
  int d = b.ndim - 1;
  for (; d >= 0; --d) {
    if (inner * b.extent(d) > max_elements) break;
    inner *= b.extent(d);
  }
  // dims > d fit in `inner`; take k rows of dim d per chunk (k >= 1), recursing when one row is too big.
  int64_t k = std::max<int64_t>(1, max_elements / inner);
  // Dims outside d are split to single indices.
  std::vector<Box> outer = {b};
  for (int o = 0; o < d; ++o) {
    std::vector<Box> next;
    for (const Box& x : outer)
      for (int64_t i = x.lo[o]; i < x.hi[o]; ++i) {
        Box y = x;
        y.lo[o] = i;
        y.hi[o] = i + 1;
        next.push_back(y);
      }
    outer.swap(next);
  }
  for (const Box& x : outer) {
    for (int64_t i = x.lo[d]; i < x.hi[d]; i += k) {
      Box y = x;
      y.lo[d] = i;
      y.hi[d] = std::min(x.hi[d], i + k);
      out.push_back(y);
    }
  }
  return out;
}

}  // namespace reshard
