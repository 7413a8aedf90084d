// Do the weights fit? What each rank of a layout holds (the bytes of every
// buffer it binds, scales included) against the cluster's "gpu_memory_GB".
// `reshard compile` and `reshard init` warn, never refuse: the check counts
// weights only (no KV cache, activations or staging), so a warning means the
// layout cannot run on these GPUs at all.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compiler/expand.h"
#include "compiler/spec.h"

namespace reshard {

/// Bytes of weights per rank of an expansion: every buffer's elements times
/// its dtype's size.
std::vector<uint64_t> RankWeightBytes(const Expansion& e);

/// One side (or, colocated, one GPU of both sides) over the limit: the
/// heaviest such rank, and how many ranks exceed it.
struct MemoryWarning {
  std::string side;              // "train", "infer", or "train+infer" when colocated
  std::string layout;            // the layout file ("train.json, infer.json" when colocated)
  int64_t rank = 0;              // the side's rank (colocated: both sides' rank, one GPU)
  uint64_t bytes = 0;            // its weights
  uint64_t limit_bytes = 0;      // gpu_memory_GB x 1e9
  int64_t ranks_over = 0, ranks = 0;
  std::string message;           // one line naming all of the above
};

/// Empty when the cluster gives no gpu_memory_GB or every rank fits.
std::vector<MemoryWarning> CheckGpuMemory(const ClusterSpec& cluster, const LayoutSpec& src,
                                          const std::vector<uint64_t>& src_bytes, const LayoutSpec& dst,
                                          const std::vector<uint64_t>& dst_bytes);

/// The warnings as `reshard compile --json` prints them ("memory_warnings").
nlohmann::ordered_json MemoryWarningsJson(const std::vector<MemoryWarning>& w);

}  // namespace reshard
