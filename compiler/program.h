// The compiler's in-memory form of a plan: per global rank, its buffers,
// fragments, regions and rounds of steps. route.cc builds it, emit.cc writes
// it as FlatBuffers (the only file that includes the generated header).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/expand.h"
#include "compiler/memory_check.h"
#include "compiler/spec.h"

namespace reshard {

enum class StepKind : uint8_t { pack = 0, send = 1, recv = 2, unpack = 3, copy = 4, forward = 5 };
enum class Channel : uint8_t { net = 0, nvlink = 1 };
constexpr uint32_t kNoRegion = 0xFFFFFFFFu;
/// The share of each rank's staging budget rounds are planned to fill first
/// (route_schedule.cc tries others too).
constexpr double kDefaultStagingFill = 0.9;
/// The smallest part the fills split off a piece, as a part of a round's
/// share, where they split coarsely (route_schedule.cc FillRounds).
constexpr double kCoarseSplit = 1.0 / 16;
/// Stripes of a region that enters a destination domain once (route_direct.cc),
/// at least this many MiB each, one per entry GPU; kFineStripeMiB (and
/// quantized tensors' pieces cut finer: kQuantPiecesPerArena, below) where
/// the flow estimate of the plan routed with kStripeMiB is above
/// kRestripeAbove times its busiest NIC's bytes at the NIC's bandwidth (the
/// target for a refit against its bound), and finds the finer routing faster
/// (Route, route.cc). The finer routing is tried on three of the bound_gap
/// rows (DeepSeek-V3 FP8 on GB200 NVL72, Qwen3-235B FP8 TP4 and per-channel)
/// and kept on all three.
constexpr uint32_t kStripeMiB = 32;
constexpr uint32_t kFineStripeMiB = 16;
constexpr double kRestripeAbove = 1.05;
/// In the finer routing (Route: where the first one's flow estimate is above
/// kRestripeAbove), pieces of a quantized tensor are at most 1/this of a
/// round's staging arena (16 MiB at the default --staging-mb 512), not half.
/// At half an arena (six experts' w13 of Qwen3-235B FP8 -> vLLM TP4 x32), a
/// GPU that took in one piece over its NIC and one over NVLink had little
/// more than half its round's staging filled and no piece fitting the rest,
/// and the refit took far more rounds than its staging needs. Finer pieces
/// for every plan bring such rows closer to their bound (simulate), but make
/// plans larger and large compiles slower and hungrier: hence only where the
/// first routing misses the target. The fill splits other pieces where a
/// round needs it (SplitFront, route_schedule.cc).
constexpr uint64_t kQuantPiecesPerArena = 16;
constexpr uint32_t kStaging = 0xFFFFFFFFu;  // StridedRegion::buffer naming the staging area

/// Staged pieces start at multiples of kAlign bytes (for vectorized kernels).
constexpr uint64_t kAlign = 256;
inline uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

/// Whether a region fits the plan's Region format: at most 4 modes, each
/// extent and stride under 2^32.
inline bool RegionFits(const StridedRegion& r) {
  if (r.ndim > 4) return false;
  for (int k = 0; k < r.ndim; ++k)
    if (r.stride[k] >= (int64_t{1} << 32) || r.shape[k] >= (int64_t{1} << 32)) return false;
  return true;
}

struct Step {
  StepKind kind = StepKind::pack;
  Channel channel = Channel::net;
  Dtype wire = Dtype::bf16;
  uint32_t peer = 0;
  uint64_t staging = 0, bytes = 0;
  uint32_t src = kNoRegion, dst = kNoRegion;
  int32_t quant = -1;  // index into RankProgram::quant_ops: the step converts block-scaled FP8
};

enum class QuantKind : uint8_t { dequantize = 0, quantize = 1, amax = 2, scale_from_amax = 3, quantize_scaled = 4 };

/// A block-scaled conversion of one pack, unpack or copy step (QuantOp in
/// schema/plan.fbs): its src, dst and `scale` regions are in quant form,
/// modes (outer..., rows, cols).
struct QuantOpIR {
  QuantKind kind = QuantKind::quantize;
  uint32_t scale = kNoRegion;
  std::array<uint32_t, 2> origin{0, 0}, block{1, 1};
  Dtype scale_dtype = Dtype::fp32;
};

/// One round of a rank: local steps (pack, copy), then communication posted
/// together, then unpacks.
struct Round {
  std::vector<Step> local, comm, unpack;
  bool empty() const { return local.empty() && comm.empty() && unpack.empty(); }
};

struct RankProgram {
  int src_rank = -1, dst_rank = -1;
  uint32_t dst_buffer_base = 0;  // first inference-side buffer in `buffers`
  std::vector<BufferDesc> buffers;
  std::vector<Fragment> fragments;
  std::vector<uint8_t> roles;    // per fragment: 0 source content, 1 destination need
  std::vector<StridedRegion> regions;
  std::vector<QuantOpIR> quant_ops;
  std::vector<Round> rounds;
  uint64_t staging_bytes = 0;

  int32_t AddQuant(const QuantOpIR& q) {
    quant_ops.push_back(q);
    return static_cast<int32_t>(quant_ops.size() - 1);
  }
  uint32_t AddRegion(const StridedRegion& r) {
    regions.push_back(r);
    return static_cast<uint32_t>(regions.size() - 1);
  }
  Round& round(size_t r) {
    if (rounds.size() <= r) rounds.resize(r + 1);
    return rounds[r];
  }
};

/// One pack, many sends (share_packs.h): pack steps dropped because their
/// round packs the same bytes already, of them block-scaled ones, and the
/// staging bytes they would have written.
struct SharedPacks {
  uint64_t packs = 0, quant_packs = 0, bytes = 0;
};

/// How a direct plan's rounds are filled (route_schedule.cc FillRounds; the
/// plan's RoundFill).
struct RoundFill {
  bool proportional = false;                  // every net pair first gets its proportional share of each round
  double staging_fill = kDefaultStagingFill;  // the share of the staging budget the rounds are planned for
  double min_share = 0;                       // proportional: no share below this part of the round's share
  double split_share = kCoarseSplit;  // no part split off a piece below this part of a round's share (nor kMinSplit)
  // Staging kept, in each round, for the NIC intake of every GPU whose NIC
  // takes in at least as much as its NVLink port: NVLink pieces may not use
  // this times its NIC bytes left per round left (at most the round's share),
  // less what its NIC already takes in that round. 0: none.
  double nic_reserve = 0;
  /// A region several GPUs of a destination domain need enters the domain
  /// in stripes of at least this many MiB, one per entry GPU
  /// (route_direct.cc): kStripeMiB, or kFineStripeMiB where Route
  /// (route.cc) found it faster.
  uint32_t stripe_mib = kStripeMiB;
};

struct PlanIR {
  std::string strategy;
  uint64_t staging_limit = 0;
  std::vector<uint32_t> src_global, dst_global, domain;
  std::vector<RankProgram> ranks;  // by global rank
  /// Scale tensors of both layouts (training first), numbered after the
  /// model's tensors in fragments and in the plan's tensor table.
  std::vector<ScaleTensor> scales;
  uint64_t net_bytes = 0, nvlink_bytes = 0;
  size_t num_rounds = 0;
  /// Needs whose scale blocks several training ranks hold parts of: assembled
  /// in a frame, or quantized with scales from partial amaxes (quant_route.h).
  size_t frame_assemblies = 0, amax_assemblies = 0;
  /// direct: the kept fill's flow estimate and its busiest NIC's bytes at
  /// the NIC's bandwidth, in seconds (0 where the estimate passed its budget).
  double flow_seconds = 0, busiest_nic_seconds = 0;
  SharedPacks shared_packs;
  /// How the rounds were filled (direct plans: the fill Schedule kept).
  RoundFill round_fill;
  /// direct: how many ways to fill the rounds Schedule had to choose from
  /// (RouteOptions::fill_candidate counts in this list).
  size_t fill_candidates = 0;
  /// Ranks whose weights exceed the cluster's gpu_memory_GB (memory_check.h).
  std::vector<MemoryWarning> memory_warnings;
};

struct RouteOptions {
  std::string strategy = "direct";  // or "gather"
  uint64_t staging_bytes = 512ull << 20;
  /// direct: a region several GPUs of one NVLink domain need enters the
  /// domain once and is forwarded over NVLink.
  bool nvlink_exchange = true;
  /// A quantized destination whose sender holds whole scale blocks gets FP8
  /// values and scales quantized by the sender (false: BF16, requantized on
  /// the receiver).
  bool quantize_on_sender = true;
  /// Also try the fills kSearchedFills (router.h, route_schedule.cc) and
  /// keep the fastest by the estimate: a fill each (as many at once as the
  /// machine has threads), for a refit predicted a little faster on some
  /// plans.
  bool search_fills = false;
  /// direct: >= 0 fills the rounds only the way of this entry of the list
  /// Schedule would try (route_schedule.cc; the longer list with
  /// search_fills) instead of keeping the fastest by the estimate, so that
  /// `compile --simulate-fills` can compile and simulate each. -1: choose.
  int fill_candidate = -1;
  /// direct: fill the rounds this way only (an earlier plan's fill,
  /// `compile --fill-of`): no other fill, no estimate.
  std::optional<RoundFill> fill_of = std::nullopt;
  /// direct: the stripes' least size (RoundFill::stripe_mib); fill_of's
  /// where that is given.
  uint32_t stripe_mib = kStripeMiB;
  /// Steps the flow estimate may take per fill before Schedule falls back on
  /// the replay (round_estimate.h); 0: kFlowBudget. For tests.
  uint64_t flow_budget = 0;
  /// direct: threads the steps are emitted on (route_emit.cc); 0: the
  /// machine's. The plan is the same on any number. For tests.
  size_t emit_threads = 0;
};

/// The fewest fills a direct plan's Schedule chooses from with search_fills
/// (a small plan's list): `compile --simulate-fills` may start that many at
/// once before the first says how many there are.
size_t FewestFillCandidates();

/// Passes 3 and 4: route every destination need to its sources and schedule
/// the transfers into rounds under the staging budget.
PlanIR Route(const ModelSpec& model, const ClusterSpec& cluster, const LayoutSpec& src_layout,
             const Expansion& src, const LayoutSpec& dst_layout, const Expansion& dst, const RouteOptions& opt);

}  // namespace reshard
