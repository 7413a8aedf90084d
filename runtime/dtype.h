// Element conversions between the dtypes the runtime moves. Narrowing rounds to
// nearest, ties to even; NaN stays NaN, overflow becomes infinity.
#pragma once

#include <cstdint>
#include <cstring>

#include "runtime/float_bits.h"
#include "runtime/plan.h"

namespace reshard {

/// The dtypes the CPU kernels convert between element by element (fp8 and
/// e8m0 are only moved as they are, or converted by quant ops: quant.h).
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
