// The direct plan's steps and messages (router.h).

#include "compiler/router.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "compiler/on_threads.h"
#include "compiler/radix_sort.h"

namespace reshard::routing {

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
  // By round, rotation (receiver minus sender), sender, staged first, then
  // tree; ties in index order. All but the tree pack into one key, radix-sorted
  // (a comparison sort reading the scattered pieces was 4% of the perf samples
  // of a one-fill DeepSeek-V3 compile); only runs of equal keys are sorted by
  // their trees.
  auto rotation = [n](const DPiece& x) { return (x.b + n - x.a) % n; };
  // Staged at both ends: in the pair's one staged message.
  auto in_message = [](const DPiece& x) { return x.staged && x.direct == 0; };
  uint64_t rounds = 0;
  for (const DPiece& p : pieces) rounds = std::max<uint64_t>(rounds, p.round + 1);
  auto bits = [](uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; };
  const int rank_bits = bits(n), key_bits = bits(rounds) + 2 * rank_bits + 1;
  if (key_bits <= 64) {
    struct Keyed {
      uint64_t key;
      size_t i;
    };
    const uint64_t all = key_bits == 64 ? ~uint64_t{0} : (uint64_t{1} << key_bits) - 1;
    std::vector<Keyed> keyed(pieces.size()), scratch;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const DPiece& x = pieces[i];
      const uint64_t key =
          ((((static_cast<uint64_t>(x.round) << rank_bits) | rotation(x)) << rank_bits | x.a) << 1) | (in_message(x) ? 0 : 1);
      keyed[i] = {all - key, i};  // descending by all - key: ascending by key
    }
    SortByKeyDescending(keyed, scratch);
    for (size_t k = 0; k < keyed.size();) {
      size_t e = k + 1;
      while (e < keyed.size() && keyed[e].key == keyed[k].key) ++e;
      for (size_t j = k; j < e; ++j) order[j] = keyed[j].i;
      if (e - k > 1)
        std::stable_sort(order.begin() + k, order.begin() + e,
                         [&](size_t i, size_t j) { return tree_less(pieces[i], pieces[j]); });
      k = e;
    }
  } else {  // too many ranks and rounds for one key: the same order by comparison
    auto fields = [&](const DPiece& x) { return std::make_tuple(x.round, rotation(x), x.a, !in_message(x)); };
    std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) {
      const auto fx = fields(pieces[i]), fy = fields(pieces[j]);
      return fx != fy ? fx < fy : tree_less(pieces[i], pieces[j]);
    });
  }
  // The staged pieces of one round, with their staging offsets at b and at
  // each hop; their trees are emitted together once the round's messages are
  // out, so a holder forwards, per receiver, every run of pieces that lie
  // contiguous in its staging - whichever messages brought them - as one message.
  std::vector<size_t> staged;
  // Where staged piece s of the round lies: at[at_begin[s]] at b, then at
  // each hop (one array for the round: a vector per piece was an allocation
  // per staged piece).
  std::vector<uint64_t> at;
  std::vector<size_t> at_begin;
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
  // The regions of plain pieces' steps are worked out after the walk, on
  // as many threads as the machine has: the walk leaves a placeholder where
  // each goes (so that every region keeps its index) and a note of which
  // it is. (Fragment::RegionOf and Coalesced were a third of the walk.)
  struct RegionJob {
    uint32_t rank, region;  // where it goes
    uint32_t piece;         // whose box
    int32_t of;             // kSrc, kDst, or a hop of the piece's tree (its destination)
  };
  constexpr int32_t kSrc = -2, kDst = -1;
  std::vector<RegionJob> region_jobs;
  // Room for each rank's regions, one per end of each piece and each hop
  // of its tree (quantized pieces' scales and assemblies add a few more,
  // grown as before): grown by doubling, every copy of a large rank's
  // regions (128 bytes each) landed in fresh pages (DeepSeek-V3: 131.4k ->
  // 126.4k page faults with 4 KiB pages).
  {
    std::vector<size_t> ends(n, 0);
    for (const DPiece& p : pieces) {
      ++ends[p.a], ++ends[p.b];
      for (uint32_t k = 0; k < p.hop_count; ++k) ++ends[hop_pool_[p.hop_begin + k].rank];
    }
    size_t jobs = 0;
    for (uint32_t g = 0; g < n; ++g) ir_.ranks[g].regions.reserve(ir_.ranks[g].regions.size() + ends[g]), jobs += ends[g];
    region_jobs.reserve(jobs);
  }
  auto region = [&](uint32_t rank, size_t piece, int32_t of) {
    RankProgram& prog = ir_.ranks[rank];
    region_jobs.push_back({rank, static_cast<uint32_t>(prog.regions.size()), static_cast<uint32_t>(piece), of});
    return prog.AddRegion(StridedRegion{});
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
          if (hop.level == level)
            parts.push_back({HolderOf(p, hop.parent), hop.rank, at[at_begin[s] + hop.parent + 1], s, h});
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
          at[at_begin[parts[w].s] + parts[w].h + 1] = off;
          if (p.quant >= 0) {
            quant_.EmitUnpack(p.tensor, qpieces_[p.quant], hop_pool_[p.hop_begin + parts[w].h].to, G, round, off);
            continue;
          }
          Step up = StagedStep(StepKind::unpack, model_.tensors[p.tensor].dtype, off, p.bytes);
          up.dst = region(to, staged[parts[w].s], static_cast<int32_t>(parts[w].h));
          G.round(round).unpack.push_back(up);
        }
        u = v;
      }
    }
    staged.clear();
    at.clear();
    at_begin.clear();
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
        s.src = region(first.a, order[k], kSrc);
        s.dst = region(first.a, order[k], kDst);
        A.round(p.round).local.push_back(s);
      }
      i = j;
      continue;
    }
    // Staged pieces: one message, contiguous in both staging areas.
    uint64_t total = 0;
    for (size_t k = i; k < j; ++k)
      if (in_message(pieces[order[k]])) total += AlignUp(pieces[order[k]].bytes);
    if (total > 0) {
      uint64_t oa = Alloc(first.a, first.round, total), ob = Alloc(first.b, first.round, total);
      uint64_t pos = 0;
      for (size_t k = i; k < j; ++k) {
        const DPiece& p = pieces[order[k]];
        if (!in_message(p)) continue;
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
          pk.src = region(first.a, order[k], kSrc);
          A.round(p.round).local.push_back(pk);
          Step up = StagedStep(StepKind::unpack, w, ob + pos, p.bytes);
          up.dst = region(first.b, order[k], kDst);
          B.round(p.round).unpack.push_back(up);
        }
        staged.push_back(order[k]);
        at_begin.push_back(at.size());
        at.push_back(ob + pos);
        at.resize(at.size() + p.hop_count, 0);
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
      if (in_message(p)) continue;
      Step snd, rcv;
      snd.kind = StepKind::send, rcv.kind = StepKind::recv;
      snd.channel = rcv.channel = ch;
      snd.wire = rcv.wire = model_.tensors[p.tensor].dtype;
      snd.peer = p.b, rcv.peer = p.a;
      snd.bytes = rcv.bytes = p.bytes;
      // Each end straight from / into its buffer, or through staging: a
      // pack before the send (kDirectDst), an unpack after the receive (kDirectSrc).
      auto end = [&](Step& s, uint32_t rank, bool through_staging, StepKind kind, int32_t of,
                     std::vector<Step>& steps) {
        uint32_t& direct = of == kSrc ? s.src : s.dst;
        if (!through_staging) {
          direct = region(rank, order[k], of);
          return;
        }
        s.staging = Alloc(rank, p.round, p.bytes);
        Step x = StagedStep(kind, s.wire, s.staging, p.bytes);
        (of == kSrc ? x.src : x.dst) = region(rank, order[k], of);
        steps.push_back(x);
      };
      end(snd, first.a, p.direct == kDirectDst, StepKind::pack, kSrc, A.round(p.round).local);
      end(rcv, first.b, p.direct == kDirectSrc, StepKind::unpack, kDst, B.round(p.round).unpack);
      A.round(p.round).comm.push_back(snd);
      B.round(p.round).comm.push_back(rcv);
      Count(p.a, p.b, p.bytes);
      // What a packed for b, sent to its other receivers too (Unstage: hops
      // from the sender), each received straight into its buffer.
      for (uint32_t h = 0; h < p.hop_count; ++h) {
        const Hop& hop = hop_pool_[p.hop_begin + h];
        Step s2 = snd, r2 = rcv;
        s2.peer = hop.rank, r2.peer = first.a;
        s2.channel = r2.channel = ChannelOf(first.a, hop.rank);
        r2.dst = region(hop.rank, order[k], static_cast<int32_t>(h));
        A.round(p.round).comm.push_back(s2);
        ir_.ranks[hop.rank].round(p.round).comm.push_back(r2);
        Count(p.a, hop.rank, p.bytes);
      }
    }
    i = j;
  }
  flush();
  // The regions: each thread fills every T-th placeholder (the programs'
  // region lists no longer grow).
  const size_t threads = ThreadsFor(region_jobs.size());
  OnThreads(threads, [&](size_t t) {
    for (size_t k = t; k < region_jobs.size(); k += threads) {
      const RegionJob& job = region_jobs[k];
      const DPiece& p = pieces[job.piece];
      ir_.ranks[job.rank].regions[job.region] =
          job.of == kSrc   ? SrcRegion(p.s, p.box)
          : job.of == kDst ? DstRegion(p.d, p.box)
                           : DstRegion(hop_pool_[p.hop_begin + static_cast<uint32_t>(job.of)].to, p.box);
    }
  });
}

}  // namespace reshard::routing
