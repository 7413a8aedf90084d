#include "sim/bound.h"

#include <algorithm>
#include <array>

#include "compiler/box.h"
#include "runtime/error.h"
#include "sim/workload.h"

namespace reshard::sim {

const char* LowerBound::binding() const {
  if (local_s > ingress_s && local_s > egress_s && local_s > nvlink_s) return "a GPU's local copy of what it holds";
  if (ingress_s >= egress_s && ingress_s >= nvlink_s) return "destination NVLink domain ingress over NICs";
  if (egress_s >= nvlink_s) return "source egress over NICs";
  return nvlink_only ? "per-GPU ingress over NVLink" : "per-GPU ingress over NIC and NVLink";
}

namespace {

constexpr int kDims = 6;

// A fragment of a rank: its logical box (compiler/box.h) and where it sits.
struct Piece {
  uint32_t domain, rank;
  Box box;
  uint32_t buffer = 0;   // where it sits: a held and a needed piece at one place are one memory
  uint64_t offset = 0;
};

// The sources and needs of one tensor on a grid of cells cut at every box edge:
// each cell is held or needed whole by any rank, so per-cell domain sets give
// exact unions.
class Grid {
 public:
  explicit Grid(const std::vector<Piece>& all) {
    ndim_ = all.empty() ? 0 : all[0].box.ndim;
    for (int d = 0; d < ndim_; ++d) {
      for (const Piece& p : all) cuts_[d].push_back(p.box.lo[d]), cuts_[d].push_back(p.box.hi[d]);
      std::sort(cuts_[d].begin(), cuts_[d].end());
      cuts_[d].erase(std::unique(cuts_[d].begin(), cuts_[d].end()), cuts_[d].end());
    }
    cells_ = 1;
    for (int d = ndim_ - 1; d >= 0; --d) {
      stride_[d] = cells_;
      cells_ *= cuts_[d].size() - 1;
    }
    if (cells_ > (64ull << 20)) throw Error("lower bound: a tensor cut into more than 64M cells");
  }
  uint64_t cells() const { return cells_; }
  uint64_t volume(uint64_t cell) const {
    uint64_t v = 1;
    for (int d = 0; d < ndim_; ++d) {
      const uint64_t i = (cell / stride_[d]) % (cuts_[d].size() - 1);
      v *= cuts_[d][i + 1] - cuts_[d][i];
    }
    return v;
  }
  // Calls f(cell) for every cell of p.
  template <class F>
  void ForEach(const Piece& p, F&& f) const {
    std::array<uint64_t, kDims> b{}, e{};
    for (int d = 0; d < ndim_; ++d) {
      b[d] = std::lower_bound(cuts_[d].begin(), cuts_[d].end(), p.box.lo[d]) - cuts_[d].begin();
      e[d] = std::lower_bound(cuts_[d].begin(), cuts_[d].end(), p.box.hi[d]) - cuts_[d].begin();
      if (e[d] <= b[d]) return;
    }
    Walk(0, 0, b, e, f);
  }

 private:
  template <class F>
  void Walk(int d, uint64_t base, const std::array<uint64_t, kDims>& b, const std::array<uint64_t, kDims>& e,
            F& f) const {
    if (d == ndim_ || d >= kDims) return f(base);  // ndim_ <= kDims; the second test tells gcc (-Warray-bounds)
    for (uint64_t i = b[d]; i < e[d]; ++i) Walk(d + 1, base + i * stride_[d], b, e, f);
  }
  int ndim_ = 0;
  std::array<std::vector<int64_t>, kDims> cuts_;
  std::array<uint64_t, kDims> stride_{};
  uint64_t cells_ = 1;
};

// Adds d to a sorted small set.
void Insert(std::vector<uint32_t>& set, uint32_t d) {
  auto it = std::lower_bound(set.begin(), set.end(), d);
  if (it == set.end() || *it != d) set.insert(it, d);
}

}  // namespace

LowerBound ComputeLowerBound(const Plan& plan, const ClusterSpec& cluster) {
  const fb::Plan& root = plan.root();
  const LinkModel m = LinkModel::Of(cluster);
  const uint32_t n = plan.num_ranks();
  const uint32_t gpd = static_cast<uint32_t>(std::max<int64_t>(1, cluster.gpus_per_domain));
  const uint32_t ndomains = n ? (n - 1) / gpd + 1 : 0;
  // GPUs of the job per domain (a domain's idle GPUs carry nothing of it).
  std::vector<uint32_t> in_domain(ndomains, 0);
  for (uint32_t g = 0; g < n; ++g) {
    const fb::Program& prog = plan.program(g);
    if (prog.src_rank() >= 0 || prog.dst_rank() >= 0 || (prog.fragments() && prog.fragments()->size())) ++in_domain[g / gpd];
  }
  auto gpus_in = [&](uint32_t d) { return in_domain[d]; };
  const auto* tensors = root.tensors();
  const uint32_t ntensors = tensors ? tensors->size() : 0;

  // Every fragment by tensor and role.
  std::vector<std::vector<Piece>> held(ntensors), needed(ntensors);
  std::vector<size_t> need_size(ntensors);
  for (uint32_t t = 0; t < ntensors; ++t) need_size[t] = DtypeSize(tensors->Get(t)->dtype());
  for (uint32_t g = 0; g < n; ++g) {
    const fb::Program& prog = plan.program(g);
    if (!prog.fragments()) continue;
    for (const fb::Fragment* f : *prog.fragments()) {
      if (f->tensor() >= ntensors) continue;  // program(g) has checked it; defensive
      std::vector<int64_t> lo(f->lo()->begin(), f->lo()->begin() + std::min<int>(f->ndim(), kDims));
      std::vector<int64_t> hi(f->hi()->begin(), f->hi()->begin() + std::min<int>(f->ndim(), kDims));
      Piece p{g / gpd, g, Box::FromVectors(lo, hi), f->buffer(), f->offset()};
      (f->role() == 0 ? held : needed)[f->tensor()].push_back(p);
      // What a destination stores is the least that must reach it: FP8 weights
      // need one byte per element (their scales are tensors of their own).
      if (f->role() == 1 && prog.buffers() && f->buffer() < prog.buffers()->size())
        need_size[f->tensor()] = std::min(need_size[f->tensor()], DtypeSize(prog.buffers()->Get(f->buffer())->dtype()));
    }
  }

  std::vector<uint64_t> in(ndomains, 0), only(ndomains, 0), gpu_need(n, 0), gpu_own(n, 0);
  std::vector<bool> source_domain(ndomains, false);
  uint64_t egress = 0;
  for (uint32_t t = 0; t < ntensors; ++t) {
    if (needed[t].empty()) continue;
    const uint64_t esize = need_size[t];
    std::vector<Piece> all = held[t];
    all.insert(all.end(), needed[t].begin(), needed[t].end());
    Grid grid(all);
    std::vector<std::vector<uint32_t>> holders(grid.cells()), needers(grid.cells());
    for (const Piece& p : held[t]) {
      source_domain[p.domain] = true;
      grid.ForEach(p, [&](uint64_t c) { Insert(holders[c], p.domain); });
    }
    for (const Piece& p : needed[t]) grid.ForEach(p, [&](uint64_t c) { Insert(needers[c], p.domain); });
    for (uint64_t c = 0; c < grid.cells(); ++c) {
      if (needers[c].empty()) continue;
      const uint64_t bytes = grid.volume(c) * esize;
      bool elsewhere = false;
      for (uint32_t d : needers[c]) {
        if (!std::binary_search(holders[c].begin(), holders[c].end(), d)) in[d] += bytes, elsewhere = true;
      }
      if (elsewhere) {
        egress += bytes;
        if (holders[c].size() == 1) only[holders[c][0]] += bytes;
      }
    }
    // What each GPU needs and does not hold itself (a rank's own pieces of a
    // tensor never overlap each other).
    for (const Piece& p : needed[t]) {
      uint64_t v = p.box.volume(), same = 0;
      for (const Piece& h : held[t]) {
        if (h.rank != p.rank) continue;
        const uint64_t both = p.box.intersect(h.box).volume();
        v -= std::min<uint64_t>(v, both);
        if (h.buffer == p.buffer && h.offset == p.offset) same += both;  // the very memory: nothing to copy
      }
      gpu_need[p.rank] += v * esize;
      // Colocated: what it holds in other memory is copied through its own HBM.
      const uint64_t held_here = p.box.volume() - v;
      gpu_own[p.rank] += (held_here - std::min(same, held_here)) * esize;
    }
  }

  LowerBound lb;
  uint32_t source_gpus = 0;
  // (c) counts a GPU's NIC beside its NVLink port only where the job has GPUs
  // in another domain: between two GPUs of one domain every path is NVLink
  // (sim/workload.cc picks the path by domain, as NCCL does), so in a job on
  // one domain (colocated on one node) the NIC carries nothing.
  const auto job_domains = std::count_if(in_domain.begin(), in_domain.end(), [](uint32_t k) { return k > 0; });
  lb.nvlink_only = job_domains <= 1;
  const double gpu_in_Bps = lb.nvlink_only ? m.nvlink_Bps : m.nic_Bps + m.nvlink_Bps;
  for (uint32_t d = 0; d < ndomains; ++d) {
    if (!gpus_in(d)) continue;
    const double nics = gpus_in(d) * m.nic_Bps;
    if (source_domain[d]) source_gpus += gpus_in(d);
    const double a = in[d] / nics;
    if (a > lb.ingress_s) lb.ingress_s = a, lb.ingress_domain = d, lb.ingress_bytes = in[d];
    lb.egress_s = std::max(lb.egress_s, only[d] / nics);
    uint64_t dom_need = 0;
    for (uint32_t g = d * gpd; g < std::min(n, (d + 1) * gpd); ++g) {
      dom_need += gpu_need[g];
      lb.nvlink_s = std::max(lb.nvlink_s, gpu_need[g] / gpu_in_Bps);
    }
    lb.needed_bytes += dom_need;
    lb.nvlink_s = std::max(lb.nvlink_s, dom_need / (gpus_in(d) * gpu_in_Bps));
  }
  for (uint32_t g = 0; g < n; ++g) {
    const double secs = m.hbm_Bps > 0 ? 2.0 * static_cast<double>(gpu_own[g]) / m.hbm_Bps : 0;  // read, write
    if (secs > lb.local_s) lb.local_s = secs, lb.local_rank = g, lb.local_bytes = gpu_own[g];
  }
  lb.egress_bytes = egress;
  if (source_gpus) lb.egress_s = std::max(lb.egress_s, egress / (source_gpus * m.nic_Bps));
  bool net = false;
  for (uint64_t b : in) net |= b > 0;
  lb.latency_s = net ? m.nic_latency_s : (lb.needed_bytes ? m.nvlink_latency_s : 0);
  // A message takes a latency at least; a GPU's local copy needs none, and
  // runs while messages fly (else a refit of local copies and a few small
  // messages would be predicted under its bound, by up to one latency).
  lb.seconds = std::max(std::max({lb.ingress_s, lb.egress_s, lb.nvlink_s}) + lb.latency_s, lb.local_s);
  return lb;
}

}  // namespace reshard::sim
