// `reshard validate`: proves a plan correct by symbolic execution with box
// algebra. Every step's regions are mapped back to (tensor, logical box)
// through the rank's fragment tables; staging contents and messages are
// tracked as boxes, never as elements, so trillion-parameter plans check in
// seconds.
//
// Quantized buffers (block-scaled FP8) hold derived values, so what is proven
// for them is their provenance, not their arithmetic: every FP8 element of a
// destination is written exactly once, with the FP8 values of the right
// logical element, quantized over the destination's own blocks by a quantize
// op that saw whole blocks of the right source values (on the receiver, or on
// the sender and then moved unchanged); every scale element is written exactly
// once, by such an op or moved unchanged from one; and a dequantize op reads
// the scales of exactly the blocks its FP8 values lie in. That the FP8 bits
// and scales are the reference quantization of those values is the kernels'
// contract, tested against runtime/quant.h, and `reshard run` compares every
// element and scale with the reference.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "plan_generated.h"

namespace reshard {

struct ValidateReport {
  std::vector<std::string> errors;  // first `max_errors` problems, in words
  size_t total_errors = 0;
  uint64_t steps = 0, messages = 0, dest_elements = 0;
  bool ok() const { return total_errors == 0; }
};

/// `program(r)` returns rank r's (verified) program.
ValidateReport ValidatePlan(const fb::Plan& plan, const std::function<const fb::Program&(uint32_t)>& program,
                            size_t max_errors = 20);

}  // namespace reshard
