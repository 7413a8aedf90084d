#include "compiler/compile_file.h"

#include <optional>
#include <vector>

#include "compiler/keep_until_exit.h"
#include "compiler/phase_times.h"
#include "compiler/write_file.h"

namespace reshard {

nlohmann::ordered_json CompilePlanFile(const CompileInputs& in, const CompileOptions& opt, const std::string& out) {
  PlanIR ir = BuildPlan(in, opt);
  std::optional<Phase> phase(std::in_place, "serialize");
  std::vector<uint8_t> bytes = EmitPlan(in, ir);
  phase.emplace("write");
  WriteFileAtomic(out, bytes);
  phase.reset();
  nlohmann::ordered_json summary = CompileSummary(out, opt.strategy, ir, bytes.size());
  Dispose(std::move(ir));  // a CLI process leaves it to the exit (SetKeepUntilExit)
  return summary;
}

}  // namespace reshard
