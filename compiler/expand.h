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
  bool held_transposed = false;  // BufferRule::held_transposed
  float offset = 0;              // BufferRule::offset: holds the model's values plus this
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
  /// True if RegionOf(sub)'s modes fit the plan's Region format before they
  /// are coalesced - at most 4, every extent and stride under 2^32 - and so
  /// surely after (coalescing drops modes, merges extents only below 2^32
  /// and keeps some of the strides). False says nothing: the coalesced
  /// region may still fit.
  bool ModesFit(const Box& sub) const {
    if (sub.ndim > 4) return false;
    for (int d = 0; d < sub.ndim; ++d)
      if (sub.extent(d) >= (int64_t{1} << 32) || stride[d] >= (int64_t{1} << 32)) return false;
    return true;
  }
};

struct RankLayout {
  std::vector<BufferDesc> buffers;
  std::vector<Fragment> fragments;
};

struct FragmentRef {
  int rank = 0;
  int index = 0;  // into RankLayout::fragments
};

/// The scales of a quantized tensor as one layout stores them: a logical
/// tensor of its own whose element c is the scale of the block of tensor `of`
/// spanning [c_d * block_d, (c_d + 1) * block_d) per dim (clipped to the
/// tensor). Block extents are 1 on every dim but the last two.
struct ScaleTensor {
  int of = 0;
  Dtype dtype = Dtype::fp32;    // fp32 or e8m0
  std::array<int64_t, kMaxDims> block{};
  Box box;                      // in blocks
  std::string name;             // "<tensor>#scale"
  int side = 0;                 // 0 training, 1 inference (set when both expansions meet)
};

struct Expansion {
  std::vector<RankLayout> ranks;
  std::vector<std::vector<FragmentRef>> by_tensor;  // per model tensor
  /// Scale tensors; a fragment of scale tensor k names tensor
  /// model.tensors.size() + k and is not listed in by_tensor.
  std::vector<ScaleTensor> scales;
};

/// Throws reshard::Error naming the layout file and JSON path of the offending rule.
/// The ranks expand on `threads` threads (0: the machine's, where the layout
/// has 64 ranks or more); the expansion and any error message are the same
/// on any number.
Expansion Expand(const ModelSpec& model, const LayoutSpec& layout, size_t threads = 0);

/// Mixed-radix coordinates of `rank` in `mesh` (last axis fastest).
std::vector<int64_t> MeshCoords(const Mesh& mesh, int64_t rank);

}  // namespace reshard
