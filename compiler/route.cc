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
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <unordered_map>

#include "compiler/program.h"
#include "compiler/quant_route.h"
#include "runtime/error.h"

namespace reshard {
namespace {

constexpr uint64_t kMinSplit = 4ull << 20;  // smallest part split off a piece to fill a round
constexpr size_t kTreeDomains = 2;          // destination domains one source send reaches (relay trees)
constexpr size_t kTreeFanout = 1;           // domains each entry GPU forwards a piece to
constexpr double kFill = 0.9;               // staging share the pace of rounds plans for

// A pack or unpack step of `bytes` at byte `staging` of the rank's staging.
Step StagedStep(StepKind kind, Dtype wire, uint64_t staging, uint64_t bytes) {
  Step s;
  s.kind = kind;
  s.wire = wire;
  s.staging = staging;
  s.bytes = bytes;
  return s;
}

// Row-major region of `sub` inside a staging block holding `whole` (row-major)
// at element offset `base`.
StridedRegion StagingRegion(const Box& whole, const Box& sub, uint64_t base) {
  return RowMajorRegion(whole, sub, base, kStaging);
}

// Splits `b` into unit slices along its outermost dim of extent > 1.
std::vector<Box> SliceOuter(const Box& b) {
  std::vector<Box> out;
  for (int d = 0; d < b.ndim; ++d) {
    if (b.extent(d) > 1) {
      for (int64_t i = b.lo[d]; i < b.hi[d]; ++i) {
        Box x = b;
        x.lo[d] = i;
        x.hi[d] = i + 1;
        out.push_back(x);
      }
      return out;
    }
  }
  out.push_back(b);
  return out;
}

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

CellGrid BuildCells(const Expansion& src, int tensor, int nd) {
  CellGrid g;
  g.nd = nd;
  g.bp.resize(nd);
  const auto& frs = src.by_tensor[tensor];
  for (const FragmentRef& fr : frs) {
    const Box& b = src.ranks[fr.rank].fragments[fr.index].box;
    for (int d = 0; d < nd; ++d) g.bp[d].push_back(b.lo[d]), g.bp[d].push_back(b.hi[d]);
  }
  for (auto& v : g.bp) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  for (const FragmentRef& fr : frs) {
    const Box& b = src.ranks[fr.rank].fragments[fr.index].box;
    std::array<int64_t, kMaxDims> s0{}, s1{}, cur{};
    for (int d = 0; d < nd; ++d) g.Segs(d, b.lo[d], b.hi[d], s0[d], s1[d]), cur[d] = s0[d];
    while (true) {
      uint64_t key = g.Key(cur);
      auto [it, fresh] = g.index.emplace(key, static_cast<int>(g.cells.size()));
      if (fresh) {
        Cell c;
        c.box.ndim = nd;
        for (int d = 0; d < nd; ++d) c.box.lo[d] = g.bp[d][cur[d]], c.box.hi[d] = g.bp[d][cur[d] + 1];
        g.cells.push_back(c);
      }
      g.cells[it->second].replicas.push_back(fr);
      int d = nd - 1;
      while (d >= 0 && ++cur[d] == s1[d]) cur[d] = s0[d], --d;
      if (d < 0) break;
    }
  }
  return g;
}

struct DPiece;

// A delivery of a piece beyond its first receiver: the holder `parent` (an
// index into the piece's hops, or -1 for the piece's receiver b) forwards its
// staged copy to `to` in round (the piece's round + level).
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
  size_t round = 0;
  uint64_t frame = ~uint64_t{0};   // bytes in b's staging once emitted: the frame,
  uint64_t area = ~uint64_t{0};    // the grids,
  uint64_t values = ~uint64_t{0};  // and (amax path) the need's values
  bool amax() const { return grids > 0; }  // the amax path
};

class Router {
 public:
  Router(const ModelSpec& m, const ClusterSpec& c, const LayoutSpec& sl, const Expansion& s, const LayoutSpec& dl,
         const Expansion& d, const RouteOptions& o)
      : model_(m), cluster_(c), src_layout_(sl), src_(s), dst_layout_(dl), dst_(d), opt_(o),
        quant_(m, sl, s, dl, d, o.quantize_on_sender) {}

  PlanIR Run();

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
  // Bump allocation in the round's staging arena.
  uint64_t Alloc(uint32_t rank, size_t round, uint64_t bytes) {
    uint64_t& bump = At(arena_[rank], round);
    uint64_t off = (round % 2 ? odd_base_[rank] : 0) + bump;
    bump += AlignUp(bytes);
    ir_.ranks[rank].staging_bytes = std::max(ir_.ranks[rank].staging_bytes, off + AlignUp(bytes));
    return off;
  }
  void Count(uint32_t a, uint32_t b, uint64_t bytes) {
    (ChannelOf(a, b) == Channel::net ? ir_.net_bytes : ir_.nvlink_bytes) += bytes;
  }

  void AddPieces(int t, const Cell& cell, const Box& piece, const FragmentRef& df, const std::vector<Hop>& hops,
                 uint32_t salt, std::vector<DPiece>& pieces);
  void Assemble(int t, const CellGrid& g, const FragmentRef& df, std::vector<DPiece>& pieces);
  void PlaceAssemblies(std::vector<DPiece>& pieces, size_t rounds, std::vector<std::vector<uint64_t>>& out_used,
                       std::vector<std::vector<uint64_t>>& in_used);
  std::map<uint32_t, uint64_t> AssemblyNeed(const Assembly& as, const std::vector<DPiece>& pieces) const;
  template <typename Fn>
  void ForCells(int t, const CellGrid& g, const FragmentRef& df, const Box& need, Fn fn) const;
  uint32_t HolderOf(const DPiece& p, int32_t hop) const;
  void Schedule(std::vector<DPiece>& pieces);
  bool SplitFront(std::vector<DPiece>& pieces, uint32_t idx, uint64_t avail, std::vector<uint32_t>& queue,
                  size_t head);
  void EmitDirect(const std::vector<DPiece>& pieces);
  void Direct();
  void Gather();

  const ModelSpec& model_;
  const ClusterSpec& cluster_;
  const LayoutSpec& src_layout_;
  const Expansion& src_;
  const LayoutSpec& dst_layout_;
  const Expansion& dst_;
  const RouteOptions& opt_;
  QuantRouter quant_;                         // quantized tensors' pieces and steps (quant_route.h)
  std::vector<QuantPiece> qpieces_;           // DPiece::quant indexes these
  std::vector<Assembly> assemblies_;          // DPiece::assembly indexes these
  PlanIR ir_;
  uint64_t cap_ = 0;                          // arena size
  std::vector<uint64_t> send_load_;           // bytes each global rank sends
  std::vector<uint64_t> entry_load_;          // bytes entering each rank's domain through it (exchange)
  std::vector<Hop> hop_pool_;                 // delivery trees of exchanged pieces
  std::vector<uint64_t> relay_load_;          // bytes each rank forwards to other domains
  std::vector<uint64_t> odd_base_;            // per rank: where the odd rounds' staging arena starts
  std::vector<std::vector<uint64_t>> used_;   // per global rank, per round: bytes scheduled
  std::vector<std::vector<uint64_t>> arena_;  // per global rank, per round: bytes allocated
};

// ---------------------------------------------------------------- direct --
//
// Every destination need is cut by the source cells into pieces; one replica
// sends each piece. With exchange (the default), a piece that several GPUs
// need enters each destination NVLink domain once: it is striped over the
// needers (each stripe lands in the staging of the domain's least-loaded
// needer, so all of a domain's NICs carry load). The stripe travels a binary
// tree over the domains that need it - the source sends it once, to the root
// domain's entry GPU; each entry forwards it from its staging, one round
// later, to the entries of two more domains over the network (their NICs'
// otherwise idle egress) and to the other needers of its own domain over
// NVLink - while its NIC already receives the next round.

struct DPiece {
  int tensor;
  Box box;
  FragmentRef s, d;
  uint32_t a, b;  // global ranks
  uint64_t bytes;
  bool staged;
  size_t round = 0;
  uint32_t hop_begin = 0, hop_count = 0;  // its tree beyond b (hop_pool_)
  int32_t quant = -1;                     // a quantized tensor's piece: index into qpieces_
  int32_t assembly = -1;                  // a part of an assembled cover: index into assemblies_
  int32_t grid = -1;                      // amax path: the part's grid, its index in the area
};

uint32_t Router::HolderOf(const DPiece& p, int32_t h) const {
  return h < 0 ? p.b : hop_pool_[p.hop_begin + h].rank;
}

void Router::AddPieces(int t, const Cell& cell, const Box& piece, const FragmentRef& df,
                       const std::vector<Hop>& hops, uint32_t salt, std::vector<DPiece>& pieces) {
  const TensorSpec& ts = model_.tensors[t];
  const uint64_t esize = DtypeBytes(ts.dtype);
  int k = PickReplica(cell.replicas, salt);
  FragmentRef sf = cell.replicas[k];
  uint32_t a = SrcGlobal(sf.rank), b = DstGlobal(df.rank);
  const bool relayed = !hops.empty();
  const uint32_t hop_begin = static_cast<uint32_t>(hop_pool_.size());
  hop_pool_.insert(hop_pool_.end(), hops.begin(), hops.end());
  if (quant_.Quantized(t)) {  // whole scale blocks: quant_route.h
    for (const QuantPiece& q : quant_.Pieces(t, sf, cell.box, df, piece, PieceCap())) {
      send_load_[a] += q.bytes;
      DPiece p{t, q.need, sf, df, a, b, q.bytes, true};
      p.hop_begin = hop_begin;
      p.hop_count = static_cast<uint32_t>(hops.size());
      p.quant = static_cast<int32_t>(qpieces_.size());
      qpieces_.push_back(q);
      pieces.push_back(p);
    }
    return;
  }
  send_load_[a] += piece.volume() * esize;
  // Split to fit the staging arena and the 4-mode region format. A piece
  // contiguous on both sides needs no staging: only the 4 GiB step limit.
  StridedRegion whole_s = SrcRegion(sf, piece), whole_d = DstRegion(df, piece);
  bool contiguous = !relayed && whole_s.contiguous() && whole_d.contiguous();
  uint64_t max_bytes = contiguous ? (uint64_t{1} << 31) : PieceCap();
  std::vector<Box> work = SplitBox(piece, std::max<int64_t>(1, static_cast<int64_t>(max_bytes / esize)));
  std::reverse(work.begin(), work.end());
  while (!work.empty()) {
    Box x = work.back();
    work.pop_back();
    StridedRegion rs = SrcRegion(sf, x), rd = DstRegion(df, x);
    bool fits = RegionFits(rs) && RegionFits(rd);
    for (const Hop& h : hops) fits = fits && RegionFits(DstRegion(h.to, x));
    if (!fits) {
      std::vector<Box> slices = SliceOuter(x);
      work.insert(work.end(), slices.rbegin(), slices.rend());
      continue;
    }
    DPiece p{t, x, sf, df, a, b, static_cast<uint64_t>(x.volume()) * esize, true};
    p.staged = relayed || !(rs.contiguous() && rd.contiguous() &&
                            src_.ranks[sf.rank].buffers[rs.buffer].dtype == ts.dtype &&
                            dst_.ranks[df.rank].buffers[rd.buffer - ir_.ranks[b].dst_buffer_base].dtype == ts.dtype);
    p.hop_begin = hop_begin;
    p.hop_count = static_cast<uint32_t>(hops.size());
    pieces.push_back(p);
  }
}

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

// The need of `df` in groups of whole blocks (quant_route.h), cut at the
// source cells' edges in outer dims (so that every part of a group's cover
// spans its outer extent). A group whose cover one cell holds is an ordinary
// piece; any other becomes an assembly, one part per cell of its cover, each
// from a replica of that cell.
void Router::Assemble(int t, const CellGrid& g, const FragmentRef& df, std::vector<DPiece>& pieces) {
  const TensorSpec& ts = model_.tensors[t];
  const uint64_t esize = DtypeBytes(ts.dtype);
  const uint32_t b = DstGlobal(df.rank);
  const bool amax = quant_.AmaxPath(t);
  std::vector<Box> groups;
  for (Box x : quant_.Groups(t, df, DstFrag(df).box, cap_ / 4, amax)) {
    for (int d = 0; d + 2 < x.ndim; ++d)
      for (int64_t e : g.bp[d])
        if (e > x.lo[d] && e < x.hi[d]) {
          Box y = x;
          y.hi[d] = e;
          groups.push_back(y);
          x.lo[d] = e;
        }
    groups.push_back(x);
  }
  for (const Box& group : groups) {
    const Box cover = quant_.Cover(t, group);
    std::vector<std::pair<int, Box>> parts;
    ForCells(t, g, df, cover, [&](int ci, const Box& part) { parts.push_back({ci, part}); });
    if (parts.size() == 1) {
      AddPieces(t, g.cells[parts[0].first], group, df, {}, df.rank, pieces);
      continue;
    }
    const uint32_t id = static_cast<uint32_t>(assemblies_.size());
    Assembly as{t, df, group, cover, b, {}};
    std::map<int, FragmentRef> holder;  // per cell: the replica that sends its parts
    auto add = [&](int ci, const Box& box, uint64_t bytes, int32_t grid) {
      const Cell& cell = g.cells[ci];
      auto [it, fresh] = holder.try_emplace(ci);
      if (fresh) it->second = cell.replicas[PickReplica(cell.replicas, df.rank)];
      const FragmentRef sf = it->second;
      const uint32_t a = SrcGlobal(sf.rank);
      if (!RegionFits(SrcFrag(sf).RegionOf(box).Coalesced())) {
        throw Error(src_layout_.file + ": tensor '" + ts.name + "': training rank " + std::to_string(sf.rank) +
                    " holds " + box.str() + " of a block cover other ranks share in a layout of more than 4 modes");
      }
      DPiece p{t, box, sf, df, a, b, bytes, true};
      p.assembly = static_cast<int32_t>(id);
      p.grid = grid;
      if (grid < 0) {
        p.quant = static_cast<int32_t>(qpieces_.size());
        qpieces_.push_back(quant_.Part(t, box));
      }
      if (a != b) send_load_[a] += bytes;
      as.parts.push_back(static_cast<uint32_t>(pieces.size()));
      pieces.push_back(p);
      return a;
    };
    if (amax) {
      // A grid from every part of the cover; the need's values from the cells it touches.
      as.grids = parts.size();
      as.slot = AlignUp(quant_.GridBytes(t, cover));
      for (size_t k = 0; k < parts.size(); ++k)
        add(parts[k].first, parts[k].second, quant_.GridBytes(t, cover), static_cast<int32_t>(k));
      std::vector<std::pair<int, Box>> values;
      ForCells(t, g, df, group, [&](int ci, const Box& v) { values.push_back({ci, v}); });
      bool local = false;
      for (const auto& [ci, v] : values)
        local = add(ci, v, static_cast<uint64_t>(v.volume()) * esize, -1) == b || local;
      // One remote part lands as the need's image already; several, or a local one, need a frame.
      if (values.size() > 1 || local) as.frame_bytes = static_cast<uint64_t>(group.volume()) * esize;
    } else {
      as.frame_bytes = static_cast<uint64_t>(cover.volume()) * esize;
      for (const auto& [ci, part] : parts) add(ci, part, static_cast<uint64_t>(part.volume()) * esize, -1);
    }
    const uint64_t need = AssemblyNeed(as, pieces)[b];
    if (need > cap_) {
      throw Error(dst_layout_.file + ": tensor '" + ts.name + "': inference rank " + std::to_string(df.rank) +
                  " quantizes " + group.str() + " over blocks that " + std::to_string(parts.size()) +
                  " training cells share; " + (amax ? "receiving it" : "assembling their cover " + cover.str()) +
                  " takes " + std::to_string(need) + " bytes of staging in one round, more than the " +
                  std::to_string(cap_) + " a round may use (half of --staging-mb " +
                  std::to_string(opt_.staging_bytes >> 20) + "); raise --staging-mb to at least " +
                  std::to_string((2 * need + (1 << 20) - 1) >> 20));
    }
    assemblies_.push_back(std::move(as));
  }
}

// The staging an assembly takes in its round, per global rank: at the
// receiver its frame, its grids and the parts it receives; at each sender
// what it stages.
std::map<uint32_t, uint64_t> Router::AssemblyNeed(const Assembly& as, const std::vector<DPiece>& pieces) const {
  std::map<uint32_t, uint64_t> need;
  need[as.b] += AlignUp(as.frame_bytes) + as.grids * as.slot;
  for (uint32_t i : as.parts) {
    const DPiece& p = pieces[i];
    if (p.a == p.b) continue;
    need[p.a] += AlignUp(p.bytes);
    need[p.b] += AlignUp(p.bytes);  // a grid lands with the values, then is copied into the area
  }
  return need;
}

void Router::Direct() {
  std::vector<DPiece> pieces;
  const uint64_t stripe_min = 32ull << 20;
  for (int t = 0; t < static_cast<int>(model_.tensors.size()); ++t) {
    const TensorSpec& ts = model_.tensors[t];
    int nd = ts.ndim();
    CellGrid g = BuildCells(src_, t, nd);
    uint64_t esize = DtypeBytes(ts.dtype);
    // Per source cell: who needs which box of it.
    std::map<int, std::vector<std::pair<FragmentRef, Box>>> wants;
    for (const FragmentRef& df : dst_.by_tensor[t]) {
      // A need whose blocks some source cell cuts is assembled at the receiver.
      std::vector<std::pair<int, Box>> mine;
      bool whole = true;
      ForCells(t, g, df, DstFrag(df).box, [&](int ci, const Box& piece) {
        whole = whole && (!quant_.Quantized(t) || g.cells[ci].box.contains(quant_.Cover(t, piece)));
        mine.push_back({ci, piece});
      });
      if (!whole) {
        Assemble(t, g, df, pieces);
        continue;
      }
      for (const auto& [ci, piece] : mine) wants[ci].push_back({df, piece});
    }
    for (auto& [ci, list] : wants) {
      const Cell& cell = g.cells[ci];
      // Needers of identical boxes form a group; groups must not overlap.
      std::stable_sort(list.begin(), list.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
      std::vector<std::pair<size_t, size_t>> groups;
      for (size_t i = 0; i < list.size();) {
        size_t j = i;
        while (j < list.size() && list[j].second == list[i].second) ++j;
        groups.push_back({i, j});
        i = j;
      }
      bool exchange = opt_.nvlink_exchange;
      for (size_t x = 0; exchange && x < groups.size(); ++x)
        for (size_t y = x + 1; exchange && y < groups.size(); ++y)
          exchange = !list[groups[x].first].second.intersects(list[groups[y].first].second);
      std::vector<bool> has_replica;  // per domain: a replica of the cell sits there
      for (const FragmentRef& rep : cell.replicas) {
        uint32_t d = ir_.domain[SrcGlobal(rep.rank)];
        if (has_replica.size() <= d) has_replica.resize(d + 1, false);
        has_replica[d] = true;
      }
      auto local = [&](uint32_t d) { return d < has_replica.size() && has_replica[d]; };
      for (auto [i, j] : groups) {
        const Box& box = list[i].second;
        // Needers by domain; those in a domain holding a replica take it straight from one.
        std::map<uint32_t, std::vector<size_t>> by_domain;
        for (size_t k = i; k < j; ++k) {
          uint32_t d = ir_.domain[DstGlobal(list[k].first.rank)];
          if (!exchange || local(d)) {
            AddPieces(t, cell, box, list[k].first, {}, list[k].first.rank, pieces);
          } else {
            by_domain[d].push_back(k);
          }
        }
        if (by_domain.empty()) continue;
        size_t most = 0;
        for (auto& [d, ks] : by_domain) most = std::max(most, ks.size());
        if (by_domain.size() == 1 && most == 1) {  // one needer
          size_t k = by_domain.begin()->second[0];
          AddPieces(t, cell, box, list[k].first, {}, list[k].first.rank, pieces);
          continue;
        }
        // Stripes, each delivered by its own tree with its own entry GPUs.
        const uint64_t bytes = box.volume() * esize;
        const uint64_t stripes = std::clamp<uint64_t>(bytes / stripe_min, 1, most);
        // A quantized tensor's stripes end at block edges, so that each needer's pieces are the same.
        const std::vector<Box> cut = quant_.Quantized(t) ? quant_.Stripes(t, box, stripes)
                                                         : SplitBox(box, (box.volume() + stripes - 1) / stripes);
        for (const Box& stripe : cut) {
          const uint64_t sbytes = stripe.volume() * esize;
          std::vector<std::pair<uint32_t, std::vector<size_t>>> doms(by_domain.begin(), by_domain.end());
          // Fixed partner domains (a tree per consecutive kTreeDomains), roles set by load below:
          // pieces relayed between the same two GPUs then travel in one message.
          std::vector<size_t> entry(doms.size());
          for (size_t x = 0; x < doms.size(); ++x) {
            entry[x] = doms[x].second[0];
            for (size_t k : doms[x].second)
              if (entry_load_[DstGlobal(list[k].first.rank)] < entry_load_[DstGlobal(list[entry[x]].first.rank)])
                entry[x] = k;
            entry_load_[DstGlobal(list[entry[x]].first.rank)] += sbytes;
          }
          // Trees of at most kTreeDomains domains (one source send each), fan-out
          // kTreeFanout. Tree positions with the most children go to the entries
          // that have forwarded the least so far, so relaying spreads over all NICs.
          // Deeper or wider trees save more source egress but burst a holder's
          // NIC and tie more rounds together; pairs measured best (simulate).
          for (size_t t0 = 0; t0 < doms.size(); t0 += kTreeDomains) {
            const size_t m = std::min(kTreeDomains, doms.size() - t0);
            auto kids = [m](size_t x) {
              size_t c = 0;
              for (size_t f = 1; f <= kTreeFanout; ++f) c += kTreeFanout * x + f < m;
              return c;
            };
            std::vector<size_t> pos(m), by_load(m);
            std::iota(pos.begin(), pos.end(), 0);
            std::iota(by_load.begin(), by_load.end(), t0);
            std::stable_sort(pos.begin(), pos.end(), [&](size_t u, size_t v) { return kids(u) > kids(v); });
            // (list is a structured binding: clang 14 captures it only through an init-capture)
            auto relay = [&, &list = list](size_t x) { return relay_load_[DstGlobal(list[entry[x]].first.rank)]; };
            std::stable_sort(by_load.begin(), by_load.end(), [&](size_t u, size_t v) { return relay(u) < relay(v); });
            std::vector<const std::vector<size_t>*> tdom(m);
            std::vector<size_t> tentry(m);
            for (size_t q = 0; q < m; ++q) tdom[pos[q]] = &doms[by_load[q]].second, tentry[pos[q]] = entry[by_load[q]];
            for (size_t x = 0; x < m; ++x) relay_load_[DstGlobal(list[tentry[x]].first.rank)] += kids(x) * sbytes;
            std::vector<Hop> hops;
            std::vector<int32_t> entry_hop(m, -1);  // hop index of each domain's entry
            std::vector<uint32_t> depth(m, 0);
            for (size_t x = 1; x < m; ++x) {
              size_t up = (x - 1) / kTreeFanout;
              depth[x] = depth[up] + 1;
              const FragmentRef& to = list[tentry[x]].first;
              entry_hop[x] = static_cast<int32_t>(hops.size());
              hops.push_back({to, DstGlobal(to.rank), entry_hop[up], depth[x]});
            }
            for (size_t x = 0; x < m; ++x) {
              for (size_t k : *tdom[x]) {
                if (k == tentry[x]) continue;
                const FragmentRef& to = list[k].first;
                hops.push_back({to, DstGlobal(to.rank), entry_hop[x], depth[x] + 1});
              }
            }
            const FragmentRef& root = list[tentry[0]].first;
            AddPieces(t, cell, stripe, root, hops, root.rank, pieces);
          }
        }
      }
    }
  }
  for (const Assembly& as : assemblies_) ++(as.amax() ? ir_.amax_assemblies : ir_.frame_assemblies);
  Schedule(pieces);
  // The odd rounds' arena starts where the even rounds' largest need ends
  // (not at half the budget): a small plan stages only what it moves.
  for (uint32_t g = 0; g < ir_.ranks.size(); ++g) {
    uint64_t even = 0;
    for (size_t r = 0; r < used_[g].size(); r += 2) even = std::max(even, used_[g][r]);
    odd_base_[g] = std::min(cap_, AlignUp(even));
  }
  EmitDirect(pieces);
}

// Every part of an assembly arrives in one round (its receiver quantizes in
// that round's unpacks). Before the other pieces fill the rounds, each
// assembly takes, among the first `rounds` rounds, the one where the busiest
// of its GPUs has the least staging and network share in use (so that they
// spread over the rounds instead of crowding the first), or, if none has
// room, the first round after them that has.
void Router::PlaceAssemblies(std::vector<DPiece>& pieces, size_t rounds, std::vector<std::vector<uint64_t>>& out_used,
                             std::vector<std::vector<uint64_t>>& in_used) {
  for (Assembly& as : assemblies_) {
    const std::map<uint32_t, uint64_t> need = AssemblyNeed(as, pieces);
    auto fits = [&](size_t r) {
      for (const auto& [g, n] : need)
        if (Used(g, r) + n > cap_) return false;
      return true;
    };
    auto load = [&](size_t r) {
      uint64_t most = 0;
      for (const auto& [g, n] : need) most = std::max({most, Used(g, r) + n, At(out_used[g], r), At(in_used[g], r)});
      return most;
    };
    size_t best = rounds;
    for (size_t r = 0; r < rounds; ++r)
      if (fits(r) && (best == rounds || load(r) < load(best))) best = r;
    while (!fits(best)) ++best;  // ends: Assemble checked that every rank's need fits an empty round
    for (const auto& [g, n] : need) Used(g, best) += n;
    as.round = best;
    for (uint32_t i : as.parts) {
      DPiece& p = pieces[i];
      p.round = best;
      if (p.a != p.b && ChannelOf(p.a, p.b) == Channel::net)
        At(out_used[p.a], best) += p.bytes, At(in_used[p.b], best) += p.bytes;
    }
  }
}

// Splits piece `idx` (queue[head]) so that its first part needs at most
// `avail` bytes: the first part replaces it at the head of the queue, the
// rest follow it. False if no part that small keeps every region in format.
bool Router::SplitFront(std::vector<DPiece>& pieces, uint32_t idx, uint64_t avail, std::vector<uint32_t>& queue,
                        size_t head) {
  const DPiece p = pieces[idx];
  if (p.quant >= 0) return false;  // pieces of quantized tensors are cut at block edges only
  const uint64_t esize = DtypeBytes(model_.tensors[p.tensor].dtype);
  const int64_t max_elems = static_cast<int64_t>((avail - (p.staged ? kAlign : 0)) / esize);
  if (max_elems <= 0) return false;
  // The first part that fits, and the rest of the piece in as few boxes as
  // possible (adjacent parts merged back), so that filling a round adds one
  // or two pieces, not many.
  std::vector<Box> split = SplitBox(p.box, max_elems);
  if (split.size() < 2) return false;
  std::vector<Box> parts = {split[0]};
  for (size_t i = 1; i < split.size(); ++i) {
    Box& last = parts.back();
    const Box& x = split[i];
    int diff = -1, ndiff = 0;
    for (int d = 0; d < x.ndim; ++d)
      if (x.lo[d] != last.lo[d] || x.hi[d] != last.hi[d]) diff = d, ++ndiff;
    if (parts.size() > 1 && ndiff == 1 && x.lo[diff] == last.hi[diff]) {
      last.hi[diff] = x.hi[diff];
    } else {
      parts.push_back(x);
    }
  }
  for (const Box& x : parts) {
    bool ok = RegionFits(SrcRegion(p.s, x)) && RegionFits(DstRegion(p.d, x));
    for (uint32_t k = 0; ok && k < p.hop_count; ++k) ok = RegionFits(DstRegion(hop_pool_[p.hop_begin + k].to, x));
    if (!ok) return false;
  }
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < parts.size(); ++i) {
    DPiece q = p;
    q.box = parts[i];
    q.bytes = static_cast<uint64_t>(parts[i].volume()) * esize;
    if (i == 0) {
      pieces[idx] = q;
      ids.push_back(idx);
    } else {
      ids.push_back(static_cast<uint32_t>(pieces.size()));
      pieces.push_back(q);
    }
  }
  queue.insert(queue.begin() + static_cast<std::ptrdiff_t>(head) + 1, ids.begin() + 1, ids.end());
  return true;
}

// Places every piece in a round, filling rounds one at a time: each round
// takes pieces pair by pair, the pairs whose sender or receiver has the most
// bytes still to move first, while every GPU the piece touches - its two ends
// in the round, each holder of its tree in the rounds after - has staging
// budget left, and no NIC carries more than its paced share of the round. The
// pace: R rounds are needed at least for the busiest rank's staging; every
// NIC's bytes are spread evenly over them, so the busiest NICs carry a full
// share in every round and finish together instead of a few stragglers
// holding up later rounds. Rotation order (receiver minus sender) breaks ties,
// so a round is close to a matching of senders to receivers and no NIC is
// converged on by many senders at once. A piece that does not fit whole is
// split to fill the round.
void Router::Schedule(std::vector<DPiece>& pieces) {
  const uint32_t n = static_cast<uint32_t>(ir_.ranks.size());
  auto rot = [n](uint32_t a, uint32_t b) { return (b + n - a) % n; };
  std::vector<uint32_t> order(pieces.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t i, uint32_t j) {
    const DPiece &x = pieces[i], &y = pieces[j];
    if (rot(x.a, x.b) != rot(y.a, y.b)) return rot(x.a, x.b) < rot(y.a, y.b);
    return x.a < y.a;
  });
  struct Pair {
    uint32_t a, b;
    std::vector<uint32_t> queue;  // pieces, in order
    size_t head = 0;
  };
  std::vector<Pair> pairs;
  std::vector<uint64_t> rem_out(n, 0), rem_in(n, 0);
  for (uint32_t i : order) {
    DPiece& p = pieces[i];
    if (p.assembly >= 0) continue;  // placed by PlaceAssemblies
    if (p.a == p.b) {  // a local copy
      p.round = 0;
      continue;
    }
    if (pairs.empty() || pairs.back().a != p.a || pairs.back().b != p.b) pairs.push_back({p.a, p.b, {}, 0});
    pairs.back().queue.push_back(i);
  }
  // Bytes every NIC still has to carry, each direction (priorities of the fill).
  auto account = [&](const DPiece& p, int64_t sign) {
    auto add = [sign](uint64_t& x, uint64_t b) { x = sign > 0 ? x + b : x - std::min(x, b); };
    add(rem_out[p.a], p.bytes);
    add(rem_in[p.b], p.bytes);
    for (uint32_t k = 0; k < p.hop_count; ++k) {
      const Hop& h = hop_pool_[p.hop_begin + k];
      const uint32_t from = HolderOf(p, h.parent);
      if (ChannelOf(from, h.rank) == Channel::net) add(rem_out[from], p.bytes), add(rem_in[h.rank], p.bytes);
    }
  };
  for (const DPiece& p : pieces)
    if (p.a != p.b && p.assembly < 0) account(p, +1);
  auto need_of = [](const DPiece& p) { return p.staged ? AlignUp(p.bytes) : p.bytes; };
  auto is_net = [&](uint32_t x, uint32_t y) { return ChannelOf(x, y) == Channel::net; };
  std::vector<uint64_t> held(n, 0), net_out(n, 0), net_in(n, 0);
  for (const Assembly& as : assemblies_) held[as.b] += AlignUp(as.frame_bytes) + as.grids * as.slot;
  for (const DPiece& p : pieces) {
    if (p.a == p.b) continue;
    held[p.a] += need_of(p);
    held[p.b] += need_of(p);
    if (is_net(p.a, p.b)) net_out[p.a] += p.bytes, net_in[p.b] += p.bytes;
    for (uint32_t k = 0; k < p.hop_count; ++k) {
      const Hop& h = hop_pool_[p.hop_begin + k];
      held[h.rank] += need_of(p);
      uint32_t from = HolderOf(p, h.parent);
      if (is_net(from, h.rank)) net_out[from] += p.bytes, net_in[h.rank] += p.bytes;
    }
  }
  uint64_t rounds = 1, busiest_net = 0;
  for (uint32_t g = 0; g < n; ++g) {
    rounds = std::max<uint64_t>(rounds, static_cast<uint64_t>(std::ceil(held[g] / (kFill * cap_))));
    busiest_net = std::max({busiest_net, net_out[g], net_in[g]});
  }
  const uint64_t net_cap = std::clamp<uint64_t>((busiest_net + rounds - 1) / rounds, kMinSplit, cap_);
  // Parts split off to fill a round are at least 1/16 of the round's share:
  // smaller ones would buy little balance for many more steps.
  const uint64_t min_split = std::max(kMinSplit, net_cap / 16);
  std::vector<std::vector<uint64_t>> out_used(n), in_used(n);
  PlaceAssemblies(pieces, rounds, out_used, in_used);
  auto room = [&](uint32_t rank, size_t r) { return Used(rank, r) == 0 ? cap_ : cap_ - std::min(cap_, Used(rank, r)); };
  auto net_room = [&](uint32_t from, uint32_t to, size_t r) -> uint64_t {
    if (!is_net(from, to)) return cap_;
    return net_cap - std::min(net_cap, std::max(At(out_used[from], r), At(in_used[to], r)));
  };
  // The bytes piece p can take in round r at every GPU it touches.
  // The bytes piece p can take in round r at every GPU it touches: staging
  // (hard) and the paced network share (soft).
  auto avail = [&](const DPiece& p, size_t r, bool with_net) {
    uint64_t v = std::min(room(p.a, r), room(p.b, r));
    if (with_net) v = std::min(v, net_room(p.a, p.b, r));
    for (uint32_t k = 0; k < p.hop_count; ++k) {
      const Hop& h = hop_pool_[p.hop_begin + k];
      v = std::min(v, room(h.rank, r + h.level));
      if (with_net) v = std::min(v, net_room(HolderOf(p, h.parent), h.rank, r + h.level));
    }
    return v;
  };
  auto take = [&](DPiece& p, size_t r) {
    const uint64_t need = need_of(p);
    Used(p.a, r) += need;
    Used(p.b, r) += need;
    if (is_net(p.a, p.b)) At(out_used[p.a], r) += p.bytes, At(in_used[p.b], r) += p.bytes;
    for (uint32_t k = 0; k < p.hop_count; ++k) {
      const Hop& h = hop_pool_[p.hop_begin + k];
      const uint32_t from = HolderOf(p, h.parent);
      Used(h.rank, r + h.level) += need;
      if (is_net(from, h.rank)) At(out_used[from], r + h.level) += p.bytes, At(in_used[h.rank], r + h.level) += p.bytes;
    }
    p.round = r;
  };
  std::vector<uint32_t> active(pairs.size());
  std::iota(active.begin(), active.end(), 0);
  for (size_t r = 0; !active.empty(); ++r) {
    std::stable_sort(active.begin(), active.end(), [&](uint32_t x, uint32_t y) {
      const Pair &u = pairs[x], &v = pairs[y];
      return std::max(rem_out[u.a], rem_in[u.b]) > std::max(rem_out[v.a], rem_in[v.b]);
    });
    for (uint32_t pi : active) {
      Pair& q = pairs[pi];
      while (q.head < q.queue.size()) {
        const uint32_t idx = q.queue[q.head];
        const DPiece& p = pieces[idx];
        const uint64_t free = avail(p, r, true), need = need_of(p);
        // A piece larger than the budget (sent straight between buffers) takes a round of its own.
        const bool alone = Used(p.a, r) == 0 && Used(p.b, r) == 0 && p.hop_count == 0;
        // A piece that overshoots the network share by a little goes whole
        // (fewer, larger steps) where staging allows.
        const bool overshoot = need <= free + net_cap / 64 && need <= avail(p, r, false);
        if (need > free && !alone && !overshoot) {
          // Fill the round: split off the part of the piece that fits, if worth a message.
          if (free < min_split || !SplitFront(pieces, idx, free, q.queue, q.head)) break;
        }
        DPiece& placed = pieces[q.queue[q.head]];
        take(placed, r);
        account(placed, -1);
        ++q.head;
      }
    }
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](uint32_t pi) { return pairs[pi].head == pairs[pi].queue.size(); }),
                 active.end());
  }
}

// Emits messages grouped by (round, sender, receiver). The staged pieces of a
// message lie in order in both staging areas; each hop of their trees then
// forwards runs of them that lie contiguous at the holder in one message.
void Router::EmitDirect(const std::vector<DPiece>& pieces) {
  uint32_t n = static_cast<uint32_t>(ir_.ranks.size());
  std::vector<size_t> order(pieces.size());
  std::iota(order.begin(), order.end(), 0);
  auto tree_less = [&](const DPiece& x, const DPiece& y) {
    if (x.hop_count != y.hop_count) return x.hop_count < y.hop_count;
    for (uint32_t k = 0; k < x.hop_count; ++k) {
      const Hop &u = hop_pool_[x.hop_begin + k], &v = hop_pool_[y.hop_begin + k];
      if (u.rank != v.rank) return u.rank < v.rank;
      if (u.parent != v.parent) return u.parent < v.parent;
    }
    return false;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) {
    const DPiece &x = pieces[i], &y = pieces[j];
    if (x.round != y.round) return x.round < y.round;
    uint32_t rx = (x.b + n - x.a) % n, ry = (y.b + n - y.a) % n;
    if (rx != ry) return rx < ry;
    if (x.a != y.a) return x.a < y.a;
    if (x.staged != y.staged) return x.staged > y.staged;
    return tree_less(x, y);
  });
  // The staged pieces of one round, with their staging offsets at b and at
  // each hop; their trees are emitted together once the round's messages are
  // out, so a holder forwards, per receiver, every run of pieces that lie
  // contiguous in its staging - whichever messages brought them - as one message.
  std::vector<size_t> staged;
  std::vector<std::vector<uint64_t>> at;
  uint32_t depth = 0;
  size_t batch_round = 0;
  // An assembly's frame and grid area, allocated in its receiver's staging with its first part.
  auto frame = [&](const DPiece& p) {
    Assembly& as = assemblies_[p.assembly];
    if (as.frame == ~uint64_t{0}) as.frame = Alloc(as.b, as.round, as.frame_bytes);
    return as.frame;
  };
  auto grid_at = [&](const DPiece& p) {
    Assembly& as = assemblies_[p.assembly];
    if (as.area == ~uint64_t{0}) as.area = Alloc(as.b, as.round, as.grids * as.slot);
    return as.area + static_cast<uint64_t>(p.grid) * as.slot;
  };
  std::map<size_t, std::vector<uint32_t>> assembled;  // per round: its assemblies
  for (uint32_t k = 0; k < assemblies_.size(); ++k) assembled[assemblies_[k].round].push_back(k);
  auto flush = [&] {
    // The round's assemblies are complete once its messages and their unpacks are: quantize each frame.
    if (auto it = assembled.find(batch_round); it != assembled.end()) {
      for (uint32_t k : it->second) {
        const Assembly& as = assemblies_[k];
        if (as.amax()) {
          const uint64_t values = as.frame_bytes ? as.frame : as.values;
          quant_.EmitScaledQuantize(as.tensor, as.need, as.grids, as.area, as.slot, values, as.d, ir_.ranks[as.b],
                                    as.round);
        } else {
          quant_.EmitUnpack(as.tensor, quant_.Assembled(as.tensor, as.need), as.d, ir_.ranks[as.b], as.round, as.frame);
        }
      }
    }
    for (uint32_t level = 1; level <= depth; ++level) {
      const size_t round = batch_round + level;
      struct Part {
        uint32_t from, to;
        uint64_t off;
        size_t s;
        uint32_t h;
      };
      std::vector<Part> parts;
      for (size_t s = 0; s < staged.size(); ++s) {
        const DPiece& p = pieces[staged[s]];
        for (uint32_t h = 0; h < p.hop_count; ++h) {
          const Hop& hop = hop_pool_[p.hop_begin + h];
          if (hop.level == level) parts.push_back({HolderOf(p, hop.parent), hop.rank, at[s][hop.parent + 1], s, h});
        }
      }
      std::sort(parts.begin(), parts.end(), [](const Part& x, const Part& y) {
        return std::tie(x.from, x.to, x.off) < std::tie(y.from, y.to, y.off);
      });
      for (size_t u = 0; u < parts.size();) {
        // A run: same holder and receiver, contiguous at the holder.
        size_t v = u + 1;
        uint64_t end = parts[u].off + AlignUp(pieces[staged[parts[u].s]].bytes);
        while (v < parts.size() && parts[v].from == parts[u].from && parts[v].to == parts[u].to && parts[v].off == end)
          end += AlignUp(pieces[staged[parts[v].s]].bytes), ++v;
        const uint32_t from = parts[u].from, to = parts[u].to;
        const uint64_t begin = parts[u].off, len = end - begin;
        RankProgram& F = ir_.ranks[from];
        RankProgram& G = ir_.ranks[to];
        const uint64_t og = Alloc(to, round, len);
        Step fw, fr;
        fw.kind = StepKind::forward, fr.kind = StepKind::recv;
        fw.channel = fr.channel = ChannelOf(from, to);
        fw.peer = to, fr.peer = from;
        fw.staging = begin, fr.staging = og;
        fw.bytes = fr.bytes = len;
        F.round(round).comm.push_back(fw);
        G.round(round).comm.push_back(fr);
        send_load_[from] += len;
        Count(from, to, len);
        for (size_t w = u; w < v; ++w) {
          const DPiece& p = pieces[staged[parts[w].s]];
          const uint64_t off = og + (parts[w].off - begin);
          at[parts[w].s][parts[w].h + 1] = off;
          if (p.quant >= 0) {
            quant_.EmitUnpack(p.tensor, qpieces_[p.quant], hop_pool_[p.hop_begin + parts[w].h].to, G, round, off);
            continue;
          }
          Step up = StagedStep(StepKind::unpack, model_.tensors[p.tensor].dtype, off, p.bytes);
          up.dst = G.AddRegion(DstRegion(hop_pool_[p.hop_begin + parts[w].h].to, p.box));
          G.round(round).unpack.push_back(up);
        }
        u = v;
      }
    }
    staged.clear();
    at.clear();
    depth = 0;
  };
  for (size_t i = 0; i < order.size();) {
    const DPiece& first = pieces[order[i]];
    if (first.round != batch_round) flush(), batch_round = first.round;
    size_t j = i;
    while (j < order.size() && pieces[order[j]].round == first.round && pieces[order[j]].a == first.a &&
           pieces[order[j]].b == first.b)
      ++j;
    RankProgram& A = ir_.ranks[first.a];
    RankProgram& B = ir_.ranks[first.b];
    Channel ch = ChannelOf(first.a, first.b);
    if (first.a == first.b) {
      for (size_t k = i; k < j; ++k) {
        const DPiece& p = pieces[order[k]];
        if (p.assembly >= 0) {
          const Assembly& as = assemblies_[p.assembly];
          if (p.grid >= 0)
            quant_.EmitAmax(p.tensor, as.cover, p.box, p.s, A, p.round, grid_at(p));
          else
            quant_.EmitPartCopy(p.tensor, as.amax() ? as.need : as.cover, p.box, p.s, A, p.round, frame(p));
          continue;
        }
        if (p.quant >= 0) {
          quant_.EmitCopy(p.tensor, qpieces_[p.quant], p.s, p.d, A, p.round);
          continue;
        }
        Step s;
        s.kind = StepKind::copy;
        s.wire = model_.tensors[p.tensor].dtype;
        s.bytes = p.bytes;
        s.src = A.AddRegion(SrcRegion(p.s, p.box));
        s.dst = A.AddRegion(DstRegion(p.d, p.box));
        A.round(p.round).local.push_back(s);
      }
      i = j;
      continue;
    }
    // Staged pieces: one message, contiguous in both staging areas.
    uint64_t total = 0;
    for (size_t k = i; k < j; ++k)
      if (pieces[order[k]].staged) total += AlignUp(pieces[order[k]].bytes);
    if (total > 0) {
      uint64_t oa = Alloc(first.a, first.round, total), ob = Alloc(first.b, first.round, total);
      uint64_t pos = 0;
      for (size_t k = i; k < j; ++k) {
        const DPiece& p = pieces[order[k]];
        if (!p.staged) continue;
        if (p.grid >= 0) {
          // A partial-amax grid (amax path) travels with the pair's values and is copied into the area.
          quant_.EmitAmax(p.tensor, assemblies_[p.assembly].cover, p.box, p.s, A, p.round, oa + pos);
          quant_.EmitGridUnpack(p.bytes, B, p.round, ob + pos, grid_at(p));
        } else if (p.assembly >= 0) {
          Assembly& as = assemblies_[p.assembly];
          quant_.EmitPack(p.tensor, qpieces_[p.quant], p.s, A, p.round, oa + pos);
          // The need's values as the amax path receives them: a part into the frame, or the one part as is.
          if (as.frame_bytes == 0)
            as.values = ob + pos;
          else
            quant_.EmitPartUnpack(p.tensor, as.amax() ? as.need : as.cover, p.box, B, p.round, ob + pos, frame(p));
        } else if (p.quant >= 0) {
          quant_.EmitPack(p.tensor, qpieces_[p.quant], p.s, A, p.round, oa + pos);
          quant_.EmitUnpack(p.tensor, qpieces_[p.quant], p.d, B, p.round, ob + pos);
        } else {
          Dtype w = model_.tensors[p.tensor].dtype;
          Step pk = StagedStep(StepKind::pack, w, oa + pos, p.bytes);
          pk.src = A.AddRegion(SrcRegion(p.s, p.box));
          A.round(p.round).local.push_back(pk);
          Step up = StagedStep(StepKind::unpack, w, ob + pos, p.bytes);
          up.dst = B.AddRegion(DstRegion(p.d, p.box));
          B.round(p.round).unpack.push_back(up);
        }
        staged.push_back(order[k]);
        at.push_back(std::vector<uint64_t>(p.hop_count + 1, 0));
        at.back()[0] = ob + pos;
        for (uint32_t h = 0; h < p.hop_count; ++h) depth = std::max(depth, hop_pool_[p.hop_begin + h].level);
        pos += AlignUp(p.bytes);
      }
      Step snd, rcv;
      snd.kind = StepKind::send, rcv.kind = StepKind::recv;
      snd.channel = rcv.channel = ch;
      snd.peer = first.b, rcv.peer = first.a;
      snd.staging = oa, rcv.staging = ob;
      snd.bytes = rcv.bytes = total;
      A.round(first.round).comm.push_back(snd);
      B.round(first.round).comm.push_back(rcv);
      Count(first.a, first.b, total);
    }
    for (size_t k = i; k < j; ++k) {
      const DPiece& p = pieces[order[k]];
      if (p.staged) continue;
      Step snd, rcv;
      snd.kind = StepKind::send, rcv.kind = StepKind::recv;
      snd.channel = rcv.channel = ch;
      snd.wire = rcv.wire = model_.tensors[p.tensor].dtype;
      snd.peer = p.b, rcv.peer = p.a;
      snd.bytes = rcv.bytes = p.bytes;
      snd.src = A.AddRegion(SrcRegion(p.s, p.box));
      rcv.dst = B.AddRegion(DstRegion(p.d, p.box));
      A.round(p.round).comm.push_back(snd);
      B.round(p.round).comm.push_back(rcv);
      Count(p.a, p.b, p.bytes);
    }
    i = j;
  }
  flush();
}

// ---------------------------------------------------------------- gather --

void Router::Gather() {
  for (int t = 0; t < static_cast<int>(model_.tensors.size()); ++t)
    if (quant_.Quantized(t))
      throw Error("--strategy gather: tensor '" + model_.tensors[t].name +
                  "' is stored quantized; quantized layouts are routed by the direct strategy only");
  std::vector<uint64_t> owned(ir_.ranks.size(), 0);
  uint32_t chain_salt = 0;
  for (int t = 0; t < static_cast<int>(model_.tensors.size()); ++t) {
    const TensorSpec& ts = model_.tensors[t];
    int nd = ts.ndim();
    int ns = static_cast<int>(ts.stack.size());
    Dtype w = ts.dtype;
    uint64_t esize = DtypeBytes(w);
    CellGrid g = BuildCells(src_, t, nd);
    // Units: the source grid's stack-dim cells, each over the whole shape.
    std::map<std::vector<int64_t>, Box> units;
    for (const Cell& c : g.cells) {
      std::vector<int64_t> key(c.box.lo.begin(), c.box.lo.begin() + ns);
      for (int d = 0; d < ns; ++d) key.push_back(c.box.hi[d]);
      Box u;
      u.ndim = nd;
      for (int d = 0; d < nd; ++d) {
        u.lo[d] = d < ns ? c.box.lo[d] : ts.lo[d];
        u.hi[d] = d < ns ? c.box.hi[d] : ts.hi[d];
      }
      units.emplace(key, u);
    }
    for (const auto& [key, unit] : units) {
      for (const Box& chunk : SplitBox(unit, std::max<int64_t>(1, static_cast<int64_t>(cap_ / esize)))) {
        // Shards of the chunk and the destinations that need any of it.
        struct Shard {
          Box box;
          const Cell* cell;
          uint64_t slot;
        };
        std::vector<Shard> shards;
        uint64_t image = 0;
        for (const Cell& c : g.cells) {
          if (!c.box.intersects(chunk)) continue;
          Box b = c.box.intersect(chunk);
          shards.push_back({b, &c, image});
          image += AlignUp(b.volume() * esize);
        }
        int64_t covered = 0;
        for (auto& s : shards) covered += s.box.volume();
        std::map<int, std::vector<FragmentRef>> needs;  // dst side rank -> fragments
        for (const FragmentRef& df : dst_.by_tensor[t])
          if (DstFrag(df).box.intersects(chunk)) needs[df.rank].push_back(df);
        if (needs.empty()) continue;
        if (covered != chunk.volume()) {
          const auto& [r, frs] = *needs.begin();
          NoSource(t, r, DstFrag(frs[0]).box.intersect(chunk));
        }
        // Owner: the holder with the fewest bytes owned so far.
        uint32_t owner = SrcGlobal(shards[0].cell->replicas[0].rank);
        for (auto& s : shards)
          for (auto& rep : s.cell->replicas)
            if (owned[SrcGlobal(rep.rank)] < owned[owner]) owner = SrcGlobal(rep.rank);
        owned[owner] += image;
        int owner_side = ir_.ranks[owner].src_rank;
        // Chain of destinations, rotated so that chains start on different ranks.
        std::vector<int> chain;
        bool owner_needs = false;
        for (auto& [r, frs] : needs) {
          if (DstGlobal(r) == owner) owner_needs = true;
          else chain.push_back(r);
        }
        if (!chain.empty()) std::rotate(chain.begin(), chain.begin() + (chain_salt++ % chain.size()), chain.end());
        // Remote shards: one replica each sends to the owner.
        std::vector<int> sender(shards.size(), -1);  // index into replicas, -1: owner holds it
        bool remote = false;
        for (size_t i = 0; i < shards.size(); ++i) {
          bool own = false;
          for (size_t k = 0; k < shards[i].cell->replicas.size(); ++k)
            if (shards[i].cell->replicas[k].rank == owner_side) own = true, sender[i] = static_cast<int>(k);
          if (!own) {
            sender[i] = PickReplica(shards[i].cell->replicas, chain_salt);
            remote = true;
          } else {
            sender[i] = -1 - sender[i];  // owner's own replica, encoded negative
          }
        }
        // Find the first start round where every participant has budget.
        auto fits = [&](size_t t1) {
          if (remote) {
            size_t t0 = t1 - 1;
            if (Used(owner, t0) + image > cap_) return false;
            for (size_t i = 0; i < shards.size(); ++i)
              if (sender[i] >= 0) {
                uint32_t a = SrcGlobal(shards[i].cell->replicas[sender[i]].rank);
                if (Used(a, t0) + AlignUp(shards[i].box.volume() * esize) > cap_) return false;
              }
          } else if (Used(owner, t1) + image > cap_) {
            return false;
          }
          for (size_t i = 0; i < chain.size(); ++i)
            if (Used(DstGlobal(chain[i]), t1 + i) + image > cap_) return false;
          return true;
        };
        size_t t1 = remote ? 1 : 0;
        while (!fits(t1)) ++t1;
        size_t t0 = remote ? t1 - 1 : t1;
        Used(owner, t0) += image;
        uint64_t img = Alloc(owner, t0, image);
        RankProgram& O = ir_.ranks[owner];
        for (size_t i = 0; i < shards.size(); ++i) {
          const Shard& s = shards[i];
          uint64_t bytes = s.box.volume() * esize;
          if (sender[i] < 0) {
            const FragmentRef& rep = s.cell->replicas[-1 - sender[i]];
            Step pk = StagedStep(StepKind::pack, w, img + s.slot, bytes);
            pk.src = O.AddRegion(SrcRegion(rep, s.box));
            O.round(t1).local.push_back(pk);
            continue;
          }
          const FragmentRef& rep = s.cell->replicas[sender[i]];
          uint32_t a = SrcGlobal(rep.rank);
          send_load_[a] += bytes;
          Used(a, t0) += AlignUp(bytes);
          uint64_t off = Alloc(a, t0, bytes);
          RankProgram& A = ir_.ranks[a];
          Step pk = StagedStep(StepKind::pack, w, off, bytes);
          pk.src = A.AddRegion(SrcRegion(rep, s.box));
          A.round(t0).local.push_back(pk);
          Step snd, rcv;
          snd.kind = StepKind::send, rcv.kind = StepKind::recv;
          snd.channel = rcv.channel = ChannelOf(a, owner);
          snd.peer = owner, rcv.peer = a;
          snd.staging = off, rcv.staging = img + s.slot;
          snd.bytes = rcv.bytes = bytes;
          A.round(t0).comm.push_back(snd);
          O.round(t0).comm.push_back(rcv);
          Count(a, owner, bytes);
        }
        // Each destination unpacks its part of every shard from the image.
        auto unpack = [&](RankProgram& P, size_t round, uint64_t base, const std::vector<FragmentRef>& frs) {
          for (const FragmentRef& df : frs) {
            for (const Shard& s : shards) {
              Box pb = s.box.intersect(DstFrag(df).box);
              if (pb.empty()) continue;
              std::vector<Box> work = {pb};
              while (!work.empty()) {
                Box x = work.back();
                work.pop_back();
                StridedRegion sr = StagingRegion(s.box, x, (base + s.slot) / esize).Coalesced();
                sr.buffer = kStaging;
                StridedRegion dr = DstRegion(df, x);
                if (!RegionFits(sr) || !RegionFits(dr)) {
                  for (const Box& y : SliceOuter(x)) work.push_back(y);
                  continue;
                }
                Step up = StagedStep(StepKind::unpack, w, base + s.slot, x.volume() * esize);
                up.src = P.AddRegion(sr);
                up.dst = P.AddRegion(dr);
                P.round(round).unpack.push_back(up);
              }
            }
          }
        };
        if (owner_needs) unpack(O, t1, img, needs[ir_.ranks[owner].dst_rank]);
        uint32_t prev = owner;
        uint64_t prev_off = img;
        for (size_t i = 0; i < chain.size(); ++i) {
          uint32_t b = DstGlobal(chain[i]);
          size_t r = t1 + i;
          Used(b, r) += image;
          uint64_t off = Alloc(b, r, image);
          Step snd, rcv;
          snd.kind = i == 0 ? StepKind::send : StepKind::forward;
          rcv.kind = StepKind::recv;
          snd.channel = rcv.channel = ChannelOf(prev, b);
          snd.peer = b, rcv.peer = prev;
          snd.staging = prev_off, rcv.staging = off;
          snd.bytes = rcv.bytes = image;
          ir_.ranks[prev].round(r).comm.push_back(snd);
          ir_.ranks[b].round(r).comm.push_back(rcv);
          send_load_[prev] += image;
          Count(prev, b, image);
          unpack(ir_.ranks[b], r, off, needs[chain[i]]);
          prev = b;
          prev_off = off;
        }
      }
    }
  }
}

PlanIR Router::Run() {
  ir_.strategy = opt_.strategy;
  ir_.staging_limit = opt_.staging_bytes;
  cap_ = opt_.staging_bytes / 2 / kAlign * kAlign;
  if (cap_ < (1u << 20)) throw Error("--staging-mb: the staging budget must be at least 2 MiB per rank");
  uint32_t ns = static_cast<uint32_t>(src_layout_.ranks), nd = static_cast<uint32_t>(dst_layout_.ranks);
  uint32_t total;
  if (cluster_.colocated) {
    if (nd > ns)
      throw Error(cluster_.file + ": /placement: colocated placement needs at least as many training ranks (" +
                  std::to_string(ns) + ") as inference ranks (" + std::to_string(nd) + ")");
    total = ns;
    for (uint32_t i = 0; i < ns; ++i) ir_.src_global.push_back(i);
    for (uint32_t j = 0; j < nd; ++j) ir_.dst_global.push_back(j);
  } else {
    // Training ranks fill domains from global rank 0 (train_per_domain GPUs
    // of each); inference ranks follow.
    const uint64_t gpd = static_cast<uint64_t>(cluster_.gpus_per_domain);
    const uint64_t tpd = cluster_.train_per_domain ? cluster_.train_per_domain : gpd;
    const uint64_t ipd = cluster_.infer_per_domain ? cluster_.infer_per_domain : gpd;
    for (uint32_t i = 0; i < ns; ++i) ir_.src_global.push_back(static_cast<uint32_t>(i / tpd * gpd + i % tpd));
    // With a per-domain count for either side the two sides use disjoint
    // domains: inference starts on the next fresh one.
    const bool fresh = cluster_.train_per_domain || cluster_.infer_per_domain;
    const uint64_t base = !ns ? 0 : fresh ? (ir_.src_global.back() / gpd + 1) * gpd : ir_.src_global.back() + 1;
    for (uint32_t j = 0; j < nd; ++j) ir_.dst_global.push_back(static_cast<uint32_t>(base + j / ipd * gpd + j % ipd));
    const uint64_t last = nd ? ir_.dst_global.back() : (ns ? ir_.src_global.back() : 0);
    if (last >= (uint64_t{1} << 31)) throw Error(cluster_.file + ": more than 2^31 global ranks");
    total = static_cast<uint32_t>(last + 1);
  }
  ir_.ranks.resize(total);
  for (uint32_t g = 0; g < total; ++g) ir_.domain.push_back(static_cast<uint32_t>(g / cluster_.gpus_per_domain));
  for (uint32_t i = 0; i < ns; ++i) {
    RankProgram& p = ir_.ranks[ir_.src_global[i]];
    p.src_rank = static_cast<int>(i);
    p.buffers = src_.ranks[i].buffers;
    p.fragments = src_.ranks[i].fragments;
    p.roles.assign(p.fragments.size(), 0);
  }
  for (uint32_t j = 0; j < nd; ++j) {
    RankProgram& p = ir_.ranks[ir_.dst_global[j]];
    p.dst_rank = static_cast<int>(j);
    p.dst_buffer_base = static_cast<uint32_t>(p.buffers.size());
    std::unordered_map<std::string, int> names;
    for (auto& b : p.buffers) names.emplace(b.name, 0);
    for (const auto& b : dst_.ranks[j].buffers) {
      if (names.count(b.name))
        throw Error("buffer '" + b.name + "' is bound on global rank " + std::to_string(ir_.dst_global[j]) +
                    " by both layouts; colocated ranks need distinct buffer names");
      p.buffers.push_back(b);
    }
    for (Fragment f : dst_.ranks[j].fragments) {
      f.buffer += p.dst_buffer_base;
      p.fragments.push_back(f);
      p.roles.push_back(1);
    }
  }
  send_load_.assign(total, 0);
  entry_load_.assign(total, 0);
  relay_load_.assign(total, 0);
  odd_base_.assign(total, cap_);
  used_.assign(total, {});
  arena_.assign(total, {});
  if (opt_.strategy == "direct") Direct();
  else if (opt_.strategy == "gather") Gather();
  else throw Error("--strategy: unknown strategy '" + opt_.strategy + "', expected 'direct' or 'gather'");
  for (auto& p : ir_.ranks) ir_.num_rounds = std::max(ir_.num_rounds, p.rounds.size());
  for (auto& p : ir_.ranks) p.rounds.resize(ir_.num_rounds);
  return std::move(ir_);
}

}  // namespace

PlanIR Route(const ModelSpec& model, const ClusterSpec& cluster, const LayoutSpec& src_layout, const Expansion& src,
             const LayoutSpec& dst_layout, const Expansion& dst, const RouteOptions& opt) {
  return Router(model, cluster, src_layout, src, dst_layout, dst, opt).Run();
}

}  // namespace reshard
