// How long a schedule's rounds take when every rank replays them the way the
// runtime does: a rank starts a round once it has finished its previous one,
// and a message of the round moves only once both its ends have started it.
// The compiler uses this to choose between round fills (route_schedule.cc);
// `reshard simulate` remains the judge of a finished plan.
#pragma once

#include <cstdint>
#include <vector>

namespace reshard::routing {

class RoundTraffic {
 public:
  explicit RoundTraffic(uint32_t ranks);

  /// `bytes` from rank `from` to rank `to` in round `round`, over a NIC
  /// (net) or over NVLink. Messages of a rank to itself are not traffic.
  void Add(uint32_t round, uint32_t from, uint32_t to, uint64_t bytes, bool net);

  /// The estimate, in seconds: round after round, a rank starts the round at
  /// the latest of its own and its peers' finishes of the previous round, and
  /// takes as long as its busiest direction - NIC or NVLink port, each at its
  /// bandwidth (bytes per second) - has bytes to move.
  double ReplaySeconds(double nic_Bps, double nvlink_Bps) const;

  /// The sum over rounds of the busiest link direction's time: what the
  /// rounds would take if every round ended for all ranks together.
  double LockstepSeconds(double nic_Bps, double nvlink_Bps) const;

 private:
  struct Edge {
    uint32_t round, a, b;
  };
  // Per round, per rank: bytes out and in over NICs and over NVLink.
  struct Load {
    uint64_t net_out = 0, net_in = 0, nv_out = 0, nv_in = 0;
  };
  Load& At(uint32_t round, uint32_t rank);
  double Seconds(const Load& l, double nic_Bps, double nvlink_Bps) const;

  uint32_t ranks_;
  std::vector<std::vector<Load>> loads_;  // [round][rank]
  std::vector<Edge> edges_;
};

}  // namespace reshard::routing
