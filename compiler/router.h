// Passes 3 and 4: routing and scheduling.
//
// Both strategies work on the same picture of a tensor: the training side's
// fragments cut the tensor into disjoint *source cells* (a grid made of every
// source box's edges), each held by one or more replica ranks. Destination
// needs are intersected with the cells; every intersection is a piece that one
// replica sends. `direct` sends pieces straight to the destination; `gather`
// first gathers each chunk of a tensor on one owner rank and then passes the
// whole chunk down a chain of every destination that needs any of it.
//
// Staging: each rank's staging area is two arenas of staging/2 bytes. What a
// rank allocates in round r lives in arena r%2 and stays valid through round
// r+1 (so data received in round r can be forwarded in round r+1).
//
// The router's passes, one file each (all members of Router, router.h):
//   route_cells.cc     source cells: the grid every source box's edges make
//   route_direct.cc    direct: pieces, NVLink exchange stripes, relay trees
//   route_assemble.cc  blocks several source cells share: assemblies
//   route_schedule.cc  rounds: pieces placed under the staging budget, paced
//   route_emit.cc      the direct plan's steps and messages
//   route_gather.cc    gather: chunks to an owner, then down a chain
//   route.cc           global ranks, programs, and Route() itself
// Internal to the compiler: nothing outside compiler/route*.cc includes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "compiler/program.h"
#include "compiler/quant_route.h"
#include "compiler/round_estimate.h"
#include "runtime/error.h"

namespace reshard::routing {

inline constexpr uint8_t kDirectSrc = 1, kDirectDst = 2;  // DPiece::direct
inline constexpr uint64_t kMinSplit = 4ull << 20;  // smallest part split off a piece to fill a round
inline constexpr size_t kTreeDomains = 2;          // destination domains one source send reaches (relay trees)
inline constexpr size_t kTreeFanout = 1;           // domains each entry GPU forwards a piece to
inline constexpr double kRelayOnlyAbove = 0.75;    // no relay trees where the sources have this much to spare (RelaysSpare)
inline constexpr double kFill = kDefaultStagingFill;  // staging share the pace of rounds plans for
inline constexpr double kFillHigh = 0.95;  // and the greedy fill Schedule also tries
inline constexpr double kFillLow = 0.8;    // and small plans' second proportional fill
inline constexpr double kPaceSlack = 1.3;          // a sender's pace: this times its bytes left per round left,
inline constexpr double kPaceFloor = 0.8;          //   and at least this share of the busiest NIC's
inline constexpr double kNvPaceSlack = 3.0;  // a GPU's NVLink intake in a round: this times its NVLink bytes left per round left
inline constexpr uint64_t kUnpacedRounds = 2;      // senders with at most this many rounds' share are not paced
inline constexpr uint64_t kEndGameRounds = 2;      // a pair's relayed pieces go first this many rounds before the last share (and their relays')
inline constexpr size_t kProportionalMaxPieces = 16384;  // larger plans: coarse shares (kCoarseShare) only
inline constexpr double kCoarseShare = 0.25;  // larger plans' proportional shares: at least this part of a round's
inline constexpr double kNicReserve = 1.3;    // larger plans' fills keep staging for NIC intake (RoundFill::nic_reserve)
inline constexpr uint64_t kMinDirectSlice = 256ull << 10;  // smallest buffer's slice Unstage sends as a message of its own

// A pack or unpack step of `bytes` at byte `staging` of the rank's staging.
Step StagedStep(StepKind kind, Dtype wire, uint64_t staging, uint64_t bytes);
// Row-major region of `sub` inside a staging block holding `whole` (row-major)
// at element offset `base`.
StridedRegion StagingRegion(const Box& whole, const Box& sub, uint64_t base);
// Splits `b` into unit slices along its outermost dim of extent > 1.
std::vector<Box> SliceOuter(const Box& b);

// The fills Schedule tries besides its default ones with
// RouteOptions::search_fills: greedy at lower staging fills, and coarser or
// finer proportional shares on large plans.
inline constexpr RoundFill kSearchedFills[] = {
    {false, 0.8, 0}, {false, 0.85, 0}, {true, kFill, 0.125}, {true, kFill, 0.375}};

// The fills Schedule chooses from for a plan of `pieces` pieces, in order
// (RouteOptions::fill_candidate counts in this list): kDefaultFills (small
// plans, of up to kProportionalMaxPieces pieces: one more, the proportional
// fill planned for kFillLow of the staging budget), then with search_fills
// kSearchedFills.
inline constexpr size_t kDefaultFills = 3;
std::vector<RoundFill> FillCandidates(size_t pieces, bool search_fills);

struct Cell {
  Box box;
  std::vector<FragmentRef> replicas;  // training-side (rank, fragment)
};

// The source cells of one tensor and a grid index to find them.
struct CellGrid {
  int nd = 0;
  std::vector<std::vector<int64_t>> bp;  // per dim, sorted breakpoints
  std::unordered_map<uint64_t, int> index;
  std::vector<Cell> cells;

  uint64_t Key(const std::array<int64_t, kMaxDims>& seg) const {
    uint64_t k = 0;
    for (int d = 0; d < nd; ++d) k = k * (bp[d].size()) + static_cast<uint64_t>(seg[d]);
    return k;
  }
  // Segment range [s0, s1) of dim d overlapping [lo, hi); false if [lo, hi) leaves the grid.
  bool Segs(int d, int64_t lo, int64_t hi, int64_t& s0, int64_t& s1) const {
    const auto& v = bp[d];
    if (lo < v.front() || hi > v.back()) return false;
    s0 = std::upper_bound(v.begin(), v.end(), lo) - v.begin() - 1;
    s1 = std::lower_bound(v.begin(), v.end(), hi) - v.begin();
    return true;
  }
};

// The cells of `tensor` (of `nd` dims) that the training side's fragments make.
CellGrid BuildCells(const Expansion& src, int tensor, int nd);

// A piece of a need routed from sender a to receiver b (the direct strategy).
struct DPiece {
  int tensor;
  Box box;
  FragmentRef s, d;
  uint32_t a, b;  // global ranks
  uint64_t bytes;
  bool staged;
  // A staged piece one end of which is contiguous (Unstage): it is its
  // own message, sent straight from the sender's buffer (kDirectSrc:
  // staged and unpacked at b only) or received straight into the
  // receiver's (kDirectDst: packed and staged at a only).
  uint8_t direct = 0;
  size_t round = 0;
  uint32_t hop_begin = 0, hop_count = 0;  // its tree beyond b (hop_pool_)
  int32_t quant = -1;                     // a quantized tensor's piece: index into qpieces_
  int32_t assembly = -1;                  // a part of an assembled cover: index into assemblies_
  int32_t grid = -1;                      // amax path: the part's grid, its index in the area
};

class FillPieces;  // the pieces as one fill sees them (fill_pieces.h)

// A delivery of a piece beyond its first receiver: the holder `parent` (an
// index into the piece's hops, or -1 for the piece's receiver b) forwards its
// staged copy to `to` in round (the piece's round + level). Or (parent
// kFromSender, level 0; Unstage) the sender sends what it packed for b to
// `to` as well, in the same round: one pack, several receivers.
inline constexpr int32_t kFromSender = -2;
struct Hop {
  FragmentRef to;
  uint32_t rank;
  int32_t parent;
  uint32_t level;
};

// Blocks the destination quantizes that several source cells share
// (quant_route.h): the group `need` of one receiver, the cover its parts
// make up in the frame, and the round they all arrive in.
// Two ways (quant_route.h): parts of the cover assembled in a frame, or (the
// amax path) the need's values plus one partial-amax grid per part of the cover.
struct Assembly {
  int tensor;
  FragmentRef d;
  Box need, cover;
  uint32_t b;                   // receiver (global rank)
  std::vector<uint32_t> parts;  // indexes of its DPieces
  uint64_t frame_bytes = 0;     // the frame: the cover's image, or (amax path) the need's; 0: none
  size_t grids = 0;             // amax path: grids, one per part of the cover
  uint64_t slot = 0;            // amax path: bytes between grids in the area
  size_t round = 0;  // (where it lies in b's staging: EmitWalk's)
  bool amax() const { return grids > 0; }  // the amax path
};

class Router {
 public:
  Router(const ModelSpec& m, const ClusterSpec& c, const LayoutSpec& sl, const Expansion& s, const LayoutSpec& dl,
         const Expansion& d, const RouteOptions& o)
      : model_(m), cluster_(c), src_layout_(sl), src_(s), dst_layout_(dl), dst_(d), opt_(o),
        quant_(m, sl, s, dl, d, o.quantize_on_sender) {}

  /// Routes every need and fills the rounds; the direct strategy stops
  /// before its emit, so that Route can compare two routings by their flow
  /// estimates and emit only the one it keeps.
  void Plan();
  /// The flow estimate of the kept fill and its busiest NIC's bytes at the
  /// NIC's bandwidth, in seconds (Schedule); 0 where there is none.
  double FlowSeconds() const { return ir_.flow_seconds; }
  double BusiestNicSeconds() const { return ir_.busiest_nic_seconds; }
  /// After Plan: the rank programs' steps (the direct strategy's emit), and the plan.
  PlanIR Finish();

 private:
  [[noreturn]] void NoSource(int tensor, int dst_rank, const Box& need) const {
    throw Error(dst_layout_.file + ": tensor '" + model_.tensors[tensor].name + "': inference rank " +
                std::to_string(dst_rank) + " needs " + need.str() + ", which no training rank of " +
                src_layout_.file + " holds");
  }
  uint32_t SrcGlobal(int r) const { return ir_.src_global[r]; }
  uint32_t DstGlobal(int r) const { return ir_.dst_global[r]; }
  Channel ChannelOf(uint32_t a, uint32_t b) const {
    return ir_.domain[a] == ir_.domain[b] ? Channel::nvlink : Channel::net;
  }
  const Fragment& SrcFrag(const FragmentRef& f) const { return src_.ranks[f.rank].fragments[f.index]; }
  const Fragment& DstFrag(const FragmentRef& f) const { return dst_.ranks[f.rank].fragments[f.index]; }
  StridedRegion SrcRegion(const FragmentRef& f, const Box& b) const { return SrcFrag(f).RegionOf(b).Coalesced(); }
  StridedRegion DstRegion(const FragmentRef& f, const Box& b) const {
    StridedRegion r = DstFrag(f).RegionOf(b).Coalesced();
    r.buffer += ir_.ranks[DstGlobal(f.rank)].dst_buffer_base;
    return r;
  }
  /// Whether box b's region in fragment f fits the plan's Region format
  /// (RegionFits of SrcRegion or DstRegion), worked out only where
  /// Fragment::ModesFit cannot tell: splitting a piece to fill a round
  /// checked each part's regions, a large part of the time a split took
  /// (DeepSeek-V3 -> TP8 DP4 EP, by perf).
  bool SrcFits(const FragmentRef& f, const Box& b) const {
    return SrcFrag(f).ModesFit(b) || RegionFits(SrcRegion(f, b));
  }
  bool DstFits(const FragmentRef& f, const Box& b) const {
    return DstFrag(f).ModesFit(b) || RegionFits(DstRegion(f, b));
  }
  /// The replica on global rank `g` (colocated: the receiver's own GPU); -1 if none.
  int ReplicaOn(const std::vector<FragmentRef>& reps, uint32_t g) const {
    for (size_t i = 0; i < reps.size(); ++i)
      if (SrcGlobal(reps[i].rank) == g) return static_cast<int>(i);
    return -1;
  }
  int PickReplica(const std::vector<FragmentRef>& reps, uint32_t salt) const {
    size_t best = salt % reps.size();
    for (size_t i = 1; i < reps.size(); ++i) {
      size_t k = (i + salt) % reps.size();
      if (send_load_[SrcGlobal(reps[k].rank)] < send_load_[SrcGlobal(reps[best].rank)]) best = k;
    }
    return static_cast<int>(best);
  }
  static uint64_t& At(std::vector<uint64_t>& v, size_t round) {
    if (v.size() <= round) v.resize(round + 1, 0);
    return v[round];
  }
  // Bytes a rank has committed to a round (staged or sent straight from buffers).
  uint64_t& Used(uint32_t rank, size_t round) { return At(used_[rank], round); }
  // The largest staged piece: half a round's arena, so pieces pack into rounds.
  uint64_t PieceCap() const { return cap_ / 2; }
  // The size quantized tensors' pieces are cut to: the fill cannot split
  // those (SplitFront: they are cut at block edges only). Half an arena,
  // like the others; in the finer routing (stripes below kStripeMiB) a
  // 1/kQuantPiecesPerArena part, so that a round's share holds several. A
  // piece of one block (per-tensor scales) may still take PieceCap.
  uint64_t QuantPieceCap(uint32_t stripe_mib) const {
    return stripe_mib < kStripeMiB ? cap_ / kQuantPiecesPerArena : PieceCap();
  }
  // Bump allocation in the round's staging arena, of `arena` (per rank, per
  // round: bytes allocated); the rank's staging grows to hold it where `record`.
  uint64_t AllocIn(std::vector<std::vector<uint64_t>>& arena, uint32_t rank, size_t round, uint64_t bytes,
                   bool record) {
    uint64_t& bump = At(arena[rank], round);
    uint64_t off = (round % 2 ? odd_base_[rank] : 0) + bump;
    bump += AlignUp(bytes);
    if (record) ir_.ranks[rank].staging_bytes = std::max(ir_.ranks[rank].staging_bytes, off + AlignUp(bytes));
    return off;
  }
  uint64_t Alloc(uint32_t rank, size_t round, uint64_t bytes) { return AllocIn(arena_, rank, round, bytes, true); }
  void Count(uint32_t a, uint32_t b, uint64_t bytes) {
    (ChannelOf(a, b) == Channel::net ? ir_.net_bytes : ir_.nvlink_bytes) += bytes;
  }

  void AddPieces(int t, const Cell& cell, const Box& piece, const FragmentRef& df, const std::vector<Hop>& hops,
                 uint32_t salt, std::vector<DPiece>& pieces);
  void Assemble(int t, const CellGrid& g, const FragmentRef& df, std::vector<DPiece>& pieces);
  void PlaceAssemblies(FillPieces& pieces, size_t rounds, std::vector<std::vector<uint64_t>>& out_used,
                       std::vector<std::vector<uint64_t>>& in_used);
  template <typename Pieces>  // std::vector<DPiece> or FillPieces
  std::map<uint32_t, uint64_t> AssemblyNeed(const Assembly& as, const Pieces& pieces) const;
  template <typename Fn>
  void ForCells(int t, const CellGrid& g, const FragmentRef& df, const Box& need, Fn fn) const;
  uint32_t HolderOf(const DPiece& p, int32_t hop) const;
  void Schedule(std::vector<DPiece>& pieces);
  /// Returns the rounds' messages, for the estimates (round_estimate.h).
  RoundTraffic FillRounds(FillPieces& pieces, const std::vector<uint32_t>& order, const RoundFill& mode);
  std::vector<uint32_t> RotationOrder(const std::vector<DPiece>& pieces) const;
  bool SplitFront(FillPieces& pieces, uint32_t idx, uint64_t avail, std::vector<uint32_t>& queue,
                  size_t head);
  void EmitDirect(const std::vector<DPiece>& pieces);
  // EmitDirect's walk over the pieces in `order`, writing the steps of the
  // ranks thread `thread` of `threads` owns.
  void EmitWalk(const std::vector<DPiece>& pieces, const std::vector<size_t>& order,
                const std::map<size_t, std::vector<uint32_t>>& assembled, const std::vector<size_t>& ends,
                size_t thread, size_t threads);
  double RelaysSpare(const std::vector<DPiece>& pieces) const;
  bool HbmBinds(const std::vector<DPiece>& pieces) const;
  void Unstage(std::vector<DPiece>& pieces);
  void Direct();
  void Gather();

  const ModelSpec& model_;
  const ClusterSpec& cluster_;
  const LayoutSpec& src_layout_;
  const Expansion& src_;
  const LayoutSpec& dst_layout_;
  const Expansion& dst_;
  const RouteOptions& opt_;
  std::vector<DPiece> pieces_;                // the direct strategy's, from Direct to Finish
  QuantRouter quant_;                         // quantized tensors' pieces and steps (quant_route.h)
  std::vector<QuantPiece> qpieces_;           // DPiece::quant indexes these
  std::vector<Assembly> assemblies_;          // DPiece::assembly indexes these
  PlanIR ir_;
  uint64_t cap_ = 0;                          // arena size
  uint64_t quant_cap_ = 0;                    // QuantPieceCap of this routing's stripes (Direct)
  std::vector<uint64_t> send_load_;           // bytes each global rank sends
  std::vector<uint64_t> entry_load_;          // bytes entering each rank's domain through it (exchange)
  std::vector<Hop> hop_pool_;                 // delivery trees of exchanged pieces
  std::vector<uint64_t> relay_load_;          // bytes each rank forwards to other domains
  std::vector<uint64_t> odd_base_;            // per rank: where the odd rounds' staging arena starts
  std::vector<std::vector<uint64_t>> used_;   // per global rank, per round: bytes scheduled
  std::vector<std::vector<uint64_t>> arena_;  // per global rank, per round: bytes allocated
  bool hbm_binds_ = false;                    // a GPU's HBM traffic outlasts every link's (Unstage)
};

// Calls fn(cell index, cell ∩ need) for every source cell `need` (of
// tensor t, for destination fragment df) touches; a part no source holds is an error.
template <typename Fn>
void Router::ForCells(int t, const CellGrid& g, const FragmentRef& df, const Box& need, Fn fn) const {
  const int nd = need.ndim;
  std::array<int64_t, kMaxDims> s0{}, s1{}, cur{};
  for (int d = 0; d < nd; ++d) {
    if (!g.Segs(d, need.lo[d], need.hi[d], s0[d], s1[d])) {
      Box miss = need;  // the part of the need outside every source box
      if (g.bp[d].empty() || need.hi[d] <= g.bp[d].front() || need.lo[d] >= g.bp[d].back()) {
      } else if (need.lo[d] < g.bp[d].front()) {
        miss.hi[d] = g.bp[d].front();
      } else {
        miss.lo[d] = g.bp[d].back();
      }
      NoSource(t, df.rank, miss);
    }
    cur[d] = s0[d];
  }
  while (true) {
    auto it = g.index.find(g.Key(cur));
    Box cellbox;
    cellbox.ndim = nd;
    for (int d = 0; d < nd; ++d) cellbox.lo[d] = g.bp[d][cur[d]], cellbox.hi[d] = g.bp[d][cur[d] + 1];
    Box piece = cellbox.intersect(need);
    if (it == g.index.end()) NoSource(t, df.rank, piece);
    fn(it->second, piece);
    int d = nd - 1;
    while (d >= 0 && ++cur[d] == s1[d]) cur[d] = s0[d], --d;
    if (d < 0) break;
  }
}

}  // namespace reshard::routing
