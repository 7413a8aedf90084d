// Element conversions between the dtypes the runtime moves. Narrowing rounds to
// nearest, ties to even; NaN stays NaN, overflow becomes infinity.
#pragma once

#include <cstdint>
#include <cstring>

#include "runtime/plan.h"

namespace reshard {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float Fp16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    return BitsFloat(sign | FloatBits(static_cast<float>(mant) * 0x1p-24f));
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t FloatToFp16(float value) {
  // After F. Giesen's float_to_half_fast3_rtne: subnormals are rounded by the
  // FPU (adding a magic number that aligns the mantissa), normals by adding
  // half an ulp minus one plus the lowest kept bit.
  constexpr uint32_t kF32Inf = 255u << 23;
  constexpr uint32_t kF16Max = (127u + 16) << 23;  // 65536: everything above rounds to inf
  constexpr uint32_t kDenormMagic = ((127u - 15) + (23 - 10) + 1) << 23;
  uint32_t f = FloatBits(value);
  uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint16_t o;
  if (f >= kF16Max) {
    o = f > kF32Inf ? 0x7e00 : 0x7c00;
  } else if (f < (113u << 23)) {
    float r = BitsFloat(f) + BitsFloat(kDenormMagic);
    o = static_cast<uint16_t>(FloatBits(r) - kDenormMagic);
  } else {
    uint32_t mant_odd = (f >> 13) & 1u;
    f += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;
    f += mant_odd;
    o = static_cast<uint16_t>(f >> 13);
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

/// The dtypes the CPU kernels convert between (fp8 and e8m0 come later).
inline bool KernelSupports(fb::Dtype d) {
  return d == fb::Dtype::bf16 || d == fb::Dtype::fp16 || d == fb::Dtype::fp32;
}

/// One element of dtype `d` at `p` as float (supported dtypes only).
inline float LoadAsFloat(const void* p, fb::Dtype d) {
  uint16_t h;
  switch (d) {
    case fb::Dtype::bf16:
      std::memcpy(&h, p, 2);
      return Bf16ToFloat(h);
    case fb::Dtype::fp16:
      std::memcpy(&h, p, 2);
      return Fp16ToFloat(h);
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

/// Stores `f` as one element of dtype `d` at `p`, rounding to nearest even.
inline void StoreFromFloat(void* p, fb::Dtype d, float f) {
  uint16_t h;
  switch (d) {
    case fb::Dtype::bf16:
      h = FloatToBf16(f);
      std::memcpy(p, &h, 2);
      break;
    case fb::Dtype::fp16:
      h = FloatToFp16(f);
      std::memcpy(p, &h, 2);
      break;
    default:
      std::memcpy(p, &f, 4);
      break;
  }
}

}  // namespace reshard
