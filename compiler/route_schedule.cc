// Rounds (router.h): every piece placed in a round under the staging
// budget, each NIC paced at its share of the busiest one. Two ways to fill
// them (FillRounds): greedy, pair by pair, or with every pair first given
// its proportional share of the round; Schedule tries several and keeps the
// fastest by an estimate (round_estimate.h).

#include "compiler/router.h"

#include "compiler/fill_pieces.h"
#include "compiler/on_threads.h"
#include "compiler/phase_times.h"
#include "compiler/radix_sort.h"
#include "compiler/round_estimate.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <condition_variable>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

namespace reshard::routing {

// Splits piece `idx` (queue[head]) so that its first part needs at most
// `avail` bytes: the first part replaces it at the head of the queue, the
// rest follow it. False if no part that small keeps every region in format.
bool Router::SplitFront(FillPieces& pieces, uint32_t idx, uint64_t avail, std::vector<uint32_t>& queue,
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
    bool ok = SrcFits(p.s, x) && DstFits(p.d, x);
    for (uint32_t k = 0; ok && k < p.hop_count; ++k) ok = DstFits(hop_pool_[p.hop_begin + k].to, x);
    // A part's direct end (Unstage) stays one contiguous run.
    if (ok && (p.direct & kDirectSrc)) ok = SrcRegion(p.s, x).contiguous();
    if (ok && (p.direct & kDirectDst)) ok = DstRegion(p.d, x).contiguous();
    for (uint32_t k = 0; ok && (p.direct & kDirectDst) && k < p.hop_count; ++k)
      ok = DstRegion(hop_pool_[p.hop_begin + k].to, x).contiguous();
    if (!ok) return false;
  }
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < parts.size(); ++i) {
    DPiece q = p;
    q.box = parts[i];
    q.bytes = static_cast<uint64_t>(parts[i].volume()) * esize;
    if (i == 0) {
      pieces.Edit(idx) = q;
      ids.push_back(idx);
    } else {
      ids.push_back(pieces.Append(q, pieces.Round(idx)));
    }
  }
  queue.insert(queue.begin() + static_cast<std::ptrdiff_t>(head) + 1, ids.begin() + 1, ids.end());
  return true;
}

namespace {

// Per round, one value per GPU, round after round in one array: the rows
// of the round being filled lie together.
class RoundRows {
 public:
  explicit RoundRows(uint32_t ranks) : n_(ranks) {}
  uint64_t& At(uint32_t rank, size_t round) {
    if (round >= rounds_) Grow(round + 1);
    return v_[round * n_ + rank];
  }
  size_t rounds() const { return rounds_; }

 private:
  void Grow(size_t rounds) {
    rounds_ = rounds;
    if (v_.size() < rounds * n_) v_.resize(std::max(rounds * n_, 2 * v_.size()), 0);
  }
  size_t n_;
  size_t rounds_ = 0;
  std::vector<uint64_t> v_;
};

}  // namespace

// The pieces by rotation (receiver minus sender), then sender, ties in
// index order: the order FillRounds takes them in, the same for every fill.
std::vector<uint32_t> Router::RotationOrder(const std::vector<DPiece>& pieces) const {
  const uint32_t n = static_cast<uint32_t>(ir_.ranks.size());
  std::vector<uint64_t> key(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i)
    key[i] = uint64_t{(pieces[i].b + n - pieces[i].a) % n} << 32 | pieces[i].a;
  std::vector<uint32_t> order(pieces.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t i, uint32_t j) { return key[i] < key[j]; });
  return order;
}

// Places every piece in a round, filling rounds one at a time: each round
// takes pieces pair by pair, the pairs whose sender and receiver together
// have the most bytes still to move first, while every GPU the piece touches - its two ends
// in the round, each holder of its tree in the rounds after - has staging
// budget left, and no NIC carries more than its pace in the round. The pace:
// R rounds are needed at least for the busiest rank's staging, so the
// busiest NIC carries 1/R of its bytes in every round (the share, at most).
// A sender is paced at its own rate too, kPaceSlack times its bytes left
// over the rounds left (recomputed each round, so a sender that fell behind
// catches up), but never below kPaceFloor of the share: a lightly loaded
// sender does not empty itself in the first rounds into receivers whose
// own share is full, where flows sharing NICs slow each other (max-min) and
// the busiest NICs idle later. Senders with at most kUnpacedRounds shares in
// all are not paced. (By `simulate`, pacing each sender brings the large
// rows closer to their bound than one pace for all. Pacing receivers changes
// nothing; without the floor predictions are a little better but plans much
// larger; a fixed own share instead of the bytes left falls behind and needs
// many more rounds.) Rotation order (receiver minus sender) breaks ties,
// so a round is close to a matching of senders to receivers and no NIC is
// converged on by many senders at once. A piece that does not fit whole is
// split to fill the round.
RoundTraffic Router::FillRounds(FillPieces& pieces, const std::vector<uint32_t>& order,
                                const RoundFill& mode) {
  const double fill = mode.staging_fill;
  const uint32_t n = static_cast<uint32_t>(ir_.ranks.size());
  struct Pair {
    uint32_t a, b;
    std::vector<uint32_t> queue;  // pieces, in order
    size_t head = 0;
  };
  std::vector<Pair> pairs;
  std::vector<uint32_t> copies;
  std::vector<uint64_t> rem_out(n, 0), rem_in(n, 0), rem_nv_in(n, 0);
  for (uint32_t i : order) {
    const DPiece& p = pieces[i];
    if (p.assembly >= 0) continue;  // placed by PlaceAssemblies
    if (p.a == p.b) {  // a local copy: given a round once the others are placed
      pieces.SetRound(i, 0);
      copies.push_back(i);
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
    if (ChannelOf(p.a, p.b) != Channel::net) add(rem_nv_in[p.b], p.bytes);
    for (uint32_t k = 0; k < p.hop_count; ++k) {
      const Hop& h = hop_pool_[p.hop_begin + k];
      const uint32_t from = HolderOf(p, h.parent);
      if (ChannelOf(from, h.rank) == Channel::net) add(rem_out[from], p.bytes), add(rem_in[h.rank], p.bytes);
      else add(rem_nv_in[h.rank], p.bytes);
    }
  };
  for (uint32_t i = 0; i < pieces.size(); ++i)
    if (pieces[i].a != pieces[i].b && pieces[i].assembly < 0) account(pieces[i], +1);
  auto need_of = [](const DPiece& p) { return p.staged ? AlignUp(p.bytes) : p.bytes; };
  auto is_net = [&](uint32_t x, uint32_t y) { return ChannelOf(x, y) == Channel::net; };
  std::vector<uint64_t> held(n, 0), net_out(n, 0), net_in(n, 0), nv_out(n, 0), nv_in(n, 0);
  for (const Assembly& as : assemblies_) held[as.b] += AlignUp(as.frame_bytes) + as.grids * as.slot;
  auto carry = [&](uint32_t from, uint32_t to, uint64_t bytes) {
    if (is_net(from, to)) net_out[from] += bytes, net_in[to] += bytes;
    else nv_out[from] += bytes, nv_in[to] += bytes;
  };
  for (uint32_t i = 0; i < pieces.size(); ++i) {
    const DPiece& p = pieces[i];
    if (p.a == p.b) continue;
    held[p.a] += need_of(p);
    held[p.b] += need_of(p);
    carry(p.a, p.b, p.bytes);
    for (uint32_t k = 0; k < p.hop_count; ++k) {
      const Hop& h = hop_pool_[p.hop_begin + k];
      held[h.rank] += need_of(p);
      carry(HolderOf(p, h.parent), h.rank, p.bytes);
    }
  }
  uint64_t rounds = 1, busiest_net = 0, busiest_nv = 0, busiest_in = 0;
  for (uint32_t g = 0; g < n; ++g) {
    rounds = std::max<uint64_t>(rounds, static_cast<uint64_t>(std::ceil(held[g] / (fill * cap_))));
    busiest_net = std::max({busiest_net, net_out[g], net_in[g]});
    busiest_in = std::max(busiest_in, net_in[g]);
    busiest_nv = std::max({busiest_nv, nv_out[g], nv_in[g]});
  }
  const uint64_t net_cap = std::clamp<uint64_t>((busiest_net + rounds - 1) / rounds, kMinSplit, cap_);
  // Where NVLink, not the NICs, sets the refit's pace (GPUs that train and
  // serve on one node, colocated: no NIC traffic at all), NVLink links get a
  // share of each round too: without it a round lasts as long as its
  // busiest NVLink link, far above the average, and the NVLink links idle
  // much of the refit (Qwen3-30B-A3B colocated, TP2 EP8 -> TP8).
  const double nic_Bps = cluster_.nic_gbps * 1e9 / 8, nvlink_Bps = cluster_.nvlink_GBps * 1e9;
  const bool nv_paced = static_cast<double>(busiest_nv) / nvlink_Bps > static_cast<double>(busiest_net) / nic_Bps;
  const uint64_t nv_cap = std::clamp<uint64_t>((busiest_nv + rounds - 1) / rounds, kMinSplit, cap_);
  // Parts split off to fill a round are at least 1/16 of the round's share
  // (smaller ones bought little balance for many more steps), except in the
  // proportional fill of plans of up to kProportionalMaxPieces pieces (its
  // shares uncapped: min_share 0), where they are at least kMinSplit: each
  // pair's share of a round is then met to within a few MiB instead of a
  // sixteenth of the round, and the NICs that bind run fuller rounds
  // (`simulate` puts most small rows where that fill is kept closer to their
  // bound; Qwen3-Next EP a little further). On large plans the same costs
  // compile time and plan size for little, and in the greedy fills it makes
  // DeepSeek-V3 FP8 slower.
  const uint64_t min_split =
      std::max(kMinSplit, static_cast<uint64_t>(mode.split_share * static_cast<double>(net_cap)));
  std::vector<std::vector<uint64_t>> out_used(n), in_used(n);
  PlaceAssemblies(pieces, rounds, out_used, in_used);
  // From here on, what every GPU has committed to a round is kept round by
  // round: the fill reads the rows of the round it fills (and of the next
  // few, for trees) for many pairs, and a row of n values stays in cache
  // where the per-rank vectors (used_, out_used, in_used) scattered them.
  // used_ gets the staging rows back at the end.
  RoundRows staging(n), out_net(n), in_net(n), out_nv(n), in_nv(n);
  for (uint32_t g = 0; g < n; ++g) {
    for (size_t r = 0; r < used_[g].size(); ++r) staging.At(g, r) = used_[g][r];
    for (size_t r = 0; r < out_used[g].size(); ++r) out_net.At(g, r) = out_used[g][r];
    for (size_t r = 0; r < in_used[g].size(); ++r) in_net.At(g, r) = in_used[g][r];
  }
  auto room = [&](uint32_t rank, size_t r) { return cap_ - std::min(cap_, staging.At(rank, r)); };
  // Each sender's pace in the round being filled (receivers: the share).
  std::vector<uint64_t> pace(n, net_cap);
  const uint64_t pace_floor = std::max(min_split, static_cast<uint64_t>(kPaceFloor * static_cast<double>(net_cap)));
  // Each GPU's NVLink intake in the round being filled, where the NICs set
  // the pace (nv_paced: NVLink's own shares instead): kNvPaceSlack times its
  // NVLink bytes left over the rounds left, at least min_split. A GPU that
  // is its domain's entry for stripes (NIC in) and takes its peers' stripes
  // over NVLink has one staging arena for both; unpaced, the NVLink pieces
  // (placed whole, fast) fill it every other round and the NIC takes in
  // next to nothing there (GLM-4.5-Air -> TP2 DP4 EP x4, the busiest NIC;
  // tools/bench/round_gap.py shows a NIC's intake round by round).
  // Only where the NICs' intake binds (the busiest NIC in carries the most):
  // where the sources' NICs bind instead, the receivers have staging to
  // spare, and pacing their NVLink holds back the relays the sources feed
  // (Qwen3-Next-80B-A3B, hf:tp=8 -> vLLM TP2 DP4 EP x2, slower paced).
  const bool nv_intake_paced = !nv_paced && busiest_in == busiest_net;
  std::vector<uint64_t> nv_pace(n, cap_);
  auto repace = [&](size_t r) {
    const double left = static_cast<double>(rounds > r + 1 ? rounds - r : 1);
    for (uint32_t g = 0; g < n; ++g) {
      const auto own = static_cast<uint64_t>(kPaceSlack * static_cast<double>(rem_out[g]) / left);
      pace[g] = net_out[g] <= kUnpacedRounds * net_cap ? net_cap : std::clamp(own, pace_floor, net_cap);
      if (nv_intake_paced)
        nv_pace[g] = std::max(min_split, static_cast<uint64_t>(kNvPaceSlack * static_cast<double>(rem_nv_in[g]) / left));
    }
  };
  // The paced network share left between `from` and `to` in round r (net: whether they talk over a NIC).
  // (It and avail, below, are inlined by force: where the compiler called
  // them, the calls were a large part of a fill's instructions by callgrind;
  // the plan stays the same byte for byte.)
  auto share_left = [&](uint32_t from, uint32_t to, size_t r, bool net) __attribute__((always_inline)) -> uint64_t {
    if (!net) {
      if (!nv_paced) return nv_pace[to] - std::min(nv_pace[to], in_nv.At(to, r));
      return std::min(nv_cap - std::min(nv_cap, out_nv.At(from, r)), nv_cap - std::min(nv_cap, in_nv.At(to, r)));
    }
    return std::min(pace[from] - std::min(pace[from], out_net.At(from, r)),
                    net_cap - std::min(net_cap, in_net.At(to, r)));
  };
  auto net_room = [&](uint32_t from, uint32_t to, size_t r) { return share_left(from, to, r, is_net(from, to)); };
  // The staging a GPU keeps in round r for its NIC intake (mode.nic_reserve),
  // where its NIC takes in at least what its NVLink port does: the pace of
  // its NIC bytes left (set each round), less what its NIC already takes in
  // round r. NVLink pieces (and paced ones only) cannot use it. Without it
  // a GPU whose NIC is nearly the busiest lets its peers' NVLink stripes
  // fill its staging in the early rounds, takes in less than the round's
  // share over its NIC there, and ends rounds after the busiest NIC's last
  // (Kimi-K2 FP8 serving). Where NVLink intake is the larger (DeepSeek-V3
  // FP8 on GB200) keeping staging for the NIC starves the fan-out, so it is
  // not done; small plans (GLM-4.5-Air EP, Qwen3-30B-A3B EP) are slower with
  // it by `simulate` and do not keep it.
  // Which GPUs keep it is fixed by their bytes; how much, each round.
  std::vector<uint64_t> nic_reserve(n, 0);
  std::vector<uint32_t> keepers;
  if (mode.nic_reserve > 0)
    for (uint32_t g = 0; g < n; ++g)
      if (net_in[g] >= nv_in[g]) keepers.push_back(g);
  const bool reserving = !keepers.empty();
  auto nv_room = [&](uint32_t x, size_t r, bool with_net) {
    const uint64_t free = room(x, r);
    if (!with_net || !reserving) return free;
    const uint64_t kept = nic_reserve[x] - std::min(nic_reserve[x], in_net.At(x, r));
    return free - std::min(free, kept);
  };
  // The bytes piece p can take in round r at every GPU it touches: staging
  // (hard) and the paced network share (soft).
  // Stops early, with what it has so far, once that is below `floor`.
  auto avail = [&](const DPiece& p, size_t r, bool with_net, uint64_t floor = 0) __attribute__((always_inline)) {
    uint64_t v = std::min(room(p.a, r), is_net(p.a, p.b) ? room(p.b, r) : nv_room(p.b, r, with_net));
    if (with_net) v = std::min(v, net_room(p.a, p.b, r));
    for (uint32_t k = 0; k < p.hop_count && v >= floor; ++k) {
      const Hop& h = hop_pool_[p.hop_begin + k];
      v = std::min(v, is_net(HolderOf(p, h.parent), h.rank) ? room(h.rank, r + h.level)
                                                            : nv_room(h.rank, r + h.level, with_net));
      if (with_net) v = std::min(v, net_room(HolderOf(p, h.parent), h.rank, r + h.level));
    }
    return v;
  };
  RoundTraffic traffic(n);  // every message placed, for the estimate
  auto link = [&](uint32_t from, uint32_t to, size_t r, uint64_t bytes) {
    const bool net = is_net(from, to);
    if (net) out_net.At(from, r) += bytes, in_net.At(to, r) += bytes;
    else out_nv.At(from, r) += bytes, in_nv.At(to, r) += bytes;
    traffic.Add(static_cast<uint32_t>(r), from, to, bytes, net);
  };
  auto take = [&](uint32_t idx, size_t r) {
    const DPiece& p = pieces[idx];
    const uint64_t need = need_of(p);
    staging.At(p.a, r) += need;
    staging.At(p.b, r) += need;
    link(p.a, p.b, r, p.bytes);
    for (uint32_t k = 0; k < p.hop_count; ++k) {
      const Hop& h = hop_pool_[p.hop_begin + k];
      staging.At(h.rank, r + h.level) += need;
      link(HolderOf(p, h.parent), h.rank, r + h.level, p.bytes);
    }
    pieces.SetRound(idx, r);
  };
  std::vector<uint64_t> pair_left(pairs.size(), 0);  // bytes each pair has still to place
  for (size_t pi = 0; pi < pairs.size(); ++pi)
    for (uint32_t idx : pairs[pi].queue) pair_left[pi] += pieces[idx].bytes;
  // What a round looks at first, one small record per pair: most pairs
  // place nothing in most rounds, and reading their head pieces (scattered
  // in `pieces`) and their queues to find that out was most of a large
  // plan's fill time. The records are the active pairs themselves, in the
  // round's order (sorted with their keys), so that a round reads them one
  // after the other: looked up by pair index they were a cache miss each
  // (33,643 pairs, 190 rounds, three fills on DeepSeek-V3).
  struct Head {
    uint64_t need;  // need_of(its head piece)
    uint32_t a, b;  // the pair
    uint32_t pair;  // its index in `pairs`
    uint32_t relays;  // the deepest level of its tree that goes over a NIC (0: none)
    uint32_t idx;     // the head piece (queue[head])
    bool hops;      // the head piece has a delivery tree
    bool net;       // a and b talk over a NIC
    bool live;      // pieces left
  };
  // The deepest level of p's tree that goes over a NIC (0: none).
  auto relays_of = [&](const DPiece& p) {
    uint32_t deepest = 0;
    for (uint32_t k = 0; k < p.hop_count; ++k) {
      const Hop& hop = hop_pool_[p.hop_begin + k];
      if (is_net(HolderOf(p, hop.parent), hop.rank)) deepest = std::max(deepest, hop.level);
    }
    return deepest;
  };
  auto refresh = [&](Head& h) {
    const Pair& q = pairs[h.pair];
    h.live = q.head < q.queue.size();
    if (h.live) {
      h.idx = q.queue[q.head];
      const DPiece& p = pieces[h.idx];
      h.need = need_of(p), h.hops = p.hop_count > 0, h.relays = relays_of(p);
    }
  };
  // Pairs whose pieces a receiver relays over its NIC to different depths
  // (some not at all): their deepest relay, until the end game below
  // reorders their queue (0: none, or done).
  std::vector<uint32_t> end_game(pairs.size(), 0);
  uint32_t end_game_deepest = 0;  // the deepest of them: no pair's end game starts before its round
  for (size_t pi = 0; pi < pairs.size(); ++pi) {
    const std::vector<uint32_t>& queue = pairs[pi].queue;
    uint32_t least = UINT32_MAX, deepest = 0;
    for (uint32_t idx : queue) {
      const uint32_t l = relays_of(pieces[idx]);
      least = std::min(least, l), deepest = std::max(deepest, l);
    }
    if (deepest > least) end_game[pi] = deepest;
    end_game_deepest = std::max(end_game_deepest, end_game[pi]);
  }
  std::vector<Head> active(pairs.size()), scratch;  // the pairs with pieces left
  // The round's order: both NICs' bytes left, and its relays' rounds, per
  // position in `active`. Sorted apart from the records (each position
  // packed with its key's digits, 8 bytes moved per radix pass instead of
  // 40), which are then gathered in that order once.
  std::vector<uint64_t> keys, packed, packed_scratch;
  std::vector<uint32_t> order_of_round;
  for (uint32_t pi = 0; pi < pairs.size(); ++pi) {
    Head& h = active[pi];
    h.pair = pi, h.a = pairs[pi].a, h.b = pairs[pi].b, h.net = is_net(h.a, h.b);
    refresh(h);
  }
  // True if h's pair surely places nothing in round r, from its ends' rooms
  // alone (place() checks more: every hop's room, the budget). Each way
  // place() can take the head piece needs at least min(need, min_split)
  // bytes of staging at both ends, or both ends idle in the round (a piece
  // alone); paced, a net piece also needs at least min_split of the network
  // share, or to fit it with the overshoot allowed.
  auto surely_blocked = [&](const Head& h, size_t r, bool paced) {
    const uint64_t ua = staging.At(h.a, r), ub = staging.At(h.b, r);
    if (ua == 0 && ub == 0 && !h.hops) return false;  // may go alone
    const uint64_t staging_room = cap_ - std::min(cap_, std::max(ua, ub));
    if (staging_room < std::min(h.need, min_split)) return true;
    if (!paced || (!h.net && !nv_paced)) return false;
    const uint64_t share = share_left(h.a, h.b, r, h.net);
    return share < min_split && h.need > share + net_cap / 64;
  };
  // How the head piece p can go into round r: whole, split to fit `free`
  // bytes, or not at all.
  struct Fit {
    enum How { none, whole, split } how;
    uint64_t free;
  };
  auto fit = [&](const DPiece& p, size_t r, uint64_t budget, bool paced, bool proportional_pass) -> Fit {
    const uint64_t need = need_of(p), slack = net_cap / 64;
    // A piece with a tree (never alone) whose room is below both the
    // smallest split and its need less the overshoot allowed goes nowhere:
    // the rooms of the rest of its tree (up to 31 hops) need not be read.
    const uint64_t floor = p.hop_count > 0 ? std::min(min_split, need > slack ? need - slack : 0) : 0;
    const uint64_t room_now = avail(p, r, paced, floor);  // the whole room where not below floor
    if (room_now < floor) return {Fit::none, 0};
    const uint64_t free = std::min(room_now, budget);
    // A piece larger than the budget (sent straight between buffers) takes a round of its own.
    const bool alone = !proportional_pass && staging.At(p.a, r) == 0 && staging.At(p.b, r) == 0 && p.hop_count == 0;
    // A piece that overshoots the network share by a little goes whole
    // (fewer, larger steps) where staging allows. A quantized piece (cut
    // at block edges only) may overshoot the budget too, not the room.
    const uint64_t limit = p.quant >= 0 ? room_now : free;
    const bool overshoot = need <= limit + slack && need <= avail(p, r, false);
    if (need <= free || alone || overshoot) return {Fit::whole, free};
    // Fill the round: split off the part of the piece that fits, if worth a message.
    return {free < min_split ? Fit::none : Fit::split, free};
  };
  // Places the pieces of h's pair in round r while `budget` (bytes) lasts and
  // fit() lets them; a piece larger than what is left is split to fit.
  auto place = [&](Head& h, size_t r, uint64_t budget, bool paced, bool proportional_pass) -> size_t {
    if (!h.live) return 0;
    const uint32_t pi = h.pair;
    if (surely_blocked(h, r, paced)) {
      // (Checked where asserts are on, as in the sanitizer build that runs the whole test suite.)
      assert(fit(pieces[h.idx], r, budget, paced, proportional_pass).how == Fit::none);
      return 0;
    }
    // The head piece, known from h: a pair it does not fit is left without
    // reading its queue (a cache miss a visit, most visits placing nothing).
    Fit f = budget > 0 ? fit(pieces[h.idx], r, budget, paced, proportional_pass) : Fit{Fit::none, 0};
    if (f.how == Fit::none) return 0;
    Pair& q = pairs[pi];
    assert(q.queue[q.head] == h.idx);
    size_t placed = 0;
    for (bool first = true; budget > 0 && q.head < q.queue.size(); first = false) {
      const uint32_t idx = q.queue[q.head];
      if (!first) f = fit(pieces[idx], r, budget, paced, proportional_pass);
      if (f.how == Fit::none) break;
      if (f.how == Fit::split && !SplitFront(pieces, idx, f.free, q.queue, q.head)) break;
      take(q.queue[q.head], r);
      const DPiece& piece = pieces[q.queue[q.head]];
      account(piece, -1);
      pair_left[pi] -= piece.bytes;
      budget -= std::min(budget, piece.bytes);
      ++q.head;
      ++placed;
    }
    if (placed > 0) refresh(h);
    return placed;
  };
  size_t filled = 1;  // rounds the pairs were placed in
  for (size_t r = 0; !active.empty(); filled = ++r) {
    // Pairs whose two NICs together have the most left go first. (Ordering
    // by the busier of the two let a pair with one busy NIC spend the
    // round's share of an idle-ish partner that a busier pair needed:
    // simulate predicted every seed row slower, the Qwen3-235B per-channel
    // FP8 plan most.)
    // Ties keep their order of the previous round. The keys are set in the
    // records first (a comparator reading the pairs made this sort a large
    // part of a large plan's compile) and radix-sorted: std::stable_sort, or
    // a plain sort on the key and the previous position (the same order),
    // costs several times as much on large plans.
    // A pair whose head piece a receiver relays over its NIC (the tree's
    // level L) goes as if its NICs had L more rounds' shares left: its
    // bytes end L rounds after the round that takes them, and placed with
    // the others they were the refit's tail (Qwen3-30B-A3B -> TP2 DP8 EP:
    // the relays' NICs ran past the busiest one). Where every piece is
    // relayed alike (Scout, GLM-4.5-Air EP, DeepSeek-V3 on DGX H100: all of
    // their pieces) or none is, the levels change nothing and the plan is
    // what the NICs' bytes alone give. Counting NVLink levels too makes about
    // as many rows worse as better, so only NIC levels count.
    // The end game: once the busiest NIC has at most kEndGameRounds more
    // rounds' shares left than a pair's deepest relay, the pair's relayed
    // pieces go first in its queue, deepest first. That key moves only
    // pairs whose head piece is relayed; queued behind their pair's other
    // pieces, relayed ones went in the last rounds, and their relays and
    // the NVLink fan-out after them ran past every other NIC (Qwen3-30B-A3B
    // -> TP2 DP8 EP: a large relay in the last two rounds). Relayed pieces
    // first from round 0 is worse where relays are few (TP2 DP8), as is
    // placing deeper trees first.
    uint64_t crit = 0;
    for (uint32_t g = 0; g < n; ++g) crit = std::max({crit, rem_in[g], rem_out[g]});
    const uint64_t rounds_left = std::max<uint64_t>(1, (crit + net_cap - 1) / net_cap);
    keys.resize(active.size());
    // (end_game read only from the round the deepest relay's end game can start: a cache miss a pair before it.)
    const bool end_games = end_game_deepest > 0 && rounds_left <= end_game_deepest + kEndGameRounds;
    for (uint32_t k = 0; k < active.size(); ++k) {
      Head& h = active[k];
      if (end_games) {
        if (uint32_t& deepest = end_game[h.pair]; deepest > 0 && rounds_left <= deepest + kEndGameRounds) {
          Pair& q = pairs[h.pair];
          std::stable_sort(q.queue.begin() + static_cast<std::ptrdiff_t>(q.head), q.queue.end(),
                           [&](uint32_t x, uint32_t y) { return relays_of(pieces[x]) > relays_of(pieces[y]); });
          deepest = 0;
          refresh(h);
        }
      }
      keys[k] = rem_out[h.a] + rem_in[h.b] + uint64_t{h.relays} * net_cap;
    }
    OrderByKeyDescending(keys, packed, packed_scratch, order_of_round);
    scratch.resize(active.size());
    for (size_t k = 0; k < keys.size(); ++k) scratch[k] = active[order_of_round[k]];
    active.swap(scratch);
    repace(r);
    for (uint32_t g : keepers) {
      const double pace = mode.nic_reserve * static_cast<double>(rem_in[g]) / static_cast<double>(rounds_left);
      nic_reserve[g] = std::min(net_cap, static_cast<uint64_t>(pace));
    }
    size_t placed = 0;
    if (mode.proportional) {
      // Every net pair first gets its share of the round: its bytes left
      // over the rounds the busiest NIC still needs (at least min_split), so
      // that all NICs finish with the busiest one instead of some idling
      // once their partners' shares are spent.
      const uint64_t min_share = std::max(min_split, static_cast<uint64_t>(mode.min_share * static_cast<double>(net_cap)));
      for (Head& h : active) {
        if (!h.net) continue;
        placed += place(h, r, std::max(min_share, pair_left[h.pair] / rounds_left), true, true);
      }
    }
    // Otherwise (or where the shares placed nothing), pair by pair, the
    // round filled up to each NIC's pace. (Filling up after the shares as
    // well makes refits slower by `simulate`: Qwen3-30B-A3B with EP.) A round
    // where the pace lets nothing through (no case known) is filled without
    // it, so that every round places something and the loop ends.
    for (const bool paced : {true, false}) {
      if (placed > 0) break;
      for (Head& h : active) placed += place(h, r, UINT64_MAX, paced, false);
    }
    active.erase(std::remove_if(active.begin(), active.end(), [](const Head& h) { return !h.live; }), active.end());
  }
  // A GPU's local copies (colocated: what it holds in its training
  // buffers and serves from its inference ones) are spread over the rounds,
  // each into the round where that GPU stages least so far. In a round the
  // runtime packs and copies before it posts, so copies all in round 0 would
  // hold back round 0's sends (FSDP2 -> vLLM TP2 x DP4 EP colocated: each
  // GPU's gigabytes of copies ahead of its first message).
  if (!hbm_binds_) {
    RoundRows copied(n);
    for (uint32_t i : copies) {
      const DPiece& p = pieces[i];
      size_t best = 0;
      uint64_t least = UINT64_MAX;
      for (size_t r = 0; r < filled; ++r) {
        const uint64_t load = staging.At(p.a, r) + copied.At(p.a, r);
        if (load < least) least = load, best = r;
      }
      pieces.SetRound(i, best);
      copied.At(p.a, best) += p.bytes;
    }
  } else {
    // Where a GPU's HBM binds (Unstage), its copies fill its HBM's gaps: a
    // round's local work (packs, copies) runs while the previous round's
    // messages fly, so each copy, largest first, goes where the GPU's local
    // work so far least exceeds the previous round's message time. One
    // round more is open to them, after the last message: its copies run
    // beside the last round's messages, which otherwise run after the GPU's
    // last copy. (On FSDP2 -> vLLM TP2 DP4 EP colocated, `simulate` finds the
    // extra round, filling the gaps, and one pack for all of a slice's
    // receivers (Unstage) each bring the refit closer to its bound than the
    // copies where their GPU stages least, as above, and the three together
    // closest.) Where NVLink binds, the extra round makes refits slower
    // (Megatron and FSDP2 -> vLLM TP8), so only here is it open.
    const size_t rounds = filled + 1;
    const double hbm_Bps = cluster_.hbm_GBps * 1e9;
    auto hbm_seconds = [hbm_Bps](uint64_t bytes) { return 2.0 * static_cast<double>(bytes) / hbm_Bps; };  // read + write
    std::vector<double> local(size_t{n} * rounds, 0.0), comm(size_t{n} * rounds, 0.0);  // seconds, [rank][round]
    for (uint32_t i = 0; i < pieces.size(); ++i) {
      const DPiece& p = pieces[i];
      if (p.a != p.b && p.staged && !(p.direct & kDirectSrc))  // packed by its sender
        local[p.a * rounds + pieces.Round(i)] += hbm_seconds(p.bytes);
    }
    for (uint32_t g = 0; g < n; ++g) {
      for (size_t r = 0; r < filled; ++r) {
        comm[g * rounds + r] = std::max(static_cast<double>(std::max(out_nv.At(g, r), in_nv.At(g, r))) / nvlink_Bps,
                                        static_cast<double>(std::max(out_net.At(g, r), in_net.At(g, r))) / nic_Bps);
      }
    }
    // A round's local work has until the round's messages can start: until
    // the previous round's messages end at the GPU and at each partner it
    // exchanges with in the round (they post it only then). Counting the
    // GPU's own alone, a GPU with no messages in a round gets few copies in
    // the next (nothing to hide them behind, it seems), races ahead and
    // idles its HBM until its partners catch up (FSDP2 -> vLLM TP2 DP4 EP
    // colocated).
    std::vector<double> window(size_t{n} * rounds, 0.0);
    auto partner = [&](uint32_t g, uint32_t q, size_t r) {
      if (r == 0 || r >= rounds) return;
      window[g * rounds + r] = std::max(window[g * rounds + r], comm[q * rounds + r - 1]);
      window[q * rounds + r] = std::max(window[q * rounds + r], comm[g * rounds + r - 1]);
    };
    for (uint32_t g = 0; g < n; ++g)
      for (size_t r = 1; r < rounds; ++r) window[g * rounds + r] = comm[g * rounds + r - 1];
    for (uint32_t i = 0; i < pieces.size(); ++i) {
      const DPiece& p = pieces[i];
      if (p.a == p.b || p.assembly >= 0) continue;
      const size_t r = pieces.Round(i);
      partner(p.a, p.b, r);
      for (uint32_t k = 0; k < p.hop_count; ++k) {
        const Hop& h = hop_pool_[p.hop_begin + k];
        partner(HolderOf(p, h.parent), h.rank, r + h.level);
      }
    }
    std::vector<uint32_t> largest = copies;
    std::stable_sort(largest.begin(), largest.end(),
                     [&](uint32_t x, uint32_t y) { return pieces[x].bytes > pieces[y].bytes; });
    for (uint32_t i : largest) {
      const DPiece& p = pieces[i];
      size_t best = 0;
      double least = std::numeric_limits<double>::infinity();
      for (size_t r = 0; r < rounds; ++r) {
        const double gap = local[p.a * rounds + r] - window[p.a * rounds + r];
        if (gap < least) least = gap, best = r;
      }
      pieces.SetRound(i, best);
      local[p.a * rounds + best] += hbm_seconds(p.bytes);
    }
  }
  for (uint32_t g = 0; g < n; ++g) {
    used_[g].resize(staging.rounds());
    for (size_t r = 0; r < staging.rounds(); ++r) used_[g][r] = staging.At(g, r);
  }
  // Assemblies' transfers (PlaceAssemblies) are in out_used/in_used only;
  // they are the same in every fill.
  return traffic;
}

// Fills the rounds in three or more ways and keeps the one whose rounds an
// estimate (round_estimate.h: the rounds replayed as flows sharing links
// max-min fairly, `simulate`'s network model; where that passes its budget
// for any fill, the replay for all) says end soonest; ties keep the earlier
// fill. The fills: greedily, planned for kFill of the staging
// budget; with proportional shares (large plans, of more than
// kProportionalMaxPieces pieces: shares of at least kCoarseShare of a
// round's, since finer ones make plans two to three times larger);
// greedily at kFillHigh; on small plans also with proportional shares
// planned for kFillLow of the staging budget (kept on a few small rows -
// Qwen3-30B-A3B, Qwen3-Next EP, Mixtral - where `simulate` finds it faster;
// every other row keeps its fill); with RouteOptions::search_fills also
// kSearchedFills. Where every NIC has about as much to move as the busiest,
// the greedy fill leaves holes the shares avoid (Qwen3-30B-A3B, DeepSeek-V3
// on GB200 NVL72). Rounds planned for more of the staging bring DeepSeek-V3
// on DGX H100, BF16 and FP8, closer to the bound. Lower fills (0.8, 0.85)
// also help some rows, but the estimate keeps them on Kimi-K2 too, whose
// plan then passes 64 MiB, so only --search-fills tries them.
//
// An estimate that charges each rank its busiest link's bytes per round
// cannot tell the fills apart where `simulate` can. The flow estimate keeps
// the fill `simulate` finds fastest on all but one of the simulate, quant
// and init rows of docs/benchmarks.md (there the two differ by a hair), and
// with --search-fills the fill --simulate-fills keeps on DeepSeek-V3 (DGX
// H100, GB200, FP8) and Kimi-K2, and one nearly as fast on Qwen3-235B.
//
// The fills are independent: each fills a copy of the router (its pieces,
// staging in use and assemblies), as many at once as the machine has
// threads, and the kept one is moved back. The plan does not depend on
// their timing.
std::vector<RoundFill> FillCandidates(size_t pieces, bool search_fills) {
  const bool small = pieces <= kProportionalMaxPieces;
  std::vector<RoundFill> candidates = {{false, kFill, 0, kCoarseSplit}};
  candidates.push_back({true, kFill, small ? 0 : kCoarseShare, small ? 0 : kCoarseSplit});
  candidates.push_back({false, kFillHigh, 0, kCoarseSplit});
  if (small) candidates.push_back({true, kFillLow, 0, 0});
  assert(candidates.size() == kDefaultFills + (small ? 1 : 0));
  if (search_fills) {
    for (const RoundFill& m : kSearchedFills) {
      if (!m.proportional || pieces > kProportionalMaxPieces) candidates.push_back(m);
    }
  }
  // Large plans' fills keep staging for NIC intake (FillRounds: nic_reserve).
  if (!small)
    for (RoundFill& m : candidates) m.nic_reserve = kNicReserve;
  return candidates;
}

void Router::Schedule(std::vector<DPiece>& pieces) {
  // One fill on this router (no copy, no estimate to compare), kept.
  auto fill_once = [this, &pieces](const RoundFill& mode, const std::vector<uint32_t>& order) {
    FillPieces fill(pieces);
    FillRounds(fill, order, mode);
    fill.ApplyTo(pieces);
    ir_.round_fill = mode;
  };
  if (opt_.fill_of) {  // an earlier plan's fill (compile --fill-of): only it
    ir_.fill_candidates = 1;
    fill_once(*opt_.fill_of, RotationOrder(pieces));
    return;
  }
  std::vector<RoundFill> candidates = FillCandidates(pieces.size(), opt_.search_fills);
  ir_.fill_candidates = candidates.size();
  if (opt_.fill_candidate >= 0) {  // one fill, asked for
    const auto c = static_cast<size_t>(opt_.fill_candidate);
    if (c >= candidates.size())
      throw Error("fill " + std::to_string(c) + " does not exist: this plan's rounds can be filled " +
                  std::to_string(candidates.size()) + " ways (0-" + std::to_string(candidates.size() - 1) + ")");
    fill_once(candidates[c], RotationOrder(pieces));
    return;
  }
  // A fill's result: what FillRounds changes in the router and the pieces.
  struct Trial {
    std::optional<FillPieces> fill;  // what the fill made of the pieces
    std::vector<std::vector<uint64_t>> used;
    std::vector<Assembly> assemblies;
    RoundTraffic traffic{0};
    std::optional<double> flow;  // the flow estimate, where within its budget
    size_t candidate = 0;
  };
  const double nic = cluster_.nic_gbps * 1e9 / 8, nvlink = cluster_.nvlink_GBps * 1e9;
  const uint64_t budget = opt_.flow_budget > 0 ? opt_.flow_budget : kFlowBudget;
  const size_t n = candidates.size();
  // Each fill copies the router (which nothing changes until the last fill
  // ends), fills the copy and keeps only what the fill changed: the copies
  // and their destruction (a noticeable part of a large compile's CPU time,
  // by perf, on the main thread) run beside each other too.
  const std::vector<DPiece>& input = pieces;
  const std::vector<uint32_t> order = RotationOrder(pieces);
  // The fills read of the programs only where each rank's inference
  // buffers start (DstRegion): the programs (buffers, fragments, names)
  // wait here while the fills copy the router, and come back after.
  std::vector<RankProgram> programs = std::move(ir_.ranks);
  ir_.ranks.assign(programs.size(), RankProgram{});
  for (size_t g = 0; g < programs.size(); ++g) ir_.ranks[g].dst_buffer_base = programs[g].dst_buffer_base;
  // Nor do they read the quantized pieces' boxes (the emit does): those wait
  // too (a large FP8 plan's are hundreds of MiB to copy).
  std::vector<QuantPiece> qpieces = std::move(qpieces_);
  qpieces_.clear();
  std::vector<Trial> trials(n);
  auto fill_job = [this, &input, &order, &candidates, &trials](size_t c) {
    Trial& t = trials[c];
    t.fill.emplace(input);
    t.candidate = c;
    static constexpr const char* kFillPhase[] = {"fill 0", "fill 1", "fill 2", "fill 3+"};
    std::unique_ptr<Router> router;
    {
      Phase phase("router copy");
      router = std::make_unique<Router>(*this);
    }
    Phase phase(kFillPhase[std::min<size_t>(c, 3)]);
    t.traffic = router->FillRounds(*t.fill, order, candidates[c]);
    t.used = std::move(router->used_);
    t.assemblies = std::move(router->assemblies_);
  };
  auto estimate_job = [&trials, nic, nvlink, budget](size_t c) {
    static constexpr const char* kEstimatePhase[] = {"flow estimate 0", "flow estimate 1", "flow estimate 2",
                                                     "flow estimate 3+"};
    Phase phase(kEstimatePhase[std::min<size_t>(c, 3)]);
    trials[c].flow = trials[c].traffic.FlowSeconds(nic, nvlink, budget);
  };
  // The fills and their estimates as jobs for the machine's threads (at
  // least one), each taking the next fill while any is left, then the
  // estimates of the fills done, the longest first: the proportional fills
  // (splitting more, the slowest) and theirs. With a thread per job it is
  // every fill at once, each followed by its estimate. On 2 cores the three
  // default fills all at once share them until the slowest's estimate runs
  // alone; in waves of two, the third would run alone with a core idle.
  std::vector<size_t> fill_order(n);
  std::iota(fill_order.begin(), fill_order.end(), 0);
  std::stable_partition(fill_order.begin(), fill_order.end(), [&](size_t c) { return candidates[c].proportional; });
  std::vector<size_t> position(n);  // per candidate, its place in fill_order
  for (size_t k = 0; k < n; ++k) position[fill_order[k]] = k;
  std::mutex mu;
  std::condition_variable ready;
  size_t next_fill = 0, estimates_taken = 0;
  std::vector<size_t> estimates;  // fills done whose estimates wait (taken in the order of fill_order)
  bool failed = false;
  const size_t workers = std::min(n, std::max<size_t>(1, std::thread::hardware_concurrency()));
  OnThreads(workers, [&](size_t) {
    for (;;) {
      size_t c = 0;
      bool fill = false;
      {
        std::unique_lock<std::mutex> lock(mu);
        ready.wait(lock, [&] { return failed || next_fill < n || !estimates.empty() || estimates_taken == n; });
        if (failed || (next_fill == n && estimates.empty())) return;
        if (next_fill < n) {
          c = fill_order[next_fill++], fill = true;
        } else {
          // The longest first: the earliest in fill_order.
          auto first = std::min_element(estimates.begin(), estimates.end(),
                                        [&](size_t x, size_t y) { return position[x] < position[y]; });
          c = *first;
          estimates.erase(first);
          ++estimates_taken;
        }
      }
      try {
        if (fill) fill_job(c);
        else estimate_job(c);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        failed = true;
        ready.notify_all();
        throw;
      }
      std::lock_guard<std::mutex> lock(mu);
      if (fill) estimates.push_back(c);
      ready.notify_all();
    }
  });
  // The fastest by the flow estimate is kept (ties: the earlier); the
  // others' pieces go, their messages stay for the replay.
  Trial best;
  bool flows = true;
  std::vector<RoundTraffic> traffic;
  for (Trial& t : trials) {
    flows = flows && t.flow.has_value();
    traffic.push_back(std::move(t.traffic));
    if (flows && (t.candidate == 0 || *t.flow < *best.flow)) best = std::move(t);
  }
  ir_.ranks = std::move(programs);
  qpieces_ = std::move(qpieces);
  if (!flows) {
    // A fill passed the flow budget: all are compared by the replay, and the
    // one kept is filled again here (a fill is deterministic).
    std::vector<double> seconds;
    for (const RoundTraffic& t : traffic) seconds.push_back(t.ReplaySeconds(nic, nvlink));
    fill_once(candidates[std::min_element(seconds.begin(), seconds.end()) - seconds.begin()], order);
    return;
  }
  ir_.flow_seconds = *best.flow;
  ir_.busiest_nic_seconds = traffic[best.candidate].BusiestNicSeconds(nic);
  best.fill->ApplyTo(pieces);  // (the fills are over: nothing reads `input` any more)
  used_ = std::move(best.used);
  assemblies_ = std::move(best.assemblies);
  ir_.round_fill = candidates[best.candidate];
}

}  // namespace reshard::routing

namespace reshard {

size_t FewestFillCandidates() { return routing::FillCandidates(0, true).size(); }

}  // namespace reshard
