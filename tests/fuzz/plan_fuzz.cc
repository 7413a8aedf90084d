// libFuzzer harness: plan bytes -> Plan::from_bytes -> every rank's check ->
// validate -> replay of every rank on exactly-sized buffers. A refusal
// (reshard::Error) anywhere is fine; a crash, a sanitizer report, a hang or
// any other exception is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "runtime/error.h"
#include "runtime/plan.h"
#include "tests/fuzz/replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace reshard;
  try {
    Plan plan = Plan::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.rsplan");
    if (!fuzz::CheckAllRanks(plan)) return 0;
    fuzz::Validate(plan);
    fuzz::ReplayAll(plan);
  } catch (const Error&) {
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plan_fuzz: unexpected exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}
