// How long a schedule's rounds take when every rank replays them the way the
// runtime does, as flows sharing links: the compiler keeps the round fill
// this finds fastest (route_schedule.cc). `reshard simulate` remains the
// judge of a finished plan; this is its network model without latencies or
// HBM passes, cheap enough to run on every fill.
#pragma once

#include <cstdint>
#include <vector>

namespace reshard::routing {

class RoundTraffic {
 public:
  explicit RoundTraffic(uint32_t ranks);

  /// `bytes` from rank `from` to rank `to` in round `round`, over a NIC
  /// (net) or over NVLink. Messages of a rank to itself are not traffic; a
  /// round's messages between two ranks on one path travel as one (the
  /// runtime merges them).
  void Add(uint32_t round, uint32_t from, uint32_t to, uint64_t bytes, bool net);

  /// The estimate, in seconds. A rank posts its next round's messages when
  /// all of its messages of the previous one have arrived; a message moves
  /// once both its ends have posted it; the messages in flight share each
  /// rank's NIC and NVLink port, each direction at its bandwidth (bytes per
  /// second), max-min fairly, the rates recomputed whenever a message starts
  /// or ends - for the messages within kSolveDepth links of the change (the
  /// others keep theirs).
  double FlowSeconds(double nic_Bps, double nvlink_Bps) const;

 private:
  struct Edge {
    uint32_t round, a, b;
    uint64_t bytes;
    bool net;
  };
  uint32_t ranks_;
  std::vector<Edge> edges_;
};

/// How far a change of rates is followed: flows on the links that changed,
/// and on the other links of those flows. Exact max-min (the whole
/// connected set of flows) took four times as long on DeepSeek-V3 FP8
/// (0.55 s a fill against 0.13 s) for estimates 0.1% apart, and kept the
/// same fill on all 15 simulate, quant and init rows, each with its 7 fills.
inline constexpr uint32_t kSolveDepth = 2;

}  // namespace reshard::routing
