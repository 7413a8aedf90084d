// The gather strategy (router.h).

#include "compiler/router.h"

#include <algorithm>
#include <numeric>

namespace reshard::routing {


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
        // Colocated: a destination whose own GPU holds every shard of its
        // part of the chunk copies it there (round 0) and leaves the chain;
        // what a GPU holds is never sent to it.
        for (auto it = needs.begin(); it != needs.end();) {
          const uint32_t gpu = DstGlobal(it->first);
          bool held = true;
          for (const FragmentRef& df : it->second)
            for (const Shard& s : shards)
              if (held && s.box.intersects(DstFrag(df).box)) held = ReplicaOn(s.cell->replicas, gpu) >= 0;
          if (!held) {
            ++it;
            continue;
          }
          RankProgram& P = ir_.ranks[gpu];
          for (const FragmentRef& df : it->second) {
            for (const Shard& s : shards) {
              if (!s.box.intersects(DstFrag(df).box)) continue;  // (held: the GPU holds a replica of the others)
              std::vector<Box> work = {s.box.intersect(DstFrag(df).box)};
              const FragmentRef& rep = s.cell->replicas[ReplicaOn(s.cell->replicas, gpu)];
              while (!work.empty()) {
                Box x = work.back();
                work.pop_back();
                if (x.empty()) continue;
                const StridedRegion sr = SrcRegion(rep, x), dr = DstRegion(df, x);
                if (!RegionFits(sr) || !RegionFits(dr)) {
                  for (const Box& y : SliceOuter(x)) work.push_back(y);
                  continue;
                }
                Step cp;
                cp.kind = StepKind::copy;
                cp.wire = w;
                cp.bytes = static_cast<uint64_t>(x.volume()) * esize;
                cp.src = P.AddRegion(sr);
                cp.dst = P.AddRegion(dr);
                P.round(0).local.push_back(cp);
              }
            }
          }
          it = needs.erase(it);
        }
        if (needs.empty()) continue;
        // Owner: the holder with the fewest bytes owned so far; colocated,
        // one whose GPU needs the chunk first (it then unpacks its part from
        // the image it gathered instead of receiving it down the chain).
        auto needed_on = [&](uint32_t g) { return ir_.ranks[g].dst_rank >= 0 && needs.count(ir_.ranks[g].dst_rank) > 0; };
        uint32_t owner = SrcGlobal(shards[0].cell->replicas[0].rank);
        for (auto& s : shards)
          for (auto& rep : s.cell->replicas) {
            const uint32_t g = SrcGlobal(rep.rank);
            if (needed_on(g) != needed_on(owner) ? needed_on(g) : owned[g] < owned[owner]) owner = g;
          }
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

}  // namespace reshard::routing
