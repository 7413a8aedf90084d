// One pack, many sends: where a rank packs the same source region into
// staging more than once in a round (a piece it sends to several receivers:
// replicas, a tree's several domains), the copies after the first are dropped
// and their readers read the first one's staging bytes. This covers plain
// packs and the sender's block-scaled packs alike: a quantize (FP8 values and
// their scales) or an amax grid of the same source, with the same quant op
// and the same staging layout, writes the same bytes, so it is done once.
//
// A copy is dropped only where that is provably the same: its staging bytes
// are dense runs, every step of the round that reads them reads them at a
// staging offset and lies within one run (it is redirected), and no other step
// of the round writes or reads them through a region, or writes the first
// copy's bytes. Packs in different rounds are not merged (the staging arenas
// of router.h hold a round's bytes for one round after it only).
#pragma once

#include <cstdint>

#include "compiler/program.h"

namespace reshard {

struct SharedPacks {
  uint64_t packs = 0;        // pack steps dropped
  uint64_t bytes = 0;        // staging bytes they would have written
  uint64_t quant_packs = 0;  // of them, block-scaled ones (quantize, amax)
};

SharedPacks SharePacks(PlanIR& ir);

}  // namespace reshard
