// RoundTraffic (round_estimate.h): the rounds replayed as flows.
//
// An event loop over flow starts and ends. After the events of one instant,
// the flows near the links whose flows changed get max-min rates by
// progressive filling: the links with the lowest fair share give their
// flows that share and drop out, until every flow has a rate. A flow's end
// moves only when its rate changed.
#include "compiler/round_estimate.h"

#include "compiler/radix_sort.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

namespace reshard::routing {

namespace {

// Links: 4 per rank, NIC out and in, NVLink out and in.
constexpr uint32_t kLinksPerRank = 4;

struct Flow {
  uint32_t a, b;        // ranks
  uint32_t link[2];     // a's out, b's in
  uint32_t slot[2];     // position in each link's active list
  double left = 0;      // bytes left at time t
  double rate = 0;      // bytes per second since t
  double t = 0;
  uint8_t posted = 0;   // ends that have posted it (2: in flight)
  bool frozen = false;  // rate settled in the current solve
};

// The flows in flight by their end time, earliest first: a binary heap
// that knows where each flow sits, so that a new rate moves its flow
// instead of leaving a stale entry behind.
class Ends {
 public:
  explicit Ends(size_t flows) : at_(flows, kNone) {}
  bool empty() const { return heap_.empty(); }
  double first_time() const { return heap_.front().time; }
  uint32_t first() const { return heap_.front().flow; }
  // Sets (or moves) flow i's end to `time`.
  void Set(uint32_t i, double time) {
    if (at_[i] == kNone) {
      at_[i] = static_cast<uint32_t>(heap_.size());
      heap_.push_back({time, i});
      Up(at_[i]);
      return;
    }
    const uint32_t k = at_[i];
    const double old = heap_[k].time;
    heap_[k].time = time;
    if (time < old) Up(k);
    else Down(k);
  }
  void Remove(uint32_t i) {
    const uint32_t k = at_[i];
    at_[i] = kNone;
    const Entry last = heap_.back();
    heap_.pop_back();
    if (k == heap_.size()) return;
    heap_[k] = last;
    at_[last.flow] = k;
    Up(k);
    Down(at_[last.flow]);
  }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Entry {
    double time;
    uint32_t flow;
  };
  // Earlier first; ties by flow, so that the order is the same on every machine.
  static bool Before(const Entry& x, const Entry& y) {
    return x.time < y.time || (x.time == y.time && x.flow < y.flow);
  }
  void Place(uint32_t k, const Entry& e) {
    heap_[k] = e;
    at_[e.flow] = k;
  }
  void Up(uint32_t k) {
    const Entry e = heap_[k];
    while (k > 0 && Before(e, heap_[(k - 1) / 2])) {
      Place(k, heap_[(k - 1) / 2]);
      k = (k - 1) / 2;
    }
    Place(k, e);
  }
  void Down(uint32_t k) {
    const Entry e = heap_[k];
    const size_t n = heap_.size();
    for (;;) {
      size_t c = 2 * size_t{k} + 1;
      if (c >= n) break;
      if (c + 1 < n && Before(heap_[c + 1], heap_[c])) ++c;
      if (!Before(heap_[c], e)) break;
      Place(k, heap_[c]);
      k = static_cast<uint32_t>(c);
    }
    Place(k, e);
  }
  std::vector<Entry> heap_;
  std::vector<uint32_t> at_;  // per flow, its place in heap_ (kNone: not in flight)
};

class FlowReplay {
 public:
  FlowReplay(uint32_t ranks, double nic_Bps, double nvlink_Bps, uint64_t budget)
      : budget_(budget),
        cap_(ranks * kLinksPerRank),
        on_(ranks * kLinksPerRank),
        link_seen_(ranks * kLinksPerRank, 0),
        depth_(ranks * kLinksPerRank, 0),
        lcap_(ranks * kLinksPerRank),
        lshare_(ranks * kLinksPerRank),
        lcount_(ranks * kLinksPerRank) {
    for (uint32_t l = 0; l < cap_.size(); ++l) cap_[l] = l % kLinksPerRank < 2 ? nic_Bps : nvlink_Bps;
  }

  // Room for `flows` flows (Add without reallocating: copies grown by
  // doubling landed in fresh pages each time).
  void Reserve(size_t flows) {
    flows_.reserve(flows);
    round_.reserve(flows);
  }

  // Flows (bytes from a to b over the NIC or NVLink) in round order; each
  // rank's rounds are the runs of its flows with one round number.
  void Add(uint32_t round, uint32_t a, uint32_t b, double bytes, bool net) {
    Flow f;
    f.a = a, f.b = b;
    f.link[0] = a * kLinksPerRank + (net ? 0 : 2);
    f.link[1] = b * kLinksPerRank + (net ? 1 : 3);
    f.left = bytes;
    flows_.push_back(f);
    round_.push_back(round);
  }

  // The time the last flow ends, or nothing once more than the budget's
  // steps were taken.
  std::optional<double> Run() {
    const uint32_t ranks = static_cast<uint32_t>(cap_.size() / kLinksPerRank);
    // Per rank, its flows in round order (CSR), and where each round starts.
    std::vector<uint32_t> begin(ranks + 1, 0);
    for (const Flow& f : flows_) ++begin[f.a + 1], ++begin[f.b + 1];
    for (uint32_t g = 0; g < ranks; ++g) begin[g + 1] += begin[g];
    mine_.resize(begin[ranks]);
    std::vector<uint32_t> fill(begin.begin(), begin.end() - 1);
    for (uint32_t i = 0; i < flows_.size(); ++i) mine_[fill[flows_[i].a]++] = i, mine_[fill[flows_[i].b]++] = i;
    next_.assign(begin.begin(), begin.end() - 1);
    end_.assign(begin.begin() + 1, begin.end());
    outstanding_.assign(ranks, 0);
    flow_seen_.assign(flows_.size(), 0);
    Ends ends(flows_.size());
    ends_ = &ends;
    for (uint32_t g = 0; g < ranks; ++g) Post(g);
    Solve();
    while (!ends.empty()) {
      if (steps_ > budget_) return std::nullopt;
      const uint32_t i = ends.first();
      now_ = ends.first_time();
      ends.Remove(i);
      Finish(i);
      for (uint32_t g : {flows_[i].a, flows_[i].b})
        if (--outstanding_[g] == 0) Post(g);
      if (ends.empty() || ends.first_time() > now_) Solve();
    }
    ends_ = nullptr;
    if (steps_ > budget_) return std::nullopt;
    return now_;
  }

 private:
  // Rank g posts its next round: each of its flows whose other end has
  // posted it too starts now.
  void Post(uint32_t g) {
    uint32_t& k = next_[g];
    if (k == end_[g]) return;
    const uint32_t round = round_[mine_[k]];
    for (; k < end_[g] && round_[mine_[k]] == round; ++k) {
      const uint32_t i = mine_[k];
      ++outstanding_[g];
      Flow& f = flows_[i];
      if (++f.posted < 2) continue;
      f.t = now_;
      for (int e = 0; e < 2; ++e) {
        f.slot[e] = static_cast<uint32_t>(on_[f.link[e]].size());
        on_[f.link[e]].push_back(i);
      }
      changed_.push_back(f.link[0]);
    }
  }

  void Finish(uint32_t i) {
    const Flow& f = flows_[i];
    for (int e = 0; e < 2; ++e) {
      std::vector<uint32_t>& v = on_[f.link[e]];
      const uint32_t moved = v.back();
      v[f.slot[e]] = moved;
      Flow& m = flows_[moved];
      m.slot[m.link[0] == f.link[e] ? 0 : 1] = f.slot[e];
      v.pop_back();
      changed_.push_back(f.link[e]);
    }
  }

  // New rates for the flows within kSolveDepth links of a changed link;
  // the flows on the outermost links that are not among them keep their
  // rates, taken off those links' capacity.
  void Solve() {
    ++stamp_;
    comp_.clear();
    links_.clear();
    for (uint32_t l : changed_)
      if (link_seen_[l] != stamp_) link_seen_[l] = stamp_, depth_[l] = 0, links_.push_back(l);
    changed_.clear();
    for (size_t q = 0; q < links_.size(); ++q) {
      const uint32_t l = links_[q];
      if (depth_[l] >= kSolveDepth) continue;
      steps_ += on_[l].size();
      for (uint32_t i : on_[l]) {
        if (flow_seen_[i] == stamp_) continue;
        flow_seen_[i] = stamp_;
        comp_.push_back(i);
        for (uint32_t k : flows_[i].link)
          if (link_seen_[k] != stamp_) link_seen_[k] = stamp_, depth_[k] = depth_[l] + 1, links_.push_back(k);
      }
    }
    if (!comp_.empty()) Fill();
  }

  // Max-min rates for comp_ by progressive filling over links_.
  void Fill() {
    for (uint32_t i : comp_) {
      Flow& f = flows_[i];
      f.left = std::max(0.0, f.left - f.rate * (now_ - f.t));
      f.t = now_;
      f.frozen = false;
    }
    open_.clear();
    for (uint32_t l : links_) {
      steps_ += on_[l].size();
      lcap_[l] = cap_[l];
      if (depth_[l] < kSolveDepth) {
        // Solve took every flow of a link it looked past into comp_: nothing
        // to take off its capacity, and every flow counts: no need to walk
        // them (the walk showed in an estimate's instructions).
        lcount_[l] = static_cast<uint32_t>(on_[l].size());
      } else {
        lcount_[l] = 0;
        for (uint32_t i : on_[l]) {
          if (flow_seen_[i] == stamp_) ++lcount_[l];
          else lcap_[l] -= flows_[i].rate;
        }
        lcap_[l] = std::max(lcap_[l], 0.0);
      }
      if (lcount_[l] > 0) open_.push_back(l), lshare_[l] = lcap_[l] / lcount_[l];
    }
    // Each pass gives the flows of the links with the lowest fair share that
    // share; the others' shares rise or stay.
    while (!open_.empty()) {
      double share = std::numeric_limits<double>::infinity();
      for (uint32_t l : open_) share = std::min(share, lshare_[l]);
      share = std::max(share, 1e-12 * cap_[open_.front()]);  // rounding must not stop a flow
      const double level = share * (1 + 1e-12);
      size_t kept = 0;
      for (uint32_t l : open_) {
        if (lcount_[l] > 0 && lshare_[l] <= level) {
          for (uint32_t i : on_[l]) {
            Flow& f = flows_[i];
            if (f.frozen || flow_seen_[i] != stamp_) continue;
            f.frozen = true;
            for (uint32_t k : f.link) {
              lcap_[k] -= share;
              if (--lcount_[k] > 0) lshare_[k] = lcap_[k] / lcount_[k];
            }
            if (f.rate != share) {
              f.rate = share;
              ends_->Set(i, now_ + f.left / share);
            }
          }
        }
        if (lcount_[l] > 0) open_[kept++] = l;
      }
      open_.resize(kept);
    }
  }

  const uint64_t budget_;
  uint64_t steps_ = 0;  // flows looked at by the re-solves
  std::vector<double> cap_;
  std::vector<std::vector<uint32_t>> on_;  // per link, its flows in flight
  std::vector<Flow> flows_;
  std::vector<uint32_t> round_;            // per flow
  std::vector<uint32_t> mine_, next_, end_, outstanding_;
  std::vector<uint32_t> link_seen_, depth_, flow_seen_;  // marks of the current solve
  uint32_t stamp_ = 0;
  std::vector<uint32_t> changed_, comp_, links_;
  std::vector<uint32_t> open_;
  std::vector<double> lcap_, lshare_;
  std::vector<uint32_t> lcount_;
  Ends* ends_ = nullptr;  // Run's
  double now_ = 0;
};

}  // namespace

RoundTraffic::RoundTraffic(uint32_t ranks) : ranks_(ranks), recent_(kRecent, kNoEdge) {}

void RoundTraffic::Add(uint32_t round, uint32_t from, uint32_t to, uint64_t bytes, bool net) {
  if (from == to || bytes == 0) return;
  // A message like one added lately (the fill places a pair's pieces one
  // after another, and their trees alike) joins it: both estimates sum a
  // round's bytes per pair and path anyway.
  uint64_t h = ((uint64_t{round} * 0x9E3779B1u + from) * 0x85EBCA77u + to) * 2 + (net ? 1 : 0);
  h = (h ^ (h >> 29)) * 0xBF58476D1CE4E5B9ull;
  uint32_t& slot = recent_[h >> (64 - kRecentBits)];
  if (slot != kNoEdge) {
    Edge& e = edges_[slot];
    if (e.round == round && e.a == from && e.b == to && e.net == net) {
      e.bytes += bytes;
      return;
    }
  }
  slot = edges_.size() < kNoEdge ? static_cast<uint32_t>(edges_.size()) : kNoEdge;
  edges_.push_back({round, from, to, bytes, net});
}

double RoundTraffic::BusiestNicSeconds(double nic_Bps) const {
  std::vector<uint64_t> out(ranks_, 0), in(ranks_, 0);
  for (const Edge& x : edges_) {
    if (!x.net) continue;
    out[x.a] += x.bytes;
    in[x.b] += x.bytes;
  }
  uint64_t most = 0;
  for (uint32_t g = 0; g < ranks_; ++g) most = std::max({most, out[g], in[g]});
  return static_cast<double>(most) / nic_Bps;
}

double RoundTraffic::ReplaySeconds(double nic_Bps, double nvlink_Bps) const {
  // Per round, per rank: bytes out and in over NICs and over NVLink.
  struct Load {
    uint64_t net_out = 0, net_in = 0, nv_out = 0, nv_in = 0;
  };
  std::vector<std::vector<Load>> loads;  // [round][rank]
  for (const Edge& x : edges_) {
    if (x.round >= loads.size()) loads.resize(x.round + 1, std::vector<Load>(ranks_));
    Load &out = loads[x.round][x.a], &in = loads[x.round][x.b];
    (x.net ? out.net_out : out.nv_out) += x.bytes;
    (x.net ? in.net_in : in.nv_in) += x.bytes;
  }
  auto seconds = [&](const Load& l) {
    return std::max(static_cast<double>(std::max(l.net_out, l.net_in)) / nic_Bps,
                    static_cast<double>(std::max(l.nv_out, l.nv_in)) / nvlink_Bps);
  };
  std::vector<Edge> edges = edges_;
  std::stable_sort(edges.begin(), edges.end(), [](const Edge& x, const Edge& y) { return x.round < y.round; });
  std::vector<double> finish(ranks_, 0), start(ranks_, 0);
  size_t e = 0;
  for (uint32_t r = 0; r < loads.size(); ++r) {
    const size_t first = e;
    start = finish;
    for (; e < edges.size() && edges[e].round == r; ++e) {
      start[edges[e].a] = std::max(start[edges[e].a], finish[edges[e].b]);
      start[edges[e].b] = std::max(start[edges[e].b], finish[edges[e].a]);
    }
    for (size_t k = first; k < e; ++k) {
      for (uint32_t g : {edges[k].a, edges[k].b}) finish[g] = std::max(finish[g], start[g] + seconds(loads[r][g]));
    }
  }
  return finish.empty() ? 0 : *std::max_element(finish.begin(), finish.end());
}

std::optional<double> RoundTraffic::FlowSeconds(double nic_Bps, double nvlink_Bps, uint64_t budget) const {
  // One flow per round, pair and path: the runtime merges a round's messages
  // between two ranks on one channel into one. The messages are ordered by
  // (round, from, to, path) packed into one key (rounds x ranks^2 x 2 fits
  // 64 bits for any plan a compile can hold), radix-sorted (descending, so
  // read from the back): a comparison sort was a large part of the estimate.
  struct Keyed {
    uint64_t key, bytes;
  };
  const uint64_t n = ranks_;
  std::vector<Keyed> keyed, scratch;
  keyed.reserve(edges_.size());
  for (const Edge& e : edges_) keyed.push_back({((e.round * n + e.a) * n + e.b) * 2 + (e.net ? 1 : 0), e.bytes});
  SortByKeyDescending(keyed, scratch);
  FlowReplay replay(ranks_, nic_Bps, nvlink_Bps, budget);
  replay.Reserve(keyed.size());  // at most one flow a message
  for (size_t e = keyed.size(); e > 0;) {
    const uint64_t key = keyed[e - 1].key;
    uint64_t bytes = 0;
    for (; e > 0 && keyed[e - 1].key == key; --e) bytes += keyed[e - 1].bytes;
    const uint64_t pair = key / 2;
    const auto round = static_cast<uint32_t>(pair / n / n);
    replay.Add(round, static_cast<uint32_t>(pair / n % n), static_cast<uint32_t>(pair % n), static_cast<double>(bytes),
               key % 2 == 1);
  }
  return replay.Run();
}

}  // namespace reshard::routing
