// What `reshard simulate` replays: a plan's steps reduced, per rank and round,
// to local work (bytes through HBM) and messages routed over the physical
// links of a cluster. Pure C++; the SimGrid engine lives in simulate.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/spec.h"
#include "runtime/plan.h"

namespace reshard::sim {

/// Physical path of a message: over the two GPUs' NICs through the fabric, or
/// over their NVLink ports through the domain's switch.
enum class Path : uint8_t { net = 0, nvlink = 1 };

/// All bytes one rank exchanges with one peer on one path in one round (the
/// plan posts a round's transfers together, so they share the same links).
struct Message {
  uint32_t peer = 0;
  uint64_t bytes = 0;
  bool send = false;
  /// Of `bytes` sent: forwarded, i.e. read from staging an earlier round
  /// received into (what SimOptions::overlap_depth must wait for).
  uint64_t forwarded = 0;
};

struct RankRound {
  uint32_t round = 0;
  uint64_t local_bytes = 0;   // pack + copy: read and written through HBM
  uint64_t unpack_bytes = 0;  // unpack
  /// The runtime's pipelined schedule (runtime/pipeline.h): this round's
  /// packs run while the previous listed round's messages fly; its unpacks
  /// while the next listed round's messages fly.
  bool early_pack = false, late_unpack = false;
  std::vector<Message> net, nvlink;
};

struct Workload {
  uint32_t num_ranks = 0, num_rounds = 0;
  std::vector<uint32_t> domain;               // physical NVLink domain per global rank
  std::vector<std::vector<RankRound>> ranks;  // per global rank, rounds with work only
  uint64_t net_bytes = 0, nvlink_bytes = 0;   // by physical path, counted once per message
  uint64_t local_bytes = 0, unpack_bytes = 0, self_bytes = 0;
  uint64_t steps = 0, messages = 0;           // plan steps; merged messages (send side)
  /// Per global rank: bytes sent and received per path (for link loads).
  std::vector<uint64_t> sent[2], received[2];
  std::vector<std::string> warnings;
};

/// Reduces `plan` to its workload on `cluster`. Throws reshard::Error when a
/// send has no matching receive (same peers, path, round and size, in order):
/// such a plan would hang; `reshard validate` says why.
Workload BuildWorkload(const Plan& plan, const ClusterSpec& cluster);

/// Link speeds of a cluster spec in bytes per second and seconds.
struct LinkModel {
  double nic_Bps = 0, nvlink_Bps = 0, hbm_Bps = 0;
  double nic_latency_s = 0, nvlink_latency_s = 0;
  static LinkModel Of(const ClusterSpec& c);
};

}  // namespace reshard::sim
