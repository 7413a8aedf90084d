// Direct routing (router.h): pieces, NVLink exchange stripes, relay trees.

#include "compiler/router.h"

#include <algorithm>
#include <exception>
#include <future>
#include <limits>
#include <numeric>
#include <optional>

#include "compiler/phase_times.h"

namespace reshard::routing {

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

uint32_t Router::HolderOf(const DPiece& p, int32_t h) const {
  return h == kFromSender ? p.a : h < 0 ? p.b : hop_pool_[p.hop_begin + h].rank;
}

void Router::AddPieces(int t, const Cell& cell, const Box& piece, const FragmentRef& df,
                       const std::vector<Hop>& hops, uint32_t salt, std::vector<DPiece>& pieces) {
  const TensorSpec& ts = model_.tensors[t];
  const uint64_t esize = DtypeBytes(ts.dtype);
  const uint32_t b = DstGlobal(df.rank);
  // Colocated: a replica on the receiver's own GPU is copied there, never sent.
  int k = ReplicaOn(cell.replicas, b);
  if (k < 0) k = PickReplica(cell.replicas, salt);
  FragmentRef sf = cell.replicas[k];
  const uint32_t a = SrcGlobal(sf.rank);
  const bool relayed = !hops.empty();
  const uint32_t hop_begin = static_cast<uint32_t>(hop_pool_.size());
  hop_pool_.insert(hop_pool_.end(), hops.begin(), hops.end());
  if (quant_.Quantized(t)) {  // whole scale blocks: quant_route.h
    for (const QuantPiece& q : quant_.Pieces(t, sf, cell.box, df, piece, quant_cap_, PieceCap())) {
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
  const int64_t max_elements = std::max<int64_t>(1, static_cast<int64_t>(max_bytes / esize));
  // A piece within the cap (every piece of DeepSeek-V3's plan) is its own
  // first box, its regions those just worked out: not split, not worked
  // out again (a quarter of this serial phase's instructions).
  const bool whole = piece.volume() <= max_elements;
  std::vector<Box> work;
  if (!whole) {
    work = SplitBox(piece, max_elements);
    std::reverse(work.begin(), work.end());
  }
  for (bool first = true; first || !work.empty(); first = false) {
    const bool as_is = first && whole;  // the piece itself
    Box x = as_is ? piece : work.back();
    if (!as_is) work.pop_back();
    StridedRegion rs = as_is ? whole_s : SrcRegion(sf, x), rd = as_is ? whole_d : DstRegion(df, x);
    bool fits = RegionFits(rs) && RegionFits(rd);
    for (const Hop& h : hops) fits = fits && DstFits(h.to, x);
    if (!fits) {
      std::vector<Box> slices = SliceOuter(x);
      work.insert(work.end(), slices.rbegin(), slices.rend());
      continue;
    }
    DPiece p{t, x, sf, df, a, b, static_cast<uint64_t>(x.volume()) * esize, true};
    // Straight from buffer to buffer only where neither end converts: same
    // dtype as the wire, no offset (a staged end applies it).
    const BufferDesc& bs = src_.ranks[sf.rank].buffers[rs.buffer];
    const BufferDesc& bd = dst_.ranks[df.rank].buffers[rd.buffer - ir_.ranks[b].dst_buffer_base];
    p.staged = relayed || !(rs.contiguous() && rd.contiguous() && bs.dtype == ts.dtype && bd.dtype == ts.dtype &&
                            bs.offset == 0 && bd.offset == 0);
    p.hop_begin = hop_begin;
    p.hop_count = static_cast<uint32_t>(hops.size());
    pieces.push_back(p);
  }
}

// The busiest source's network bytes if relayed stripes came from their
// sources instead, over the busiest destination domain's network bytes in
// per GPU (the same either way). Conservative: a relayed stripe is counted
// on the replica that sent it, where another replica might share the load.
double Router::RelaysSpare(const std::vector<DPiece>& pieces) const {
  const size_t n = ir_.ranks.size();
  std::vector<uint64_t> out(n, 0), in(n, 0);
  for (const DPiece& p : pieces) {
    if (ChannelOf(p.a, p.b) == Channel::net) out[p.a] += p.bytes, in[ir_.domain[p.b]] += p.bytes;
    for (uint32_t k = 0; k < p.hop_count; ++k) {
      const Hop& h = hop_pool_[p.hop_begin + k];
      if (ChannelOf(HolderOf(p, h.parent), h.rank) != Channel::net) continue;
      out[p.a] += p.bytes;
      in[ir_.domain[h.rank]] += p.bytes;
    }
  }
  const uint64_t busiest_in = n ? *std::max_element(in.begin(), in.end()) : 0;
  if (busiest_in == 0) return std::numeric_limits<double>::infinity();
  return static_cast<double>(*std::max_element(out.begin(), out.end())) /
         (static_cast<double>(busiest_in) / cluster_.gpus_per_domain);
}

void Router::Direct() {
  std::optional<Phase> phase(std::in_place, "route: pieces");
  std::vector<DPiece> pieces;  // a local, not pieces_, while the fills copy the router
  const uint32_t stripe_mib = opt_.fill_of ? opt_.fill_of->stripe_mib : opt_.stripe_mib;
  quant_cap_ = QuantPieceCap(stripe_mib);
  const uint64_t stripe_min = uint64_t{stripe_mib} << 20;
  // Every destination need as pieces; relay trees of up to `tree_domains`
  // destination domains (1: none, every domain's entry GPUs take their
  // stripes from the sources themselves).
  // Each tensor's needs cut by its source cells. Nothing of it depends on
  // the routing so far, so a thread of its own cuts the next chunk of
  // tensors (about a sixteenth of the needs) while the routing, which
  // carries loads from tensor to tensor, goes through the chunk before; a
  // tensor's cut is freed once it is routed.
  struct TensorNeeds {
    CellGrid g;
    std::vector<std::pair<size_t, FragmentRef>> assembled;  // needs (and their place in by_tensor) whose blocks
                                                            // a source cell cuts: assembled at the receiver
    std::vector<std::pair<int, std::vector<std::pair<FragmentRef, Box>>>> wants;  // per source cell, in order:
                                                                                   // who needs which box of it
    std::exception_ptr error;    // where the cut failed (a need no source holds): routing stops there
    size_t error_at = 0;         // the need it failed at, its place in by_tensor (all of them where none failed)
  };
  std::vector<TensorNeeds> needs(model_.tensors.size());
  auto cut = [&](size_t t) {
    TensorNeeds& tn = needs[t];
    const int ti = static_cast<int>(t);
    try {
      tn.g = BuildCells(src_, ti, model_.tensors[t].ndim());
      const CellGrid& g = tn.g;
      std::map<int, std::vector<std::pair<FragmentRef, Box>>> wants;
      for (size_t& k = tn.error_at; k < dst_.by_tensor[t].size(); ++k) {
        const FragmentRef& df = dst_.by_tensor[t][k];
        // A need whose blocks some source cell cuts is assembled at the receiver.
        std::vector<std::pair<int, Box>> mine;
        bool whole = true;
        ForCells(ti, g, df, DstFrag(df).box, [&](int ci, const Box& piece) {
          whole = whole && (!quant_.Quantized(ti) || g.cells[ci].box.contains(quant_.Cover(ti, piece)));
          mine.push_back({ci, piece});
        });
        if (!whole) {
          tn.assembled.push_back({k, df});
          continue;
        }
        for (const auto& [ci, piece] : mine) wants[ci].push_back({df, piece});
      }
      for (auto& [ci, list] : wants) {
        // Needers of identical boxes next to each other (in need order among them).
        std::stable_sort(list.begin(), list.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
        tn.wants.emplace_back(ci, std::move(list));
      }
    } catch (...) {
      tn.error = std::current_exception();
    }
  };
  std::vector<size_t> chunk_end;  // the tensors in chunks, each ending before chunk_end[k]
  {
    size_t total = 0, acc = 0;
    for (const auto& list : dst_.by_tensor) total += list.size() + 1;
    for (size_t t = 0; t < needs.size(); ++t) {
      acc += dst_.by_tensor[t].size() + 1;
      if (acc * 16 >= total || t + 1 == needs.size()) chunk_end.push_back(t + 1), acc = 0;
    }
  }
  auto cut_chunk = [&](size_t k) {
    for (size_t t = k ? chunk_end[k - 1] : 0; t < chunk_end[k]; ++t) cut(t);
  };
  // The routing's scratch, reused from group to group and tree to tree (made
  // afresh each time, their allocations were a large part of this serial
  // phase's instructions on large plans).
  struct Dom {
    uint32_t domain, begin, end;  // a destination domain and its needers: needers[begin, end)
  };
  std::vector<std::pair<size_t, size_t>> groups;
  std::vector<bool> has_replica;
  std::vector<std::pair<uint32_t, size_t>> needer_domain;
  std::vector<size_t> needers, entry, pos, by_load, tdom, tentry;
  std::vector<Dom> doms;
  std::vector<Hop> hops;
  std::vector<int32_t> entry_hop;
  std::vector<uint32_t> depth;
  auto route_all = [&](size_t tree_domains) {
    std::future<void> ahead;  // the next chunk's cut
    for (size_t k = 0; k < chunk_end.size(); ++k) {
      if (k == 0) cut_chunk(0);
      else ahead.get();
      if (k + 1 < chunk_end.size()) ahead = std::async(std::launch::async, cut_chunk, k + 1);
      for (int t = k ? static_cast<int>(chunk_end[k - 1]) : 0; t < static_cast<int>(chunk_end[k]); ++t) {
        const TensorSpec& ts = model_.tensors[t];
        TensorNeeds& tn = needs[t];
        const CellGrid& g = tn.g;
        uint64_t esize = DtypeBytes(ts.dtype);
        // In need order, as they were cut: the needs assembled before a need
        // with no source, then its error.
        for (const auto& [at, df] : tn.assembled)
          if (at < tn.error_at) Assemble(t, g, df, pieces);
        if (tn.error) std::rethrow_exception(tn.error);
        for (const auto& [ci, list] : tn.wants) {
          const Cell& cell = g.cells[ci];
          // Needers of identical boxes form a group; groups must not overlap.
          groups.clear();
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
          has_replica.clear();  // per domain: a replica of the cell sits there
          for (const FragmentRef& rep : cell.replicas) {
            uint32_t d = ir_.domain[SrcGlobal(rep.rank)];
            if (has_replica.size() <= d) has_replica.resize(d + 1, false);
            has_replica[d] = true;
          }
          auto local = [&](uint32_t d) { return d < has_replica.size() && has_replica[d]; };
          auto self_held = [&](const FragmentRef& df) { return ReplicaOn(cell.replicas, DstGlobal(df.rank)) >= 0; };
          for (auto [i, j] : groups) {
            const Box& box = list[i].second;
            // Needers by domain, in domain order, each domain's in need
            // order (needer_domain, then doms: a domain and its run of
            // needers in `needers`); those in a domain holding a replica
            // take it straight from one.
            needer_domain.clear();
            for (size_t k = i; k < j; ++k) {
              uint32_t d = ir_.domain[DstGlobal(list[k].first.rank)];
              if (!exchange || local(d) || self_held(list[k].first)) {
                AddPieces(t, cell, box, list[k].first, {}, list[k].first.rank, pieces);
              } else {
                needer_domain.push_back({d, k});
              }
            }
            if (needer_domain.empty()) continue;
            auto by_domain = [](const auto& x, const auto& y) { return x.first < y.first; };
            if (!std::is_sorted(needer_domain.begin(), needer_domain.end(), by_domain))
              std::stable_sort(needer_domain.begin(), needer_domain.end(), by_domain);
            needers.clear();
            doms.clear();
            size_t most = 0;
            for (const auto& [d, k] : needer_domain) {
              if (doms.empty() || doms.back().domain != d)
                doms.push_back({d, static_cast<uint32_t>(needers.size()), static_cast<uint32_t>(needers.size())});
              needers.push_back(k);
              most = std::max<size_t>(most, ++doms.back().end - doms.back().begin);
            }
            if (doms.size() == 1 && most == 1) {  // one needer
              size_t k = needers[0];
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
              // Fixed partner domains (a tree per consecutive kTreeDomains), roles set by load below:
              // pieces relayed between the same two GPUs then travel in one message.
              entry.resize(doms.size());
              for (size_t x = 0; x < doms.size(); ++x) {
                entry[x] = needers[doms[x].begin];
                for (uint32_t q = doms[x].begin; q < doms[x].end; ++q) {
                  const size_t k = needers[q];
                  if (entry_load_[DstGlobal(list[k].first.rank)] < entry_load_[DstGlobal(list[entry[x]].first.rank)])
                    entry[x] = k;
                }
                entry_load_[DstGlobal(list[entry[x]].first.rank)] += sbytes;
              }
              // Trees of at most kTreeDomains domains (one source send each), fan-out
              // kTreeFanout. Tree positions with the most children go to the entries
              // that have forwarded the least so far, so relaying spreads over all NICs.
              // Deeper or wider trees save more source egress but burst a holder's
              // NIC and tie more rounds together; pairs measured best (simulate).
              for (size_t t0 = 0; t0 < doms.size(); t0 += tree_domains) {
                const size_t m = std::min(tree_domains, doms.size() - t0);
                auto kids = [m](size_t x) {
                  size_t c = 0;
                  for (size_t f = 1; f <= kTreeFanout; ++f) c += kTreeFanout * x + f < m;
                  return c;
                };
                pos.resize(m), by_load.resize(m);
                std::iota(pos.begin(), pos.end(), 0);
                std::iota(by_load.begin(), by_load.end(), t0);
                // Stable insertion sorts of at most kTreeDomains entries (gcc 12
                // warns about std::stable_sort's paths for long ranges here).
                auto stable_sort_small = [](std::vector<size_t>& v, auto less) {
                  for (size_t i = 1; i < v.size(); ++i)
                    for (size_t j = i; j > 0 && less(v[j], v[j - 1]); --j) std::swap(v[j], v[j - 1]);
                };
                stable_sort_small(pos, [&](size_t u, size_t v) { return kids(u) > kids(v); });
                // (list is a structured binding: clang 14 captures it only through an init-capture)
                auto relay = [&, &list = list](size_t x) { return relay_load_[DstGlobal(list[entry[x]].first.rank)]; };
                stable_sort_small(by_load, [&](size_t u, size_t v) { return relay(u) < relay(v); });
                tdom.resize(m), tentry.resize(m);
                for (size_t q = 0; q < m; ++q) tdom[pos[q]] = by_load[q], tentry[pos[q]] = entry[by_load[q]];
                for (size_t x = 0; x < m; ++x) relay_load_[DstGlobal(list[tentry[x]].first.rank)] += kids(x) * sbytes;
                hops.clear();
                entry_hop.assign(m, -1);  // hop index of each domain's entry
                depth.assign(m, 0);
                for (size_t x = 1; x < m; ++x) {
                  size_t up = (x - 1) / kTreeFanout;
                  depth[x] = depth[up] + 1;
                  const FragmentRef& to = list[tentry[x]].first;
                  entry_hop[x] = static_cast<int32_t>(hops.size());
                  hops.push_back({to, DstGlobal(to.rank), entry_hop[up], depth[x]});
                }
                for (size_t x = 0; x < m; ++x) {
                  for (uint32_t q = doms[tdom[x]].begin; q < doms[tdom[x]].end; ++q) {
                    const size_t k = needers[q];
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
        tn = TensorNeeds{};  // routed: its cut is not kept
      }
    }
  };
  route_all(kTreeDomains);
  // Relay trees save the sources' NICs what several domains need from them,
  // at the price of a round's delay and the relaying GPUs' NICs. Where the
  // sources have NIC time to spare even without them - the busiest source
  // would send at most kRelayOnlyAbove of what the busiest destination
  // domain takes in per NIC - every domain takes its stripes from the
  // sources (Kimi-K2, 1024 training GPUs -> 512, and MoE 2.4T come closer
  // to their bound that way; on the other rows the sources' NICs are
  // busier, and dropping relays makes their refits slower).
  if (RelaysSpare(pieces) <= kRelayOnlyAbove) {
    pieces.clear();
    hop_pool_.clear();
    qpieces_.clear();
    assemblies_.clear();
    std::fill(send_load_.begin(), send_load_.end(), 0);
    std::fill(entry_load_.begin(), entry_load_.end(), 0);
    std::fill(relay_load_.begin(), relay_load_.end(), 0);
    route_all(1);
  }
  for (const Assembly& as : assemblies_) ++(as.amax() ? ir_.amax_assemblies : ir_.frame_assemblies);
  Unstage(pieces);
  phase.emplace("route: schedule");
  Schedule(pieces);
  ir_.round_fill.stripe_mib = stripe_mib;
  pieces_ = std::move(pieces);  // for Finish's emit
}

}  // namespace reshard::routing
