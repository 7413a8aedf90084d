// `reshard simulate`: replays a plan's workload on a modelled cluster with
// SimGrid's flow-level network model. Every GPU has a full-duplex NIC into a
// non-blocking fabric and a full-duplex NVLink port into its domain's switch;
// bandwidth is shared max-min fairly between the flows crossing a link.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sim/workload.h"

namespace reshard::sim {

struct SimOptions {
  std::string trace_path;  // Chrome/Perfetto trace JSON; empty: none
  /// Called now and then with the simulated time and the ranks finished.
  std::function<void(double sim_seconds, uint32_t ranks_done)> progress;
};

/// Load of one direction of one link over the whole refit.
struct LinkLoad {
  uint32_t rank = 0;
  Path path = Path::net;
  bool egress = false;  // GPU -> fabric/switch (true) or into the GPU
  uint64_t bytes = 0;
  double utilization = 0;  // bytes / (bandwidth * predicted seconds)
  std::string name() const;  // "rank 12 NIC out"
};

struct SimResult {
  double seconds = 0;        // predicted refit time: the last rank's end
  double hbm_seconds = 0;    // longest pack+copy+unpack time of one rank
  uint64_t comms = 0;        // simulated flows
  double wall_seconds = 0;   // time the simulation itself took
  std::vector<LinkLoad> busiest;  // up to 8, most utilized first
};

/// Runs the simulation. SimGrid allows one engine per process: call once.
SimResult Simulate(const Workload& w, const ClusterSpec& cluster, const SimOptions& opt);

}  // namespace reshard::sim
