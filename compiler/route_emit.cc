// The direct plan's steps and messages (router.h).

#include "compiler/router.h"

#include <algorithm>
#include <map>
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
  // (a comparison sort reading the scattered pieces showed in the perf samples
  // of a large compile); only runs of equal keys are sorted by
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
  // The walk below runs on as many threads as the machine has, each
  // writing the steps, regions and staging sizes of the ranks it owns
  // (every T-th): a rank's steps and regions come in the order of the walk
  // as on one thread, so the plan is the same on any number of threads. Every
  // thread makes every staging allocation (bump pointers, cheap) in its own
  // arenas, since forwards read where their holders staged what they
  // forward. The steps' vectors and regions (fresh memory) are most of a
  // large plan's emit on one thread.
  std::map<size_t, std::vector<uint32_t>> assembled;  // per round: its assemblies
  for (uint32_t k = 0; k < assemblies_.size(); ++k) assembled[assemblies_[k].round].push_back(k);
  // Room for each rank's regions, one per end of each piece and each hop
  // of its tree (quantized pieces' scales and assemblies add a few more,
  // grown as needed): grown by doubling, every copy of a large rank's
  // regions (128 bytes each) would land in fresh pages (page faults).
  std::vector<size_t> ends(n, 0);
  for (const DPiece& p : pieces) {
    ++ends[p.a], ++ends[p.b];
    for (uint32_t k = 0; k < p.hop_count; ++k) ++ends[hop_pool_[p.hop_begin + k].rank];
  }
  const size_t threads = opt_.emit_threads > 0 ? opt_.emit_threads : ThreadsFor(n);
  try {
    OnThreads(threads, [&](size_t t) { EmitWalk(pieces, order, assembled, ends, t, threads); });
  } catch (...) {
    // Which thread's error came first depends on timing: the walk again on
    // one thread throws the first in the walk's order, as it always did.
    // (The programs are half written either way; the compile fails.)
    if (threads > 1) EmitWalk(pieces, order, assembled, ends, 0, 1);
    throw;
  }
}

void Router::EmitWalk(const std::vector<DPiece>& pieces, const std::vector<size_t>& order,
                      const std::map<size_t, std::vector<uint32_t>>& assembled, const std::vector<size_t>& ends,
                      size_t thread, size_t threads) {
  const auto n = static_cast<uint32_t>(ir_.ranks.size());
  auto mine = [thread, threads](uint32_t rank) { return rank % threads == thread; };
  // This thread's staging arenas, per rank, per round: bytes allocated.
  std::vector<std::vector<uint64_t>> arena(n);
  auto alloc = [&](uint32_t rank, size_t round, uint64_t bytes) {
    return AllocIn(arena, rank, round, bytes, mine(rank));
  };
  // Where each assembly lies in its receiver's staging, once emitted: the
  // frame, the grids and (amax path) the need's values.
  constexpr uint64_t kUnset = ~uint64_t{0};
  struct AssemblyAt {
    uint64_t frame = kUnset, area = kUnset, values = kUnset;
  };
  std::vector<AssemblyAt> as_at(assemblies_.size());
  // An assembly's frame and grid area, allocated in its receiver's staging with its first part.
  auto frame = [&](const DPiece& p) {
    const Assembly& as = assemblies_[p.assembly];
    AssemblyAt& x = as_at[p.assembly];
    if (x.frame == kUnset) x.frame = alloc(as.b, as.round, as.frame_bytes);
    return x.frame;
  };
  auto grid_at = [&](const DPiece& p) {
    const Assembly& as = assemblies_[p.assembly];
    AssemblyAt& x = as_at[p.assembly];
    if (x.area == kUnset) x.area = alloc(as.b, as.round, as.grids * as.slot);
    return x.area + static_cast<uint64_t>(p.grid) * as.slot;
  };
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
  // The regions of plain pieces' steps are worked out after the walk: the
  // walk leaves a placeholder where each goes (so that every region keeps
  // its index) and a note of which it is. (Fragment::RegionOf and Coalesced
  // are a large part of the walk.)
  struct RegionJob {
    uint32_t rank, region;  // where it goes
    uint32_t piece;         // whose box
    int32_t of;             // kSrc, kDst, or a hop of the piece's tree (its destination)
  };
  constexpr int32_t kSrc = -2, kDst = -1;
  std::vector<RegionJob> region_jobs;
  {
    size_t jobs = 0;
    for (uint32_t g = 0; g < n; ++g) {
      if (!mine(g)) continue;
      ir_.ranks[g].regions.reserve(ir_.ranks[g].regions.size() + ends[g]);
      jobs += ends[g];
    }
    region_jobs.reserve(jobs);
  }
  auto region = [&](uint32_t rank, size_t piece, int32_t of) {
    RankProgram& prog = ir_.ranks[rank];
    region_jobs.push_back({rank, static_cast<uint32_t>(prog.regions.size()), static_cast<uint32_t>(piece), of});
    return prog.AddRegion(StridedRegion{});
  };
  // The messages' bytes, counted once (by thread 0).
  auto count = [&](uint32_t a, uint32_t b, uint64_t bytes) {
    if (thread == 0) Count(a, b, bytes);
  };
  auto flush = [&] {
    // The round's assemblies are complete once its messages and their unpacks are: quantize each frame.
    if (auto it = assembled.find(batch_round); it != assembled.end()) {
      for (uint32_t k : it->second) {
        const Assembly& as = assemblies_[k];
        if (!mine(as.b)) continue;
        const AssemblyAt& x = as_at[k];
        if (as.amax()) {
          const uint64_t values = as.frame_bytes ? x.frame : x.values;
          quant_.EmitScaledQuantize(as.tensor, as.need, as.grids, x.area, as.slot, values, as.d, ir_.ranks[as.b],
                                    as.round);
        } else {
          quant_.EmitUnpack(as.tensor, quant_.Assembled(as.tensor, as.need), as.d, ir_.ranks[as.b], as.round, x.frame);
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
        const uint64_t og = alloc(to, round, len);
        Step fw, fr;
        fw.kind = StepKind::forward, fr.kind = StepKind::recv;
        fw.channel = fr.channel = ChannelOf(from, to);
        fw.peer = to, fr.peer = from;
        fw.staging = begin, fr.staging = og;
        fw.bytes = fr.bytes = len;
        if (mine(from)) {
          ir_.ranks[from].round(round).comm.push_back(fw);
          send_load_[from] += len;
        }
        if (mine(to)) ir_.ranks[to].round(round).comm.push_back(fr);
        count(from, to, len);
        for (size_t w = u; w < v; ++w) {
          const DPiece& p = pieces[staged[parts[w].s]];
          const uint64_t off = og + (parts[w].off - begin);
          at[at_begin[parts[w].s] + parts[w].h + 1] = off;
          if (!mine(to)) continue;
          RankProgram& G = ir_.ranks[to];
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
  // Staged at both ends: in the pair's one staged message.
  auto in_message = [](const DPiece& x) { return x.staged && x.direct == 0; };
  for (size_t i = 0; i < order.size();) {
    const DPiece& first = pieces[order[i]];
    if (first.round != batch_round) flush(), batch_round = first.round;
    size_t j = i;
    while (j < order.size() && pieces[order[j]].round == first.round && pieces[order[j]].a == first.a &&
           pieces[order[j]].b == first.b)
      ++j;
    RankProgram& A = ir_.ranks[first.a];
    RankProgram& B = ir_.ranks[first.b];
    const bool mine_a = mine(first.a), mine_b = mine(first.b);
    Channel ch = ChannelOf(first.a, first.b);
    if (first.a == first.b) {
      for (size_t k = i; k < j; ++k) {
        const DPiece& p = pieces[order[k]];
        if (p.assembly >= 0) {
          const Assembly& as = assemblies_[p.assembly];
          // (The frame and grids are allocated on every thread, the steps emitted on a's.)
          if (p.grid >= 0) {
            const uint64_t grid = grid_at(p);
            if (mine_a) quant_.EmitAmax(p.tensor, as.cover, p.box, p.s, A, p.round, grid);
          } else {
            const uint64_t f = frame(p);
            if (mine_a) quant_.EmitPartCopy(p.tensor, as.amax() ? as.need : as.cover, p.box, p.s, A, p.round, f);
          }
          continue;
        }
        if (!mine_a) continue;
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
      uint64_t oa = alloc(first.a, first.round, total), ob = alloc(first.b, first.round, total);
      uint64_t pos = 0;
      for (size_t k = i; k < j; ++k) {
        const DPiece& p = pieces[order[k]];
        if (!in_message(p)) continue;
        if (p.grid >= 0) {
          // A partial-amax grid (amax path) travels with the pair's values and is copied into the area.
          const uint64_t grid = grid_at(p);
          if (mine_a) quant_.EmitAmax(p.tensor, assemblies_[p.assembly].cover, p.box, p.s, A, p.round, oa + pos);
          if (mine_b) quant_.EmitGridUnpack(p.bytes, B, p.round, ob + pos, grid);
        } else if (p.assembly >= 0) {
          const Assembly& as = assemblies_[p.assembly];
          if (mine_a) quant_.EmitPack(p.tensor, qpieces_[p.quant], p.s, A, p.round, oa + pos);
          // The need's values as the amax path receives them: a part into the frame, or the one part as is.
          if (as.frame_bytes == 0) {
            as_at[p.assembly].values = ob + pos;
          } else {
            const uint64_t f = frame(p);
            if (mine_b) quant_.EmitPartUnpack(p.tensor, as.amax() ? as.need : as.cover, p.box, B, p.round, ob + pos, f);
          }
        } else if (p.quant >= 0) {
          if (mine_a) quant_.EmitPack(p.tensor, qpieces_[p.quant], p.s, A, p.round, oa + pos);
          if (mine_b) quant_.EmitUnpack(p.tensor, qpieces_[p.quant], p.d, B, p.round, ob + pos);
        } else {
          Dtype w = model_.tensors[p.tensor].dtype;
          if (mine_a) {
            Step pk = StagedStep(StepKind::pack, w, oa + pos, p.bytes);
            pk.src = region(first.a, order[k], kSrc);
            A.round(p.round).local.push_back(pk);
          }
          if (mine_b) {
            Step up = StagedStep(StepKind::unpack, w, ob + pos, p.bytes);
            up.dst = region(first.b, order[k], kDst);
            B.round(p.round).unpack.push_back(up);
          }
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
      if (mine_a) A.round(first.round).comm.push_back(snd);
      if (mine_b) B.round(first.round).comm.push_back(rcv);
      count(first.a, first.b, total);
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
      auto end = [&](Step& s, uint32_t rank, bool through_staging, StepKind kind, int32_t of) {
        const bool own = mine(rank);
        uint32_t& direct = of == kSrc ? s.src : s.dst;
        if (!through_staging) {
          if (own) direct = region(rank, order[k], of);
          return;
        }
        s.staging = alloc(rank, p.round, p.bytes);
        if (!own) return;
        Step x = StagedStep(kind, s.wire, s.staging, p.bytes);
        (of == kSrc ? x.src : x.dst) = region(rank, order[k], of);
        Round& steps = ir_.ranks[rank].round(p.round);
        (of == kSrc ? steps.local : steps.unpack).push_back(x);
      };
      end(snd, first.a, p.direct == kDirectDst, StepKind::pack, kSrc);
      end(rcv, first.b, p.direct == kDirectSrc, StepKind::unpack, kDst);
      if (mine_a) A.round(p.round).comm.push_back(snd);
      if (mine_b) B.round(p.round).comm.push_back(rcv);
      count(p.a, p.b, p.bytes);
      // What a packed for b, sent to its other receivers too (Unstage: hops
      // from the sender), each received straight into its buffer.
      for (uint32_t h = 0; h < p.hop_count; ++h) {
        const Hop& hop = hop_pool_[p.hop_begin + h];
        Step s2 = snd, r2 = rcv;
        s2.peer = hop.rank, r2.peer = first.a;
        s2.channel = r2.channel = ChannelOf(first.a, hop.rank);
        if (mine_a) A.round(p.round).comm.push_back(s2);
        if (mine(hop.rank)) {
          r2.dst = region(hop.rank, order[k], static_cast<int32_t>(h));
          ir_.ranks[hop.rank].round(p.round).comm.push_back(r2);
        }
        count(p.a, hop.rank, p.bytes);
      }
    }
    i = j;
  }
  flush();
  // The regions of this thread's ranks (their lists no longer grow).
  for (const RegionJob& job : region_jobs) {
    const DPiece& p = pieces[job.piece];
    ir_.ranks[job.rank].regions[job.region] =
        job.of == kSrc   ? SrcRegion(p.s, p.box)
        : job.of == kDst ? DstRegion(p.d, p.box)
                         : DstRegion(hop_pool_[p.hop_begin + static_cast<uint32_t>(job.of)].to, p.box);
  }
}

}  // namespace reshard::routing
