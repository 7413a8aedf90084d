// Blocks the destination quantizes that several source cells share
// (router.h, quant_route.h): assemblies, their staging, their rounds.

#include "compiler/router.h"

#include "compiler/fill_pieces.h"

#include <algorithm>

namespace reshard::routing {

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
template <typename Pieces>
std::map<uint32_t, uint64_t> Router::AssemblyNeed(const Assembly& as, const Pieces& pieces) const {
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

// Every part of an assembly arrives in one round (its receiver quantizes in
// that round's unpacks). Before the other pieces fill the rounds, each
// assembly takes, among the first `rounds` rounds, the one where the busiest
// of its GPUs has the least staging and network share in use (so that they
// spread over the rounds instead of crowding the first), or, if none has
// room, the first round after them that has.
void Router::PlaceAssemblies(FillPieces& pieces, size_t rounds, std::vector<std::vector<uint64_t>>& out_used,
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
      const DPiece& p = pieces[i];
      pieces.SetRound(i, best);
      if (p.a != p.b && ChannelOf(p.a, p.b) == Channel::net)
        At(out_used[p.a], best) += p.bytes, At(in_used[p.b], best) += p.bytes;
    }
  }
}

}  // namespace reshard::routing
