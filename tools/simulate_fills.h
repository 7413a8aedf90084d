// `reshard compile --simulate-fills`: the plan compiled once per way of
// filling its rounds (the list `--search-fills` chooses from by an
// estimate), each simulated as `reshard simulate` would, and the one
// predicted fastest kept. SimGrid runs one simulation per process, so every
// fill is compiled and simulated in a child process of its own, as many at
// once as the machine has cores (at most 8).
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "compiler/compile.h"
#include "compiler/program.h"

namespace reshard::cli {

/// Compiles every fill into a temporary file beside `out`, simulates each on
/// the inputs' cluster and renames the fastest to `out` (ties: the earlier
/// fill); the others are removed, also on failure. Returns the kept plan's
/// summary with "fills" (each fill's prediction), "kept_fill",
/// "predicted_seconds" and "lower_bound_seconds" added. `progress` is called
/// with the fills done and the fills in all. Throws reshard::Error.
nlohmann::ordered_json SimulateFills(const CompileInputs& in, const CompileOptions& opt, const std::string& out,
                                     const std::function<void(size_t done, size_t total)>& progress);

}  // namespace reshard::cli
