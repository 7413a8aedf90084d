// How long a schedule's rounds take when every rank replays them the way the
// runtime does, as flows sharing links: the compiler keeps the round fill
// this finds fastest (route_schedule.cc). `reshard simulate` remains the
// judge of a finished plan; this is its network model without latencies or
// HBM passes, cheap enough to run on every fill. Where it would cost too
// much (dense rounds), Schedule compares the fills by a cruder replay.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace reshard::routing {

/// FlowSeconds' default budget of steps: a few seconds of one core. Every
/// row of docs/benchmarks.md fits in it, with --search-fills too (GB200
/// NVL72 and DeepSeek-V3's shares of 1/8 take the most); 512 ranks each
/// sending to 64 random peers at once would take minutes.
inline constexpr uint64_t kFlowBudget = 200'000'000;

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
  /// others keep theirs). Nothing when that would take more than `budget`
  /// steps (a flow looked at by a re-solve is a step): rounds in which every
  /// rank talks to many peers at once make each re-solve large.
  std::optional<double> FlowSeconds(double nic_Bps, double nvlink_Bps, uint64_t budget = kFlowBudget) const;

  /// The estimate where FlowSeconds gives up, in seconds: round after round,
  /// a rank starts the round at the latest of its own and its peers'
  /// finishes of the previous round, and takes as long as its busiest
  /// direction - NIC or NVLink port, each at its bandwidth - has bytes to
  /// move. It cannot tell apart fills whose difference is how messages
  /// share links within a round.
  double ReplaySeconds(double nic_Bps, double nvlink_Bps) const;

  /// The busiest NIC direction's bytes of all rounds at `nic_Bps`: no
  /// schedule of these messages is faster. FlowSeconds over it is the time
  /// that NIC waits on others (Route restripes where it is high).
  double BusiestNicSeconds(double nic_Bps) const;

 private:
  struct Edge {
    uint32_t round, a, b;
    uint64_t bytes;
    bool net;
  };
  static constexpr int kRecentBits = 12;
  static constexpr size_t kRecent = size_t{1} << kRecentBits;
  static constexpr uint32_t kNoEdge = UINT32_MAX;
  uint32_t ranks_;
  std::vector<Edge> edges_;      // one per round, pair and path, but where a repeat missed `recent_`
  std::vector<uint32_t> recent_;  // edges_ lately added, by a hash of round, pair and path
};

/// How far a change of rates is followed: flows on the links that changed,
/// and on the other links of those flows. Exact max-min (the whole
/// connected set of flows) takes several times as long on large plans for
/// nearly the same estimates. Of the three default fills it keeps the same
/// on every simulate, quant and init row; of --search-fills' seven, on all
/// but one (Qwen3-235B TP8, where `simulate` finds the two fills nearly
/// equal).
inline constexpr uint32_t kSolveDepth = 2;

}  // namespace reshard::routing
