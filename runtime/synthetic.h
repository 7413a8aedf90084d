// Deterministic weights for end-to-end checks: every element of a logical
// tensor gets a value derived from (tensor, logical coordinate) alone, so a
// destination can check what it received without seeing the source.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/plan.h"
#include "runtime/session.h"
#include "runtime/transport.h"

namespace reshard {

/// The bits of the synthetic value of element `index` (row-major linear index
/// in the tensor family's logical box) of tensor `tensor`, in `dtype`: a hash
/// of the two mapped to a finite normal value of magnitude in [2^-14, 2^16),
/// any sign and mantissa (so conversions between bf16, fp16 and fp32 stay
/// finite and exact up to the narrower mantissa). 2-byte dtypes use the low 16 bits.
uint32_t SyntheticBits(uint32_t tensor, uint64_t index, fb::Dtype dtype);
/// The same value as a float (exact for bf16, fp16, fp32).
float SyntheticValue(uint32_t tensor, uint64_t index, fb::Dtype dtype);

/// The NaN pattern destination buffers are poisoned with.
uint32_t PoisonBits(fb::Dtype dtype);

struct WrongElement {
  std::string tensor;            // tensor family name
  std::vector<uint64_t> coord;   // logical coordinate
  std::string buffer;            // buffer name
  fb::Dtype dtype = fb::Dtype::fp32;  // of the buffer
  uint32_t expected_bits = 0, got_bits = 0;
  float expected = 0, got = 0;
};

struct CheckResult {
  uint64_t checked = 0;
  uint64_t wrong = 0;
  std::vector<WrongElement> first;  // at most `keep` of them
};

/// `buffers[i]` is the memory bound to program buffer i (program dtype and shape).
/// Writes every role-0 (source) fragment's elements: the tensor's synthetic
/// value converted to the buffer dtype.
void FillSources(const Plan& plan, const fb::Program& program, const std::vector<char*>& buffers);
/// Fills every buffer that holds a role-1 (destination) fragment with PoisonBits.
void PoisonDestinations(const fb::Program& program, const std::vector<char*>& buffers);
/// Compares every element of every role-1 fragment with the expected value.
CheckResult CheckDestinations(const Plan& plan, const fb::Program& program, const std::vector<char*>& buffers,
                              size_t keep = 10);
/// "tensor 'w' [3,5] in buffer 'b': expected 1.5 (0x3fc0), got nan (0x7fda)".
std::string FormatWrong(const WrongElement& w);

struct SyntheticRun {
  RunStats stats;
  CheckResult check;
};

/// The whole `reshard run` of one rank: allocates its buffers, poisons the
/// destinations, fills the sources, runs a Session over `transport`, checks.
/// `ready`, if set, is called right before the run (`reshard run` waits there
/// for every rank, so that its timing starts together).
SyntheticRun RunSynthetic(const Plan& plan, uint32_t rank, Transport& transport, size_t keep = 10,
                          const std::function<void()>& ready = {});

}  // namespace reshard
