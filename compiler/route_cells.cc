// Source cells (router.h): the grid every training-side box edge makes.

#include "compiler/router.h"

#include <algorithm>

namespace reshard::routing {

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

}  // namespace reshard::routing
