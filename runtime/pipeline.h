// Which local phases of a rank's program may overlap a neighbouring round's
// messages. The executor runs round r's messages while it unpacks round r-1
// and packs round r+1, but only where that cannot change a byte: a phase moves
// next to a round's messages only if their footprints (staging bytes, and the
// span of each buffer a region reads or writes: first element to last) do not
// conflict, and the unpack of round r and the
// pack of round r+1 (which then swap places) do not conflict either. Otherwise
// the phase runs in series as before. The plan's serial meaning, which
// `validate` proves, is therefore the meaning of the pipelined run as well.
// `simulate` models the same schedule (sim/workload.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/plan.h"

namespace reshard {

struct PipelineSchedule {
  /// Per round r >= 1: its pack and copy steps run while round r-1's messages fly.
  std::vector<uint8_t> early_pack;
  /// Per round r: its unpack steps run while round r+1's messages fly.
  std::vector<uint8_t> late_unpack;
  uint32_t overlapped_packs = 0, overlapped_unpacks = 0;
};

/// The schedule of a checked program (Plan::program); all zero when `enabled`
/// is false.
PipelineSchedule SchedulePipeline(const fb::Program& program, bool enabled = true);

/// Whether pipelining is on for this process: yes unless the environment sets
/// RESHARD_PIPELINE=0 (for comparisons).
bool PipelineEnabled();

/// The buffers a (buffer) region addresses, each once, ascending.
std::vector<uint32_t> RegionBuffers(const fb::Region& r);

}  // namespace reshard
