// Specs in, plan file out: the passes `reshard compile` (tools/cmd_compile.cc)
// and reshard.compile (python/src/compile.cc) both run, in one place.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "compiler/compile.h"

namespace reshard {

/// Passes 2-5 into `out`: builds the plan, writes it atomically (whole or
/// not at all) and returns its CompileSummary (without "seconds", which the
/// caller measures from where it began). Each pass is timed as a Phase
/// (compiler/phase_times.h). Throws reshard::Error.
nlohmann::ordered_json CompilePlanFile(const CompileInputs& in, const CompileOptions& opt, const std::string& out);

}  // namespace reshard
