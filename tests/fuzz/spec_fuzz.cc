// libFuzzer harness: one JSON document {"model": ..., "from": ..., "to": ...,
// "cluster": ..., "strategy": "direct"|"gather"} -> ParseJson -> the spec
// parsers -> the compiler. A spec refused with reshard::Error is fine; a plan
// that is emitted must pass every check (Plan::program of every rank) and
// validate with no error, and replay cleanly. Anything else is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "compiler/compile.h"
#include "compiler/spec.h"
#include "runtime/error.h"
#include "runtime/plan.h"
#include "tests/fuzz/replay.h"

namespace {

[[noreturn]] void Finding(const std::string& what) {
  std::fprintf(stderr, "spec_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace reshard;
  std::vector<uint8_t> bytes;
  try {
    nlohmann::json j = ParseJson(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
    if (!j.is_object()) return 0;
    for (const char* key : {"model", "from", "to", "cluster"})
      if (!j.contains(key)) return 0;
    CompileOptions opt;
    if (j.contains("strategy") && j["strategy"].is_string()) opt.strategy = j["strategy"].get<std::string>();
    if (opt.strategy != "direct" && opt.strategy != "gather") return 0;
    CompileInputs in = ParseInputs(j["model"], j["from"], j["to"], j["cluster"]);
    bytes = EmitPlan(in, BuildPlan(in, opt));
  } catch (const Error&) {
    return 0;
  } catch (const std::exception& e) {
    Finding(std::string("unexpected exception while compiling: ") + e.what());
  }
  try {
    Plan plan = Plan::from_bytes(bytes, "compiled.rsplan");
    if (!fuzz::CheckAllRanks(plan)) {
      for (uint32_t r = 0; r < plan.num_ranks(); ++r) plan.program(r);  // throws the message
    }
    if (size_t errors = fuzz::Validate(plan)) Finding("validate finds " + std::to_string(errors) + " errors in a compiled plan");
    if (!fuzz::ReplayAll(plan)) Finding("a compiled plan fails its replay");
  } catch (const Error& e) {
    Finding(std::string("a compiled plan is refused: ") + e.what());
  } catch (const std::exception& e) {
    Finding(std::string("unexpected exception on a compiled plan: ") + e.what());
  }
  return 0;
}
