#include "compiler/round_estimate.h"

#include <algorithm>

namespace reshard::routing {

RoundTraffic::RoundTraffic(uint32_t ranks) : ranks_(ranks) {}

RoundTraffic::Load& RoundTraffic::At(uint32_t round, uint32_t rank) {
  if (round >= loads_.size()) loads_.resize(round + 1, std::vector<Load>(ranks_));
  return loads_[round][rank];
}

void RoundTraffic::Add(uint32_t round, uint32_t from, uint32_t to, uint64_t bytes, bool net) {
  if (from == to) return;
  Load &out = At(round, from), &in = At(round, to);
  (net ? out.net_out : out.nv_out) += bytes;
  (net ? in.net_in : in.nv_in) += bytes;
  edges_.push_back({round, from, to});
}

double RoundTraffic::Seconds(const Load& l, double nic_Bps, double nvlink_Bps) const {
  return std::max(static_cast<double>(std::max(l.net_out, l.net_in)) / nic_Bps,
                  static_cast<double>(std::max(l.nv_out, l.nv_in)) / nvlink_Bps);
}

double RoundTraffic::ReplaySeconds(double nic_Bps, double nvlink_Bps) const {
  std::vector<Edge> edges = edges_;
  std::stable_sort(edges.begin(), edges.end(), [](const Edge& x, const Edge& y) { return x.round < y.round; });
  std::vector<double> finish(ranks_, 0), start(ranks_, 0);
  size_t e = 0;
  for (uint32_t r = 0; r < loads_.size(); ++r) {
    const size_t first = e;
    start = finish;
    for (; e < edges.size() && edges[e].round == r; ++e) {
      start[edges[e].a] = std::max(start[edges[e].a], finish[edges[e].b]);
      start[edges[e].b] = std::max(start[edges[e].b], finish[edges[e].a]);
    }
    for (size_t k = first; k < e; ++k) {
      for (uint32_t g : {edges[k].a, edges[k].b}) {
        finish[g] = std::max(finish[g], start[g] + Seconds(loads_[r][g], nic_Bps, nvlink_Bps));
      }
    }
  }
  return finish.empty() ? 0 : *std::max_element(finish.begin(), finish.end());
}

double RoundTraffic::LockstepSeconds(double nic_Bps, double nvlink_Bps) const {
  double sum = 0;
  for (const std::vector<Load>& round : loads_) {
    double peak = 0;
    for (const Load& l : round) peak = std::max(peak, Seconds(l, nic_Bps, nvlink_Bps));
    sum += peak;
  }
  return sum;
}

}  // namespace reshard::routing
