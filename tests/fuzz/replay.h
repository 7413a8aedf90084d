// What the fuzz harnesses do with a plan the checks accept: validate it and
// replay every rank on buffers of exactly the declared sizes (heap
// allocations of that size, so AddressSanitizer sees any access past them),
// with a transport that reads every byte a send names and writes every byte a
// receive names. Plans too large for a fuzzing run are skipped by size, never
// by content.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/plan.h"

namespace reshard::fuzz {

/// Bytes of buffers plus staging a replayed rank may declare.
constexpr uint64_t kReplayBytes = uint64_t{4} << 20;
/// Fragment elements a replayed rank may hold (their reference values are computed).
constexpr uint64_t kReplayElements = uint64_t{1} << 16;

/// Checks every rank (Plan::program); returns false on the first refusal.
bool CheckAllRanks(const Plan& plan);
/// Runs `reshard validate`'s checks; returns its error count.
size_t Validate(const Plan& plan);
/// Replays every rank that fits kReplayBytes; reshard::Error from a rank is
/// a clean refusal (returned as false), anything else escapes.
bool ReplayAll(const Plan& plan);

}  // namespace reshard::fuzz
