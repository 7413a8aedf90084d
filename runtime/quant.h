// Block-scaled FP8: the CPU reference kernel of the QuantOp step conversion
// (schema/plan.fbs), the oracle the GPU kernels and `reshard run` are checked
// against. The scale rules it applies (quant_rules.h, shared with the CUDA
// kernels, one block = one scale):
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

#include "runtime/kernels.h"
#include "runtime/quant_rules.h"
#include "runtime/plan.h"

namespace reshard {

/// Checks the views' shapes against each other (throws reshard::Error saying
/// what does not fit); the executor runs it before any kernel.
void CheckQuantArgs(const QuantArgs& a);

/// The CPU reference of a QuantOp: dequantize src into dst, or compute the
/// scales of src's blocks into `scale` and quantize into dst.
void QuantRegion(const QuantArgs& a);

}  // namespace reshard
