// One pack, many sends: where a rank packs the same source region into
// staging more than once in a round (a piece it sends to several receivers:
// replicas, a tree's several domains), the copies after the first are dropped
// and their sends read the first one's staging bytes. Plain packs only: a
// quantizing pack (a QuantOp) is still done once per receiver.
#pragma once

#include <cstdint>

#include "compiler/program.h"

namespace reshard {

struct SharedPacks {
  uint64_t packs = 0;  // pack steps dropped
  uint64_t bytes = 0;  // bytes they would have packed
};

SharedPacks SharePacks(PlanIR& ir);

}  // namespace reshard
