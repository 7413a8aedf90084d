// Bit-exact conversions between float and the 16-bit float formats, shared by
// the CPU kernels (runtime/dtype.h) and the CUDA kernels (runtime/cuda/), so
// that both round alike: to nearest, ties to even; NaN stays NaN, overflow
// becomes infinity. Plain C++ that nvcc also compiles for the device.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RESHARD_HD __host__ __device__
#else
#define RESHARD_HD
#endif

namespace reshard {

RESHARD_HD inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

RESHARD_HD inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

RESHARD_HD inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

RESHARD_HD inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

RESHARD_HD inline float Fp16ToFloat(uint16_t h) {
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

RESHARD_HD inline uint16_t FloatToFp16(float value) {
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

/// FP8 E4M3 (OCP "E4M3FN": bias 7, no infinities, 0x7F/0xFF NaN, largest
/// finite 448) as float; exact.
RESHARD_HD inline float E4m3ToFloat(uint8_t q) {
  const uint32_t sign = static_cast<uint32_t>(q & 0x80u) << 24;
  const uint32_t exp = (q >> 3) & 0xfu, mant = q & 7u;
  if (exp == 15 && mant == 7) return BitsFloat(sign | 0x7fc00000u);
  // Subnormals are mant * 2^-9, exact in float.
  if (exp == 0) return BitsFloat(sign | FloatBits(static_cast<float>(mant) * 0x1p-9f));
  return BitsFloat(sign | ((exp + 120) << 23) | (mant << 20));
}

/// Float to FP8 E4M3, rounding to nearest, ties to even, saturating: a
/// magnitude of 448 or more (infinity included) becomes +-448; NaN stays NaN
/// (0x7F with the sign); magnitudes under 2^-6 become subnormals (2^-9 steps).
RESHARD_HD inline uint8_t FloatToE4m3(float f) {
  uint32_t u = FloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7f);
  if (u >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7e);  // 448
  if (u < 0x3c800000u) {
    // Subnormal: round |f| * 2^9 to an integer 0..8 with the FPU's default
    // rounding (to nearest even) by adding 2^23; 8 encodes 2^-6, the
    // smallest normal, which is what the integer 8 reads as.
    const float r = BitsFloat(u) * 512.0f + 8388608.0f;
    return static_cast<uint8_t>(sign | (FloatBits(r) - 0x4b000000u));
  }
  // Normal: keep 3 mantissa bits, rounding at bit 20 to nearest even, then
  // rebias the exponent from 127 to 7. Below 448 the result stays finite.
  u += 0x7ffffu + ((u >> 20) & 1u);
  return static_cast<uint8_t>(sign | ((u >> 20) - (120u << 3)));
}

/// E8M0 (OCP MX scale: an exponent with bias 127, 0xFF NaN) as float: 2^(e-127).
RESHARD_HD inline float E8m0ToFloat(uint8_t e) {
  if (e == 0xff) return BitsFloat(0x7fc00000u);
  if (e == 0) return 0x1p-127f;  // the one value that is subnormal in float
  return BitsFloat(static_cast<uint32_t>(e) << 23);
}

/// floor(log2(|f|)) of a finite nonzero float, subnormals included.
RESHARD_HD inline int FloorLog2(float f) {
  const uint32_t u = FloatBits(f) & 0x7fffffffu;
  const int exp = static_cast<int>(u >> 23);
  if (exp > 0) return exp - 127;
  int top = 22;  // highest set mantissa bit of a subnormal
  while (top > 0 && !((u >> top) & 1u)) --top;
  return top - 149;
}

}  // namespace reshard
