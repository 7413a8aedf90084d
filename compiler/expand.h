// Pass 2: expand a layout into, for every rank, the buffers it binds and the
// fragments they hold: (tensor, logical box) -> affine map into buffer memory.
#pragma once

#include <string>
#include <vector>

#include "compiler/box.h"
#include "compiler/spec.h"

namespace reshard {

struct BufferDesc {
  std::string name;
  Dtype dtype = Dtype::bf16;
  std::vector<int64_t> shape;
  int64_t elements() const;
};

/// Logical coordinate c (lo <= c < hi) of `tensor` lives in buffer
/// `buffer + sum_{d in buffer_dims} (c_d - lo_d) * stride_d`, at element
/// `offset + sum_{d not in buffer_dims} (c_d - lo_d) * stride_d`.
struct Fragment {
  int tensor = 0;
  Box box;
  uint32_t buffer = 0;
  uint64_t offset = 0;
  std::array<int64_t, kMaxDims> stride{};
  uint32_t buffer_dims = 0;

  /// The strided region of `sub` (a box inside this fragment), modes in logical dim order.
  StridedRegion RegionOf(const Box& sub) const;
};

struct RankLayout {
  std::vector<BufferDesc> buffers;
  std::vector<Fragment> fragments;
};

struct FragmentRef {
  int rank = 0;
  int index = 0;  // into RankLayout::fragments
};

struct Expansion {
  std::vector<RankLayout> ranks;
  std::vector<std::vector<FragmentRef>> by_tensor;  // per model tensor
};

/// Throws reshard::Error naming the layout file and JSON path of the offending rule.
Expansion Expand(const ModelSpec& model, const LayoutSpec& layout);

/// Mixed-radix coordinates of `rank` in `mesh` (last axis fastest).
std::vector<int64_t> MeshCoords(const Mesh& mesh, int64_t rank);

}  // namespace reshard
