#include "runtime/quant.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"

namespace reshard {
namespace {

std::string Shape(const RegionView& v) {
  std::string s = "(";
  for (int k = 0; k < v.ndim; ++k) {
    if (k) s += ",";
    s += std::to_string(v.shape[k]);
  }
  return s + ")";
}

uint64_t Ceil(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Address of element idx (one index per mode) of a view in quant form.
char* At(const RegionView& v, const uint64_t* idx) {
  uint64_t buf = v.buffer, off = v.offset;
  for (int k = 0; k < v.ndim; ++k) (v.buffer_modes >> k & 1 ? buf : off) += idx[k] * v.stride[k];
  return v.buffers[buf] + off * DtypeSize(v.dtype);
}

float LoadScale(const RegionView& v, const uint64_t* idx) {
  const char* p = At(v, idx);
  if (v.dtype == fb::Dtype::e8m0) return E8m0ToFloat(static_cast<uint8_t>(*p));
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

void StoreScale(const RegionView& v, const uint64_t* idx, float s) {
  char* p = At(v, idx);
  const uint32_t bits = ScaleBits(s, v.dtype == fb::Dtype::e8m0);
  if (v.dtype == fb::Dtype::e8m0) {
    *p = static_cast<char>(bits);
  } else {
    std::memcpy(p, &bits, 4);
  }
}

// Calls fn(outer index array) for every combination of the outer modes.
template <typename Fn>
void ForOuter(int outer, const uint64_t* shape, Fn&& fn) {
  uint64_t idx[4] = {0, 0, 0, 0};
  for (;;) {
    fn(idx);
    int k = outer - 1;
    while (k >= 0 && ++idx[k] == shape[k]) idx[k--] = 0;
    if (k < 0) return;
  }
}

// The amax kinds (quant.h): partial amaxes of a block split across senders,
// the scales of their maximum, and quantizing with scales already there.
void CheckAmaxArgs(const QuantArgs& a) {
  const char* what = a.kind == fb::QuantKind::amax              ? "amax: "
                     : a.kind == fb::QuantKind::scale_from_amax ? "scale_from_amax: "
                                                                : "quantize_scaled: ";
  auto fail = [&](const std::string& msg) { throw Error(what + msg); };
  if (a.block[0] == 0 || a.block[1] == 0) fail("block extents must be positive");
  if (a.kind == fb::QuantKind::scale_from_amax) {
    const int n = a.dst.ndim;
    if (n < 2 || a.src.ndim != n + 1)
      fail("src " + Shape(a.src) + " must be dst " + Shape(a.dst) + " with a leading mode of partial grids");
    for (int k = 0; k < n; ++k)
      if (a.src.shape[k + 1] != a.dst.shape[k])
        fail("src " + Shape(a.src) + " holds grids of another shape than dst " + Shape(a.dst));
    if (a.src.dtype != fb::Dtype::fp32)
      fail(std::string("src is ") + DtypeName(a.src.dtype) + ", expected fp32 amaxes");
    if (a.dst.dtype != fb::Dtype::fp32 && a.dst.dtype != fb::Dtype::e8m0)
      fail(std::string("scales are fp32 or e8m0, not ") + DtypeName(a.dst.dtype));
    return;
  }
  const int n = a.src.ndim;
  const RegionView& grid = a.kind == fb::QuantKind::amax ? a.dst : a.scale;
  if (n < 2 || grid.ndim != n || (a.kind == fb::QuantKind::quantize_scaled && a.dst.ndim != n)) {
    fail("src " + Shape(a.src) + ", dst " + Shape(a.dst) +
         (a.kind == fb::QuantKind::amax ? "" : " and scale " + Shape(a.scale)) +
         " need the same number of modes, at least 2 (outer..., rows, cols)");
  }
  for (int k = 0; k + 2 < n; ++k)
    if (a.src.shape[k] != grid.shape[k] ||
        (a.kind == fb::QuantKind::quantize_scaled && a.src.shape[k] != a.dst.shape[k]))
      fail("outer mode " + std::to_string(k) + " differs: src " + Shape(a.src) + ", dst " + Shape(a.dst));
  const uint64_t R = a.src.shape[n - 2], C = a.src.shape[n - 1];
  if (!KernelSupports(a.src.dtype))
    fail(std::string("src is ") + DtypeName(a.src.dtype) + ", expected bf16, fp16 or fp32");
  if (a.kind == fb::QuantKind::amax) {
    if (a.dst.dtype != fb::Dtype::fp32)
      fail(std::string("dst is ") + DtypeName(a.dst.dtype) + ", expected fp32 amaxes");
    if (a.dst.shape[n - 2] < Ceil(a.origin[0] + R, a.block[0]) ||
        a.dst.shape[n - 1] < Ceil(a.origin[1] + C, a.block[1]))
      fail("grid " + Shape(a.dst) + " does not reach src " + Shape(a.src) + " at (" + std::to_string(a.origin[0]) +
           "," + std::to_string(a.origin[1]) + ")");
    return;
  }
  if (a.dst.dtype != fb::Dtype::fp8_e4m3) fail(std::string("dst is ") + DtypeName(a.dst.dtype) + ", expected fp8_e4m3");
  if (a.dst.shape[n - 2] != R || a.dst.shape[n - 1] != C)
    fail("src " + Shape(a.src) + " and dst " + Shape(a.dst) + " differ");
  if (a.origin[0] >= a.block[0] || a.origin[1] >= a.block[1]) fail("origin lies outside the first block");
  if (a.scale.dtype != fb::Dtype::fp32 && a.scale.dtype != fb::Dtype::e8m0)
    fail(std::string("scales are fp32 or e8m0, not ") + DtypeName(a.scale.dtype));
  if (a.scale.shape[n - 2] != Ceil(a.origin[0] + R, a.block[0]) ||
      a.scale.shape[n - 1] != Ceil(a.origin[1] + C, a.block[1]))
    fail("scale " + Shape(a.scale) + " does not match the blocks of src " + Shape(a.src));
}

// CPU reference of the amax kinds.
void AmaxRegion(const QuantArgs& a) {
  uint64_t i[5] = {}, b[5] = {};
  if (a.kind == fb::QuantKind::scale_from_amax) {
    const int n = a.dst.ndim;
    const uint64_t K = a.src.shape[0];
    const bool e8m0 = a.dst.dtype == fb::Dtype::e8m0;
    ForOuter(n, a.dst.shape, [&](const uint64_t* idx) {
      std::copy(idx, idx + n, b);
      std::copy(idx, idx + n, i + 1);
      float amax = 0;
      for (uint64_t k = 0; k < K; ++k) {
        i[0] = k;
        float x;
        std::memcpy(&x, At(a.src, i), 4);
        amax = AmaxStep(amax, x);
      }
      StoreScale(a.dst, b, ScaleFromAmax(amax, e8m0));
    });
    return;
  }
  const int n = a.src.ndim, outer = n - 2;
  const uint64_t R = a.src.shape[n - 2], C = a.src.shape[n - 1];
  if (a.kind == fb::QuantKind::amax) {
    std::vector<float> grid;
    const uint64_t GR = a.dst.shape[n - 2], GC = a.dst.shape[n - 1];
    ForOuter(outer, a.src.shape, [&](const uint64_t* idx) {
      grid.assign(GR * GC, 0.0f);
      std::copy(idx, idx + outer, i);
      std::copy(idx, idx + outer, b);
      for (uint64_t r = 0; r < R; ++r)
        for (uint64_t c = 0; c < C; ++c) {
          i[n - 2] = r, i[n - 1] = c;
          float& g = grid[(a.origin[0] + r) / a.block[0] * GC + (a.origin[1] + c) / a.block[1]];
          g = AmaxStep(g, LoadAsFloat(At(a.src, i), a.src.dtype));
        }
      for (uint64_t r = 0; r < GR; ++r)
        for (uint64_t c = 0; c < GC; ++c) {
          b[n - 2] = r, b[n - 1] = c;
          std::memcpy(At(a.dst, b), &grid[r * GC + c], 4);
        }
    });
    return;
  }
  ForOuter(outer, a.src.shape, [&](const uint64_t* idx) {  // quantize_scaled
    std::copy(idx, idx + outer, i);
    std::copy(idx, idx + outer, b);
    for (uint64_t r = 0; r < R; ++r)
      for (uint64_t c = 0; c < C; ++c) {
        i[n - 2] = r, i[n - 1] = c;
        b[n - 2] = (a.origin[0] + r) / a.block[0], b[n - 1] = (a.origin[1] + c) / a.block[1];
        *At(a.dst, i) = static_cast<char>(QuantizeValue(LoadAsFloat(At(a.src, i), a.src.dtype), LoadScale(a.scale, b)));
      }
  });
}

}  // namespace

void CheckQuantArgs(const QuantArgs& a) {
  if (a.kind == fb::QuantKind::amax || a.kind == fb::QuantKind::scale_from_amax ||
      a.kind == fb::QuantKind::quantize_scaled) {
    CheckAmaxArgs(a);
    return;
  }
  const bool quantize = a.kind == fb::QuantKind::quantize;
  const char* what = quantize ? "quantize: " : "dequantize: ";
  auto fail = [&](const std::string& msg) { throw Error(what + msg); };
  if (a.src.ndim < 2 || a.dst.ndim != a.src.ndim || a.scale.ndim != a.src.ndim) {
    fail("src " + Shape(a.src) + ", dst " + Shape(a.dst) + " and scale " + Shape(a.scale) +
         " need the same number of modes, at least 2 (outer..., rows, cols)");
  }
  const int n = a.src.ndim;
  for (int k = 0; k + 2 < n; ++k) {
    if (a.src.shape[k] != a.dst.shape[k] || a.src.shape[k] != a.scale.shape[k]) {
      fail("outer mode " + std::to_string(k) + " differs: src " + Shape(a.src) + ", dst " + Shape(a.dst) +
           ", scale " + Shape(a.scale));
    }
  }
  if (a.block[0] == 0 || a.block[1] == 0) fail("block extents must be positive");
  if (a.scale.dtype != fb::Dtype::fp32 && a.scale.dtype != fb::Dtype::e8m0) {
    fail(std::string("scales are fp32 or e8m0, not ") + DtypeName(a.scale.dtype));
  }
  const fb::Dtype fp8 = quantize ? a.dst.dtype : a.src.dtype;
  const fb::Dtype wide = quantize ? a.src.dtype : a.dst.dtype;
  if (fp8 != fb::Dtype::fp8_e4m3) fail(std::string(quantize ? "dst" : "src") + " is " + DtypeName(fp8) + ", expected fp8_e4m3");
  if (!KernelSupports(wide)) fail(std::string(quantize ? "src" : "dst") + " is " + DtypeName(wide) + ", expected bf16, fp16 or fp32");
  const uint64_t R = a.src.shape[n - 2], C = a.src.shape[n - 1];
  uint64_t want_r, want_c;
  if (quantize) {
    if (a.origin[0] + a.dst.shape[n - 2] > R || a.origin[1] + a.dst.shape[n - 1] > C) {
      fail("dst " + Shape(a.dst) + " at (" + std::to_string(a.origin[0]) + "," + std::to_string(a.origin[1]) +
           ") leaves src " + Shape(a.src));
    }
    want_r = Ceil(R, a.block[0]);
    want_c = Ceil(C, a.block[1]);
  } else {
    if (a.dst.shape[n - 2] != R || a.dst.shape[n - 1] != C) fail("src " + Shape(a.src) + " and dst " + Shape(a.dst) + " differ");
    if (a.origin[0] >= a.block[0] || a.origin[1] >= a.block[1]) fail("origin lies outside the first block");
    want_r = Ceil(a.origin[0] + R, a.block[0]);
    want_c = Ceil(a.origin[1] + C, a.block[1]);
  }
  if (a.scale.shape[n - 2] != want_r || a.scale.shape[n - 1] != want_c) {
    fail("scale " + Shape(a.scale) + " should have " + std::to_string(want_r) + "x" + std::to_string(want_c) +
         " blocks of " + std::to_string(a.block[0]) + "x" + std::to_string(a.block[1]) + " for src " + Shape(a.src));
  }
}

void QuantRegion(const QuantArgs& a) {
  CheckQuantArgs(a);
  if (a.kind != fb::QuantKind::quantize && a.kind != fb::QuantKind::dequantize) {
    AmaxRegion(a);
    return;
  }
  const int n = a.src.ndim, outer = n - 2;
  const bool e8m0 = a.scale.dtype == fb::Dtype::e8m0;
  uint64_t i[4] = {0, 0, 0, 0}, o[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
  const uint64_t br = a.block[0], bc = a.block[1];
  if (a.kind == fb::QuantKind::dequantize) {
    const uint64_t R = a.src.shape[n - 2], C = a.src.shape[n - 1];
    ForOuter(outer, a.src.shape, [&](const uint64_t* idx) {
      std::copy(idx, idx + outer, i);
      std::copy(idx, idx + outer, b);
      for (uint64_t r = 0; r < R; ++r) {
        for (uint64_t c = 0; c < C; ++c) {
          i[n - 2] = r, i[n - 1] = c;
          b[n - 2] = (a.origin[0] + r) / br, b[n - 1] = (a.origin[1] + c) / bc;
          const float s = LoadScale(a.scale, b);
          StoreFromFloat(At(a.dst, i), a.dst.dtype, DequantizeValue(static_cast<uint8_t>(*At(a.src, i)), s));
        }
      }
    });
    return;
  }
  const uint64_t R = a.src.shape[n - 2], C = a.src.shape[n - 1];
  const uint64_t DR = a.dst.shape[n - 2], DC = a.dst.shape[n - 1];
  ForOuter(outer, a.src.shape, [&](const uint64_t* idx) {
    std::copy(idx, idx + outer, i);
    std::copy(idx, idx + outer, o);
    std::copy(idx, idx + outer, b);
    for (uint64_t r0 = 0; r0 < R; r0 += br) {
      for (uint64_t c0 = 0; c0 < C; c0 += bc) {
        const uint64_t r1 = std::min(R, r0 + br), c1 = std::min(C, c0 + bc);
        float amax = 0;
        for (uint64_t r = r0; r < r1; ++r)
          for (uint64_t c = c0; c < c1; ++c) {
            i[n - 2] = r, i[n - 1] = c;
            amax = AmaxStep(amax, LoadAsFloat(At(a.src, i), a.src.dtype));
          }
        const float s = ScaleFromAmax(amax, e8m0);
        b[n - 2] = r0 / br, b[n - 1] = c0 / bc;
        StoreScale(a.scale, b, s);
        // The part of the block that dst keeps.
        const uint64_t kr0 = std::max<uint64_t>(r0, a.origin[0]), kr1 = std::min<uint64_t>(r1, a.origin[0] + DR);
        const uint64_t kc0 = std::max<uint64_t>(c0, a.origin[1]), kc1 = std::min<uint64_t>(c1, a.origin[1] + DC);
        for (uint64_t r = kr0; r < kr1; ++r)
          for (uint64_t c = kc0; c < kc1; ++c) {
            i[n - 2] = r, i[n - 1] = c;
            o[n - 2] = r - a.origin[0], o[n - 1] = c - a.origin[1];
            *At(a.dst, o) = static_cast<char>(QuantizeValue(LoadAsFloat(At(a.src, i), a.src.dtype), s));
          }
      }
    }
  });
}

}  // namespace reshard
