// Block-scaled FP8: the scale rules of the formats a layout's `quant` names,
// and the CPU reference kernel of the QuantOp step conversion (schema/plan.fbs).
// The rules are plain inline functions so that the CUDA kernels compute the
// same bits; the CPU kernel is the oracle the GPU kernels and `reshard run`
// are checked against.
//
// Rules (one block = one scale):
// - amax is the largest finite magnitude in the block; NaN and infinities do
//   not count (NaN elements stay NaN, infinities saturate to +-448).
// - fp32 scales (FP8 E4M3 with block, per-channel or per-tensor scales, the
//   DeepSeek-V3 `weight_scale_inv`): s = amax / 448 in float; q = E4M3(x / s).
// - e8m0 scales (MXFP8, OCP MX v1.0): s = 2^(floor(log2 amax) - 8), 8 being
//   E4M3's largest exponent, clamped to 2^-127 .. 2^127; q = E4M3(x / s).
// - A block with amax 0 (all zeros, or nothing finite) has s = 1 and q = 0
//   for its zeros; the same when amax / 448 underflows to 0.
// - E4M3 rounds to nearest even and saturates at 448 (float_bits.h).
// - Dequantized: x' = E4M3ToFloat(q) * s in float, then rounded to the
//   destination dtype.
#pragma once

#include <cstdint>

#include "runtime/float_bits.h"
#include "runtime/kernels.h"
#include "runtime/plan.h"

namespace reshard {

constexpr float kE4m3Max = 448.0f;

/// The scale of a block whose largest finite magnitude is `amax`, as float.
RESHARD_HD inline float ScaleFromAmax(float amax, bool e8m0) {
  if (!(amax > 0)) return 1.0f;
  if (e8m0) {
    int x = FloorLog2(amax) - 8;
    x = x < -127 ? -127 : (x > 127 ? 127 : x);
    return E8m0ToFloat(static_cast<uint8_t>(x + 127));
  }
  const float s = amax / kE4m3Max;
  return s > 0 ? s : 1.0f;
}

/// The bits a scale is stored as: float bits (fp32) or the biased exponent (e8m0).
RESHARD_HD inline uint32_t ScaleBits(float s, bool e8m0) {
  if (!e8m0) return FloatBits(s);
  return s == 0x1p-127f ? 0u : (FloatBits(s) >> 23);
}

/// Max of |x| over finite x; `amax` starts at 0.
RESHARD_HD inline float AmaxStep(float amax, float x) {
  const float a = x < 0 ? -x : x;
  return (a <= 3.4028235e38f && a > amax) ? a : amax;
}

/// One value quantized with scale `s`.
RESHARD_HD inline uint8_t QuantizeValue(float x, float s) { return FloatToE4m3(x / s); }

/// One FP8 value times its scale.
RESHARD_HD inline float DequantizeValue(uint8_t q, float s) { return E4m3ToFloat(q) * s; }

/// Checks the views' shapes against each other (throws reshard::Error saying
/// what does not fit); the executor runs it before any kernel.
void CheckQuantArgs(const QuantArgs& a);

/// The CPU reference of a QuantOp: dequantize src into dst, or compute the
/// scales of src's blocks into `scale` and quantize into dst.
void QuantRegion(const QuantArgs& a);

}  // namespace reshard
