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

}  // namespace reshard
