// Passes 3 and 4: routing and scheduling.
//
// Both strategies work on the same picture of a tensor: the training side's
// fragments cut the tensor into disjoint *source cells* (a grid made of every
// source box's edges), each held by one or more replica ranks. Destination
// needs are intersected with the cells; every intersection is a piece that one
// replica sends. `direct` sends pieces straight to the destination; `gather`
// first gathers each chunk of a tensor on one owner rank and then passes the
// whole chunk down a chain of every destination that needs any of it.
//
// Staging: each rank's staging area is two arenas of staging/2 bytes. What a
// rank allocates in round r lives in arena r%2 and stays valid through round
// r+1 (so data received in round r can be forwarded in round r+1).
//
// The passes live in route_*.cc, members of Router (router.h); this file
// places global ranks, sets up every rank's program, and runs them.
#include "compiler/router.h"

#include "compiler/on_threads.h"
#include "compiler/phase_times.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <string>

namespace reshard {
namespace routing {


// A pack or unpack step of `bytes` at byte `staging` of the rank's staging.
Step StagedStep(StepKind kind, Dtype wire, uint64_t staging, uint64_t bytes) {
  Step s;
  s.kind = kind;
  s.wire = wire;
  s.staging = staging;
  s.bytes = bytes;
  return s;
}

// Row-major region of `sub` inside a staging block holding `whole` (row-major)
// at element offset `base`.
StridedRegion StagingRegion(const Box& whole, const Box& sub, uint64_t base) {
  return RowMajorRegion(whole, sub, base, kStaging);
}

// Splits `b` into unit slices along its outermost dim of extent > 1.
std::vector<Box> SliceOuter(const Box& b) {
  std::vector<Box> out;
  for (int d = 0; d < b.ndim; ++d) {
    if (b.extent(d) > 1) {
      for (int64_t i = b.lo[d]; i < b.hi[d]; ++i) {
        Box x = b;
        x.lo[d] = i;
        x.hi[d] = i + 1;
        out.push_back(x);
      }
      return out;
    }
  }
  out.push_back(b);
  return out;
}

void Router::Plan() {
  ir_.strategy = opt_.strategy;
  ir_.staging_limit = opt_.staging_bytes;
  cap_ = opt_.staging_bytes / 2 / kAlign * kAlign;
  if (cap_ < (1u << 20)) throw Error("--staging-mb: the staging budget must be at least 2 MiB per rank");
  uint32_t ns = static_cast<uint32_t>(src_layout_.ranks), nd = static_cast<uint32_t>(dst_layout_.ranks);
  uint32_t total;
  if (cluster_.colocated) {
    if (nd > ns)
      throw Error(cluster_.file + ": /placement: colocated placement needs at least as many training ranks (" +
                  std::to_string(ns) + ") as inference ranks (" + std::to_string(nd) + ")");
    total = ns;
    for (uint32_t i = 0; i < ns; ++i) ir_.src_global.push_back(i);
    for (uint32_t j = 0; j < nd; ++j) ir_.dst_global.push_back(j);
  } else {
    // Training ranks fill domains from global rank 0 (train_per_domain GPUs
    // of each); inference ranks follow.
    const uint64_t gpd = static_cast<uint64_t>(cluster_.gpus_per_domain);
    const uint64_t tpd = cluster_.train_per_domain ? cluster_.train_per_domain : gpd;
    const uint64_t ipd = cluster_.infer_per_domain ? cluster_.infer_per_domain : gpd;
    for (uint32_t i = 0; i < ns; ++i) ir_.src_global.push_back(static_cast<uint32_t>(i / tpd * gpd + i % tpd));
    // With a per-domain count for either side the two sides use disjoint
    // domains: inference starts on the next fresh one.
    const bool fresh = cluster_.train_per_domain || cluster_.infer_per_domain;
    const uint64_t base = !ns ? 0 : fresh ? (ir_.src_global.back() / gpd + 1) * gpd : ir_.src_global.back() + 1;
    for (uint32_t j = 0; j < nd; ++j) ir_.dst_global.push_back(static_cast<uint32_t>(base + j / ipd * gpd + j % ipd));
    const uint64_t last = nd ? ir_.dst_global.back() : (ns ? ir_.src_global.back() : 0);
    if (last >= (uint64_t{1} << 31)) throw Error(cluster_.file + ": more than 2^31 global ranks");
    total = static_cast<uint32_t>(last + 1);
  }
  std::optional<Phase> phase(std::in_place, "route: rank programs");
  ir_.ranks.resize(total);
  for (uint32_t g = 0; g < total; ++g) ir_.domain.push_back(static_cast<uint32_t>(g / cluster_.gpus_per_domain));
  // Every GPU's program starts with its buffers and fragments: its training
  // rank's, then its inference rank's. The GPUs are independent: on the
  // machine's threads (copying every rank's layout is a noticeable serial
  // cost on one thread).
  std::vector<int> src_of(total, -1), dst_of(total, -1);
  for (uint32_t i = 0; i < ns; ++i) src_of[ir_.src_global[i]] = static_cast<int>(i);
  for (uint32_t j = 0; j < nd; ++j) dst_of[ir_.dst_global[j]] = static_cast<int>(j);
  std::atomic<uint32_t> next{0};
  OnThreads(ThreadsFor(total / 64), [&](size_t) {
    for (uint32_t g; (g = next.fetch_add(1)) < total;) {
      RankProgram& p = ir_.ranks[g];
      if (const int i = src_of[g]; i >= 0) {
        p.src_rank = i;
        p.buffers = src_.ranks[i].buffers;
        p.fragments = src_.ranks[i].fragments;
        p.roles.assign(p.fragments.size(), 0);
      }
      const int j = dst_of[g];
      if (j < 0) continue;
      p.dst_rank = j;
      p.dst_buffer_base = static_cast<uint32_t>(p.buffers.size());
      // Colocated: a name both sides' frameworks use on this GPU (HF names on
      // an FSDP2 trainer and in vLLM) becomes "train:NAME" and "infer:NAME" in
      // the plan; a side binds its module with side= (Python) or the prefixed
      // names. Other names stay as the frameworks write them.
      std::unordered_map<std::string, size_t> names;
      for (size_t k = 0; k < p.buffers.size(); ++k) names.emplace(p.buffers[k].name, k);
      for (const auto& b : dst_.ranks[j].buffers) {
        p.buffers.push_back(b);
        if (auto it = names.find(b.name); it != names.end()) {
          p.buffers[it->second].name = "train:" + b.name;
          p.buffers.back().name = "infer:" + b.name;
        }
      }
      for (Fragment f : dst_.ranks[j].fragments) {
        f.buffer += p.dst_buffer_base;
        p.fragments.push_back(f);
        p.roles.push_back(1);
      }
    }
  });
  send_load_.assign(total, 0);
  entry_load_.assign(total, 0);
  relay_load_.assign(total, 0);
  odd_base_.assign(total, cap_);
  used_.assign(total, {});
  arena_.assign(total, {});
  phase.reset();
  if (opt_.strategy == "direct") Direct();
  else if (opt_.strategy == "gather") Gather();
  else throw Error("--strategy: unknown strategy '" + opt_.strategy + "', expected 'direct' or 'gather'");
}

PlanIR Router::Finish() {
  if (opt_.strategy == "direct") {
    Phase phase("route: emit");
    // The odd rounds' arena starts where the even rounds' largest need ends
    // (not at half the budget): a small plan stages only what it moves.
    for (uint32_t g = 0; g < ir_.ranks.size(); ++g) {
      uint64_t even = 0;
      for (size_t r = 0; r < used_[g].size(); r += 2) even = std::max(even, used_[g][r]);
      odd_base_[g] = std::min(cap_, AlignUp(even));
    }
    EmitDirect(pieces_);
    pieces_ = {};
  }
  for (auto& p : ir_.ranks) ir_.num_rounds = std::max(ir_.num_rounds, p.rounds.size());
  for (auto& p : ir_.ranks) p.rounds.resize(ir_.num_rounds);
  return std::move(ir_);
}

}  // namespace routing

PlanIR Route(const ModelSpec& model, const ClusterSpec& cluster, const LayoutSpec& src_layout, const Expansion& src,
             const LayoutSpec& dst_layout, const Expansion& dst, const RouteOptions& opt) {
  auto kept = std::make_unique<routing::Router>(model, cluster, src_layout, src, dst_layout, dst, opt);
  kept->Plan();
  // Where the kept fill's flow estimate is above kRestripeAbove times its
  // busiest NIC's bytes, route again finer: 16 MiB stripes, so that rounds
  // wait less on the NVLink fan-out of large ones (DeepSeek-V3 FP8 TP16 on
  // GB200 NVL72, by simulate), and quantized tensors' pieces of 1/16 of an
  // arena, which the fill can pack into rounds (Qwen3-235B FP8 -> TP4 x32;
  // kQuantPiecesPerArena, program.h). The faster by the flow estimate is kept,
  // and only it emitted (the other is freed first). Plans below the gate
  // are routed once. A recompile with --fill-of takes the earlier plan's
  // routing (its stripes); a fill_candidate (compile --simulate-fills) the
  // one it is given.
  if (opt.strategy == "direct" && !opt.fill_of && opt.fill_candidate < 0 && kept->FlowSeconds() > 0 &&
      kept->FlowSeconds() > kRestripeAbove * kept->BusiestNicSeconds()) {
    std::optional<Phase> phase(std::in_place, "route: finer stripes");
    RouteOptions fine = opt;
    fine.stripe_mib = kFineStripeMiB;
    auto finer = std::make_unique<routing::Router>(model, cluster, src_layout, src, dst_layout, dst, fine);
    finer->Plan();
    phase.reset();
    if (finer->FlowSeconds() > 0 && finer->FlowSeconds() < kept->FlowSeconds()) {
      kept.reset();
      return finer->Finish();
    }
  }
  return kept->Finish();
}

}  // namespace reshard
