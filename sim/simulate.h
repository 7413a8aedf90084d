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
  /// What if the runtime kept this many rounds' messages in flight at once
  /// (0: what it does, one round at a time)? Each rank and path then posts
  /// round r+1's messages while round r flies, except those that forward
  /// what an earlier round received (they wait until every earlier round
  /// of the rank landed on both paths); receives are posted with their
  /// round. Staging is not modelled: such a runtime needs depth + 1 arenas
  /// of the plan's round size. Local work runs in series on the NIC path's
  /// timeline, packs before posting, unpacks after landing.
  uint32_t overlap_depth = 0;
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
  std::string name() const {  // "rank 12 NIC out"
    return "rank " + std::to_string(rank) + (path == Path::net ? " NIC " : " NVLink ") + (egress ? "out" : "in");
  }
};

struct SimResult {
  double seconds = 0;        // predicted refit time: the last rank's end
  double hbm_seconds = 0;    // longest pack+copy+unpack time of one rank
  uint32_t hbm_rank = 0;     // that rank
  uint64_t comms = 0;        // simulated flows
  double wall_seconds = 0;   // time the simulation itself took
  std::vector<LinkLoad> busiest;  // up to 8, most utilized first
};

/// Runs the simulation. SimGrid allows one engine per process: call once (a
/// second call is a reshard::Error, see sim/one_simulation_test.cc).
/// The replay lives in a module of its own (libreshard_simgrid.so, beside
/// the executable), loaded here on first use; a module that is missing or
/// cannot load is a reshard::Error naming it.
SimResult Simulate(const Workload& w, const ClusterSpec& cluster, const SimOptions& opt);

/// The module's replay (sim/simgrid_replay.cc), as its entry point
/// `reshard_simgrid_replay` returns it.
using ReplayFn = SimResult (*)(const Workload& w, const ClusterSpec& cluster, const SimOptions& opt);

/// Where a prediction's time above its lower bound goes, read off its
/// busiest link (B bytes at bandwidth bw, predicted T, bound L):
///   T / L = bytes x idle,  bytes = (B / bw) / L,  idle = T / (B / bw)
/// `bytes` above 1: that link carries more than the bound gives any link
/// (bytes spread unevenly over a domain's NICs, or more bytes than needed,
/// e.g. BF16 values a receiver quantizes); `idle` above 1: the link waits
/// for its partners (1 / its utilization), inside rounds, while other flows
/// finish. Where the busiest GPU's HBM work (packs, copies, unpacks: H
/// seconds) outlasts that link's bytes, the split is read off the HBM
/// instead: bytes = H / L (above 1: packs and unpacks beyond the copies
/// the bound counts), idle = T / H. Nothing (has_split false) where no link
/// carries anything and no GPU copies.
struct GapToBound {
  bool has_split = false;
  bool hbm = false;         // read off r.hbm_rank's HBM, not the link
  bool has_link = false;    // the busiest link (where any carries bytes)
  LinkLoad link;
  double link_seconds = 0;  // B / bw
  double bytes = 1, idle = 1;
};
GapToBound GapOf(const SimResult& r, double bound_seconds, const LinkModel& m);

}  // namespace reshard::sim
