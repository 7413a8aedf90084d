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
#include <map>
#include <numeric>
#include <unordered_map>

#include "compiler/program.h"
#include "runtime/error.h"

namespace reshard {
namespace {

constexpr uint64_t kAlign = 256;
uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

bool RegionFits(const StridedRegion& r) {
  if (r.ndim > 4) return false;
  for (int k = 0; k < r.ndim; ++k)
    if (r.stride[k] >= (int64_t{1} << 32) || r.shape[k] >= (int64_t{1} << 32)) return false;
  return true;
}

// Row-major region of `sub` inside a staging block holding `whole` (row-major)
// at element offset `base`.
StridedRegion StagingRegion(const Box& whole, const Box& sub, uint64_t base) {
  StridedRegion r;
  r.buffer = kStaging;
  r.ndim = whole.ndim;
  int64_t stride = 1, off = 0;
  for (int d = whole.ndim - 1; d >= 0; --d) {
    r.shape[d] = sub.extent(d);
    r.stride[d] = stride;
    off += (sub.lo[d] - whole.lo[d]) * stride;
    stride *= whole.extent(d);
  }
  r.offset = base + static_cast<uint64_t>(off);
  return r;
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

class Router {
 public:
  Router(const ModelSpec& m, const ClusterSpec& c, const LayoutSpec& sl, const Expansion& s, const LayoutSpec& dl,
         const Expansion& d, const RouteOptions& o)
      : model_(m), cluster_(c), src_layout_(sl), src_(s), dst_layout_(dl), dst_(d), opt_(o) {}

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
  // Bump allocation in the round's staging arena.
  uint64_t Alloc(uint32_t rank, size_t round, uint64_t bytes) {
    uint64_t& bump = At(arena_[rank], round);
    uint64_t off = (round % 2) * cap_ + bump;
    bump += AlignUp(bytes);
    ir_.ranks[rank].staging_bytes = std::max(ir_.ranks[rank].staging_bytes, off + AlignUp(bytes));
    return off;
  }
  void Count(uint32_t a, uint32_t b, uint64_t bytes) {
    (ChannelOf(a, b) == Channel::net ? ir_.net_bytes : ir_.nvlink_bytes) += bytes;
  }

  void Direct();
  void Gather();

  const ModelSpec& model_;
  const ClusterSpec& cluster_;
  const LayoutSpec& src_layout_;
  const Expansion& src_;
  const LayoutSpec& dst_layout_;
  const Expansion& dst_;
  const RouteOptions& opt_;
  PlanIR ir_;
  uint64_t cap_ = 0;                          // arena size
  std::vector<uint64_t> send_load_;           // bytes each global rank sends
  std::vector<std::vector<uint64_t>> used_;   // per global rank, per round: bytes scheduled
  std::vector<std::vector<uint64_t>> arena_;  // per global rank, per round: bytes allocated
};

// ---------------------------------------------------------------- direct --

struct DPiece {
  int tensor;
  Box box;
  FragmentRef s, d;
  uint32_t a, b;  // global ranks
  uint64_t bytes;
  bool staged;
  size_t round = 0;
};

void Router::Direct() {
  std::vector<DPiece> pieces;
  for (int t = 0; t < static_cast<int>(model_.tensors.size()); ++t) {
    const TensorSpec& ts = model_.tensors[t];
    int nd = ts.ndim();
    CellGrid g = BuildCells(src_, t, nd);
    uint64_t esize = DtypeBytes(ts.dtype);
    for (const FragmentRef& df : dst_.by_tensor[t]) {
      const Box& need = DstFrag(df).box;
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
        const Cell& cell = g.cells[it->second];
        int k = PickReplica(cell.replicas, static_cast<uint32_t>(df.rank));
        FragmentRef sf = cell.replicas[k];
        uint32_t a = SrcGlobal(sf.rank), b = DstGlobal(df.rank);
        send_load_[a] += piece.volume() * esize;
        // Split to fit the staging arena and the 4-mode region format. A piece
        // contiguous on both sides needs no staging: only the 4 GiB step limit.
        StridedRegion whole_s = SrcRegion(sf, piece), whole_d = DstRegion(df, piece);
        bool contiguous = whole_s.contiguous() && whole_d.contiguous();
        uint64_t max_bytes = contiguous ? (uint64_t{1} << 31) : cap_ / 2;
        std::vector<Box> work = SplitBox(piece, std::max<int64_t>(1, static_cast<int64_t>(max_bytes / esize)));
        while (!work.empty()) {
          Box x = work.back();
          work.pop_back();
          StridedRegion rs = SrcRegion(sf, x), rd = DstRegion(df, x);
          if (!RegionFits(rs) || !RegionFits(rd)) {
            for (const Box& y : SliceOuter(x)) work.push_back(y);
            continue;
          }
          DPiece p{t, x, sf, df, a, b, static_cast<uint64_t>(x.volume()) * esize, true};
          p.staged = !(rs.contiguous() && rd.contiguous() &&
                       src_.ranks[sf.rank].buffers[rs.buffer].dtype == ts.dtype &&
                       dst_.ranks[df.rank].buffers[rd.buffer - ir_.ranks[b].dst_buffer_base].dtype == ts.dtype);
          pieces.push_back(p);
        }
        int d = nd - 1;
        while (d >= 0 && ++cur[d] == s1[d]) cur[d] = s0[d], --d;
        if (d < 0) break;
      }
    }
  }
  // Order so that each stretch of pieces is close to a matching of senders to
  // receivers (rotate partners), then place each in the earliest round where
  // both ends have budget left.
  uint32_t n = static_cast<uint32_t>(ir_.ranks.size());
  std::stable_sort(pieces.begin(), pieces.end(), [&](const DPiece& x, const DPiece& y) {
    uint32_t rx = (x.b + n - x.a) % n, ry = (y.b + n - y.a) % n;
    if (rx != ry) return rx < ry;
    if (x.a != y.a) return x.a < y.a;
    return false;
  });
  std::vector<size_t> lowest(n, 0);
  for (DPiece& p : pieces) {
    if (p.a == p.b) {
      p.round = 0;
      continue;
    }
    uint64_t need = p.staged ? AlignUp(p.bytes) : p.bytes;
    size_t r = std::max(lowest[p.a], lowest[p.b]);
    // A piece larger than the budget (sent straight between buffers) takes a round of its own.
    while ((Used(p.a, r) + need > cap_ && Used(p.a, r) > 0) || (Used(p.b, r) + need > cap_ && Used(p.b, r) > 0)) ++r;
    Used(p.a, r) += need;
    Used(p.b, r) += need;
    p.round = r;
    for (uint32_t x : {p.a, p.b})
      while (Used(x, lowest[x]) + cap_ / 64 > cap_) ++lowest[x];
  }
  // Emit: messages grouped by (round, sender, receiver).
  std::vector<size_t> order(pieces.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) {
    const DPiece &x = pieces[i], &y = pieces[j];
    if (x.round != y.round) return x.round < y.round;
    uint32_t rx = (x.b + n - x.a) % n, ry = (y.b + n - y.a) % n;
    if (rx != ry) return rx < ry;
    if (x.a != y.a) return x.a < y.a;
    return x.staged > y.staged;
  });
  for (size_t i = 0; i < order.size();) {
    const DPiece& first = pieces[order[i]];
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
        Dtype w = model_.tensors[p.tensor].dtype;
        Step pk;
        pk.kind = StepKind::pack;
        pk.wire = w;
        pk.staging = oa + pos;
        pk.bytes = p.bytes;
        pk.src = A.AddRegion(SrcRegion(p.s, p.box));
        A.round(p.round).local.push_back(pk);
        Step up;
        up.kind = StepKind::unpack;
        up.wire = w;
        up.staging = ob + pos;
        up.bytes = p.bytes;
        up.dst = B.AddRegion(DstRegion(p.d, p.box));
        B.round(p.round).unpack.push_back(up);
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
}

// ---------------------------------------------------------------- gather --

void Router::Gather() {
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
            Step pk;
            pk.kind = StepKind::pack;
            pk.wire = w;
            pk.staging = img + s.slot;
            pk.bytes = bytes;
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
          Step pk;
          pk.kind = StepKind::pack;
          pk.wire = w;
          pk.staging = off;
          pk.bytes = bytes;
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
                Step up;
                up.kind = StepKind::unpack;
                up.wire = w;
                up.bytes = x.volume() * esize;
                up.staging = base + s.slot;
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
    total = ns + nd;
    for (uint32_t i = 0; i < ns; ++i) ir_.src_global.push_back(i);
    for (uint32_t j = 0; j < nd; ++j) ir_.dst_global.push_back(ns + j);
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
