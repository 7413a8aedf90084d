// The scalar rules of block-scaled FP8 (see runtime/quant.h): plain inline
// C++ with no flatbuffers or CUDA headers, shared by the CPU reference, the
// synthetic checks and the CUDA kernels, so that all compute the same bits.
#pragma once

#include <cstdint>

#include "runtime/float_bits.h"

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

}  // namespace reshard
