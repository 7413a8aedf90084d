// `reshard validate`: proves a plan correct by symbolic execution with box
// algebra. Every step's regions are mapped back to (tensor, logical box)
// through the rank's fragment tables; staging contents and messages are
// tracked as boxes, never as elements, so trillion-parameter plans check in
// seconds.
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
