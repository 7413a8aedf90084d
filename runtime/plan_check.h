// The one place where everything a plan says is checked before anything acts
// on it (docs/plan-format.md, "What the checks guarantee"). Plan::open runs
// CheckPlanTables on the plan-wide tables; Plan::program(r) runs CheckProgram
// on rank r's program. Code after these checks may trust the plan: every
// index is in range, every size computation fits in 64 bits, every address a
// step, quant op or fragment reaches lies inside a bound buffer or the staging
// area, and every loop over a region, fragment or scale block is bounded by
// sizes the plan declares (and by the limits below).
#pragma once

#include <cstdint>
#include <string>

#include "plan_generated.h"

namespace reshard {

/// Tensor boxes use 32-bit coordinates (Fragment.lo/hi are uint32).
constexpr uint64_t kMaxTensorExtent = 0xFFFFFFFFu;
/// The synthetic reference computes a scale from all elements of its block:
/// blocks (clipped to the tensor) of more elements are refused.
constexpr uint64_t kMaxScaleBlockElements = uint64_t{1} << 32;
/// The most bytes a buffer may declare (sizes are computed in 64 bits).
constexpr uint64_t kMaxBufferBytes = uint64_t{1} << 62;

/// Checks a verified plan's plan-wide tables: rank maps and the tensor table.
/// Throws reshard::Error("<name>: <what>").
void CheckPlanTables(const fb::Plan& plan, const std::string& name);

/// Checks rank `rank`'s program of a plan that passed CheckPlanTables. Throws
/// reshard::Error("<name>: rank R: [step S (kind): | fragment F: | ...] <what>").
void CheckProgram(const fb::Plan& plan, uint32_t rank, const fb::Program& p, const std::string& name);

}  // namespace reshard
