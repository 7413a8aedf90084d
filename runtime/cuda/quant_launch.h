// One launch of the quantize or dequantize kernel (copy_kernels.cu), and the
// per-element and per-block work of those kernels. Host and device share this
// header: the CPU tests run the same code over a launch on host memory
// against the CPU reference (runtime/quant.h). Plain C++, like copy_launch.h.
//
// A launch covers `outer` combinations of a QuantArgs' outer modes; each has
// its own base address per side (buffer modes resolved on the host), and
// rows and cols step by the same strides in every combination.
#pragma once

#include <cstdint>
#include <cstring>

#include "runtime/cuda/copy_launch.h"
#include "runtime/quant_rules.h"

namespace reshard::cuda {

struct QuantSide {
  int64_t row_stride = 0, col_stride = 0;  // elements
  char* base[kMaxSlots] = {};              // per outer combination
};

// The QuantKinds of schema/plan.fbs, as the launch runs them:
// - amax: src values -> dst, a grid of fp32 block amaxes (dst_rows x dst_cols);
// - scale_from_amax: `parts` grids of amaxes (src, `part_stride` elements
//   apart) -> `scale`, rows x cols of them;
// - quantize_scaled: src values -> dst FP8 with the scales in `scale`.
enum class QuantMode : uint8_t { dequantize, quantize, amax, scale_from_amax, quantize_scaled };

struct QuantLaunch {
  QuantMode mode = QuantMode::quantize;
  Elem wide = Elem::bf16;    // the non-FP8 side's dtype (dst of dequantize, src of quantize)
  bool e8m0 = false;         // scale dtype: e8m0, else fp32
  uint32_t outer = 0;        // outer combinations in this launch
  uint64_t rows = 0, cols = 0;          // src extents
  uint64_t dst_rows = 0, dst_cols = 0;  // dst extents (quantize: the kept sub-box; amax: the grid)
  uint32_t origin[2] = {0, 0}, block[2] = {1, 1};
  uint32_t parts = 1;       // scale_from_amax: partial grids per block
  int64_t part_stride = 0;  // scale_from_amax: elements from one grid to the next
  QuantSide src, dst, scale;
};

RESHARD_HD inline uint32_t WideSize(Elem e) { return e == Elem::fp32 ? 4 : 2; }

RESHARD_HD inline float LoadWide(const char* p, Elem e) {
  if (e == Elem::fp32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return e == Elem::bf16 ? Bf16ToFloat(h) : Fp16ToFloat(h);
}

RESHARD_HD inline void StoreWide(char* p, Elem e, float f) {
  if (e == Elem::fp32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = e == Elem::bf16 ? FloatToBf16(f) : FloatToFp16(f);
  std::memcpy(p, &h, 2);
}

RESHARD_HD inline char* At(const QuantSide& s, uint32_t o, uint64_t r, uint64_t c, uint32_t esize) {
  return s.base[o] + (static_cast<int64_t>(r) * s.row_stride + static_cast<int64_t>(c) * s.col_stride) * esize;
}

RESHARD_HD inline float LoadScale(const QuantLaunch& l, uint32_t o, uint64_t br, uint64_t bc) {
  const char* p = At(l.scale, o, br, bc, l.e8m0 ? 1 : 4);
  if (l.e8m0) return E8m0ToFloat(static_cast<uint8_t>(*p));
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

RESHARD_HD inline void StoreScale(const QuantLaunch& l, uint32_t o, uint64_t br, uint64_t bc, float s) {
  char* p = At(l.scale, o, br, bc, l.e8m0 ? 1 : 4);
  const uint32_t bits = ScaleBits(s, l.e8m0);
  if (l.e8m0) {
    *p = static_cast<char>(bits);
  } else {
    std::memcpy(p, &bits, 4);
  }
}

/// Dequantizes element i (row-major over outer, rows, cols) of a launch.
RESHARD_HD inline void DequantElement(const QuantLaunch& l, uint64_t i) {
  const uint64_t c = i % l.cols, r = (i / l.cols) % l.rows;
  const uint32_t o = static_cast<uint32_t>(i / (l.cols * l.rows));
  const float s = LoadScale(l, o, (l.origin[0] + r) / l.block[0], (l.origin[1] + c) / l.block[1]);
  const uint8_t q = static_cast<uint8_t>(*At(l.src, o, r, c, 1));
  StoreWide(At(l.dst, o, r, c, WideSize(l.wide)), l.wide, DequantizeValue(q, s));
}

/// Quantizes element i (row-major over outer, rows, cols) with the scale already in `scale`.
RESHARD_HD inline void QuantizeScaledElement(const QuantLaunch& l, uint64_t i) {
  const uint64_t c = i % l.cols, r = (i / l.cols) % l.rows;
  const uint32_t o = static_cast<uint32_t>(i / (l.cols * l.rows));
  const float s = LoadScale(l, o, (l.origin[0] + r) / l.block[0], (l.origin[1] + c) / l.block[1]);
  const float x = LoadWide(At(l.src, o, r, c, WideSize(l.wide)), l.wide);
  *At(l.dst, o, r, c, 1) = static_cast<char>(QuantizeValue(x, s));
}

/// The scale of grid element i (row-major over outer, rows, cols): the
/// largest of its `parts` partial amaxes.
RESHARD_HD inline void ScaleFromAmaxElement(const QuantLaunch& l, uint64_t i) {
  const uint64_t c = i % l.cols, r = (i / l.cols) % l.rows;
  const uint32_t o = static_cast<uint32_t>(i / (l.cols * l.rows));
  float amax = 0;
  for (uint32_t k = 0; k < l.parts; ++k) {
    float x;
    std::memcpy(&x, At(l.src, o, r, c, 4) + static_cast<int64_t>(k) * l.part_stride * 4, 4);
    amax = AmaxStep(amax, x);
  }
  StoreScale(l, o, r, c, ScaleFromAmax(amax, l.e8m0));
}

/// The src rows (or cols, q = 1) of an amax launch inside grid row (col) g: [lo, hi), empty if none.
RESHARD_HD inline void AmaxSpan(const QuantLaunch& l, int q, uint64_t g, uint64_t& lo, uint64_t& hi) {
  const uint64_t n = q == 0 ? l.rows : l.cols;
  const uint64_t first = g * l.block[q], last = first + l.block[q];  // in grid coordinates
  lo = first > l.origin[q] ? first - l.origin[q] : 0;
  hi = last > l.origin[q] ? last - l.origin[q] : 0;
  if (hi > n) hi = n;
  if (lo > hi) lo = hi;
}

/// Element k (row-major) of src inside grid block b (row-major over outer,
/// grid rows, grid cols) of an amax launch: false past its end.
RESHARD_HD inline bool AmaxElement(const QuantLaunch& l, uint64_t b, uint64_t k, uint32_t& o, uint64_t& r,
                                   uint64_t& c) {
  const uint64_t gc = b % l.dst_cols, gr = (b / l.dst_cols) % l.dst_rows;
  o = static_cast<uint32_t>(b / (l.dst_cols * l.dst_rows));
  uint64_t r0, r1, c0, c1;
  AmaxSpan(l, 0, gr, r0, r1);
  AmaxSpan(l, 1, gc, c0, c1);
  const uint64_t w = c1 - c0;
  if (w == 0 || k >= (r1 - r0) * w) return false;
  r = r0 + k / w;
  c = c0 + k % w;
  return true;
}

/// Stores grid block b's amax.
RESHARD_HD inline void StoreAmax(const QuantLaunch& l, uint64_t b, float amax) {
  const uint64_t gc = b % l.dst_cols, gr = (b / l.dst_cols) % l.dst_rows;
  const uint32_t o = static_cast<uint32_t>(b / (l.dst_cols * l.dst_rows));
  std::memcpy(At(l.dst, o, gr, gc, 4), &amax, 4);
}

/// The blocks of outer combination o: rows and cols of the block grid.
RESHARD_HD inline uint64_t BlockRows(const QuantLaunch& l) { return (l.rows + l.block[0] - 1) / l.block[0]; }
RESHARD_HD inline uint64_t BlockCols(const QuantLaunch& l) { return (l.cols + l.block[1] - 1) / l.block[1]; }

/// Block b of a quantize launch (row-major over outer, block rows, block cols).
RESHARD_HD inline void BlockCoords(const QuantLaunch& l, uint64_t b, uint32_t& o, uint64_t& br, uint64_t& bc) {
  const uint64_t nbc = BlockCols(l), nbr = BlockRows(l);
  bc = b % nbc;
  br = (b / nbc) % nbr;
  o = static_cast<uint32_t>(b / (nbc * nbr));
}

/// Element k (row-major) of block b of a quantize launch: false past its end.
RESHARD_HD inline bool BlockElement(const QuantLaunch& l, uint64_t b, uint64_t k, uint32_t& o, uint64_t& r,
                                    uint64_t& c) {
  uint64_t br, bc;
  BlockCoords(l, b, o, br, bc);
  const uint64_t r0 = br * l.block[0], c0 = bc * l.block[1];
  const uint64_t h = (r0 + l.block[0] < l.rows ? r0 + l.block[0] : l.rows) - r0;
  const uint64_t w = (c0 + l.block[1] < l.cols ? c0 + l.block[1] : l.cols) - c0;
  if (k >= h * w) return false;
  r = r0 + k / w;
  c = c0 + k % w;
  return true;
}

/// The largest finite magnitude among the src elements of block b - a scale
/// block of a quantize launch, a grid block of an amax launch - from the
/// `first`-th on, every `step`-th: one thread's share (first = the thread,
/// step = the threads), or all of them (0, 1).
RESHARD_HD inline float BlockAmax(const QuantLaunch& l, uint64_t b, uint64_t first, uint64_t step) {
  const bool grid = l.mode == QuantMode::amax;
  uint32_t o;
  uint64_t r, c;
  float amax = 0;
  for (uint64_t k = first; grid ? AmaxElement(l, b, k, o, r, c) : BlockElement(l, b, k, o, r, c); k += step)
    amax = AmaxStep(amax, LoadWide(At(l.src, o, r, c, WideSize(l.wide)), l.wide));
  return amax;
}

/// Writes block b's scale `s` and the FP8 values of its elements that dst keeps.
RESHARD_HD inline void QuantizeBlockElement(const QuantLaunch& l, uint32_t o, uint64_t r, uint64_t c, float s) {
  if (r < l.origin[0] || c < l.origin[1] || r - l.origin[0] >= l.dst_rows || c - l.origin[1] >= l.dst_cols) return;
  const float x = LoadWide(At(l.src, o, r, c, WideSize(l.wide)), l.wide);
  *At(l.dst, o, r - l.origin[0], c - l.origin[1], 1) = static_cast<char>(QuantizeValue(x, s));
}

}  // namespace reshard::cuda
