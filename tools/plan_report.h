// What `show`, `diff` and `viz` read out of a plan: byte totals per channel,
// per rank, per peer pair, per round and per tensor, and the text forms they
// print (sizes, CuTe-style regions and tensor layouts).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/plan.h"

namespace reshard::report {

/// "1.50 MiB", "12 B".
std::string Bytes(uint64_t b);
/// Bytes with a sign: "+1.50 MiB", "-12 B", "0 B".
std::string SignedBytes(int64_t b);
/// "+12.5%" of b relative to a ("new" when a is 0 and b is not).
std::string Percent(uint64_t a, uint64_t b);

/// CuTe layout notation, e.g. (4096,1024):(1,4096).
std::string Cute(const std::vector<uint64_t>& shape, const std::vector<uint64_t>& stride);
/// A region of a rank program with what it addresses: `'name' @offset (shape):(stride)`,
/// or `staging @offset (...)`; strides of modes that step through buffers carry a `b`
/// (see FormatRegion in runtime/plan.h).
std::string RegionText(const fb::Program& p, const fb::Region& r);
/// One step in words: `send 2.00 KiB bf16 to 9 over net from 'w' @0 (4,16):(16,1)`.
std::string StepText(const fb::Program& p, const fb::Step& s);
/// A set of ranks as ranges: "0-3,8,10-11" ("" when empty).
std::string RankRanges(const std::vector<uint32_t>& sorted_ranks);
/// A tensor family's logical box as a compact row-major CuTe layout, e.g.
/// (61,7168):(7168,1); stack dims come first.
std::string TensorLayout(const fb::Tensor& t);
/// Elements of a tensor family's logical box.
uint64_t TensorElements(const fb::Tensor& t);

const char* StrategyName(fb::Strategy s);
const char* ChannelName(fb::Channel c);
/// "train 3", "infer 1", "train 3 + infer 1" or "-" for a rank on neither side.
std::string Side(const fb::Program& p);
/// How a direct plan's rounds were filled, for `compile` and `show`: "rounds
/// filled greedily, planned for 90% of the staging budget".
// split_share: the fill's RoundFill::split_share (-1: a plan written before it was recorded).
// nic_reserve: RoundFill::nic_reserve (0: none). stripe_mib: RoundFill::stripe_mib (said where not the default).
std::string RoundFillText(bool proportional, double min_share, double staging_fill, double split_share,
                          double nic_reserve, uint32_t stripe_mib);

/// Per-rank totals. Index 0 is the net channel, 1 nvlink.
struct RankStats {
  uint64_t sent[2] = {0, 0}, received[2] = {0, 0};
  uint64_t messages_out = 0, messages_in = 0, packs = 0, unpacks = 0, copies = 0;
  uint64_t staging = 0, steps = 0, rounds = 0;
  uint64_t Load() const { return sent[0] + sent[1] + received[0] + received[1]; }
};

/// Bytes of one tensor family read out of source buffers (packs, sends straight
/// from a buffer, copies) and written into destination buffers (unpacks,
/// receives straight into a buffer, copies), per global rank.
struct TensorStats {
  std::map<uint32_t, uint64_t> read, written;
  uint64_t read_bytes = 0, written_bytes = 0, direct_bytes = 0;  // direct: sent without staging
};

/// (sender, receiver, channel) packed into one key; see FlowKey/FlowFrom/...
using FlowMap = std::unordered_map<uint64_t, uint64_t>;
inline uint64_t FlowKey(uint32_t from, uint32_t to, int channel) {
  return (static_cast<uint64_t>(from) << 32) | (static_cast<uint64_t>(to) << 1) | static_cast<uint64_t>(channel & 1);
}
inline uint32_t FlowFrom(uint64_t k) { return static_cast<uint32_t>(k >> 32); }
inline uint32_t FlowTo(uint64_t k) { return static_cast<uint32_t>((k & 0xFFFFFFFFull) >> 1); }
inline int FlowChannel(uint64_t k) { return static_cast<int>(k & 1); }

/// Everything the reports need, gathered in one pass over all programs.
struct PlanStats {
  uint32_t ranks = 0;
  uint64_t bytes[2] = {0, 0}, messages[2] = {0, 0};
  uint64_t max_staging = 0;
  std::vector<RankStats> rank;
  /// Bytes a sender puts on the wire (send and forward steps) per receiver and channel.
  FlowMap flows;
  /// Per round: net bytes, nvlink bytes, messages (sends and forwards).
  std::vector<std::array<uint64_t, 3>> rounds;
  /// Indexed like the plan's tensor table (filled when asked for).
  std::vector<TensorStats> tensors;
  /// Region bytes whose first element lies in no fragment (should be 0).
  uint64_t unattributed_bytes = 0;
};

/// Walks every program once. With `tensors`, also attributes each region to the
/// tensor whose fragment holds the region's first element (a region the compiler
/// emits lies within one part of a fused buffer).
PlanStats Collect(const Plan& plan, bool tensors);

/// The NVLink domain of global rank r (0 when the plan has no domain table).
uint32_t DomainOf(const fb::Plan& root, uint32_t r);

}  // namespace reshard::report
