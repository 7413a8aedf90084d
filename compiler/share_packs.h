// One pack, many sends: where a rank packs the same source region into
// staging more than once in a round (a piece it sends to several receivers:
// replicas, a tree's several domains), the copies after the first are dropped
// and their readers read the first one's staging bytes. This covers plain
// packs and the sender's block-scaled packs alike: a quantize (FP8 values and
// their scales) or an amax grid of the same source, with the same quant op
// and the same staging layout, writes the same bytes, so it is done once.
//
// A copy is dropped only where that is provably the same: its staging bytes
// are dense runs, and every step of the round that reads any of them reads
// them at a staging offset (not through a region), in a span holding nothing
// but repeats moved by one distance; it is redirected there, and the span it
// then reads holds nothing but their first copies. A reader redirected keeps
// all its repeats dropped, or none. Packs in different rounds are not merged
// (the staging arenas of router.h hold a round's bytes for one round after
// it only).
#pragma once

#include <cstdint>

#include "compiler/program.h"

namespace reshard {

SharedPacks SharePacks(PlanIR& ir);

}  // namespace reshard
