#include "compiler/compile.h"
#include "compiler/share_packs.h"

#include <cstdio>
#include <exception>
#include <future>
#include <optional>

#include "compiler/expand.h"
#include "compiler/keep_until_exit.h"
#include "compiler/memory_check.h"
#include "compiler/phase_times.h"
#include "runtime/error.h"

namespace reshard {
namespace {

// FNV-1a over the canonical JSON of every input (keys sorted, no whitespace),
// twice with different offsets: a 128-bit change detector, not a security hash.
std::string Digest(const std::vector<std::string>& parts) {
  uint64_t h1 = 0xcbf29ce484222325ull, h2 = 0x84222325cbf29ce4ull;
  for (const std::string& p : parts) {
    for (unsigned char c : p) {
      h1 = (h1 ^ c) * 0x100000001b3ull;
      h2 = (h2 ^ c) * 0x100000001b3ull;
    }
    h1 = (h1 ^ 0xff) * 0x100000001b3ull;
    h2 = (h2 ^ 0xfe) * 0x100000001b3ull;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h1),
                static_cast<unsigned long long>(h2));
  return buf;
}

}  // namespace

CompileInputs ParseInputs(const nlohmann::json& model, const nlohmann::json& from, const nlohmann::json& to,
                          const nlohmann::json& cluster, const std::string& model_file, const std::string& from_file,
                          const std::string& to_file, const std::string& cluster_file) {
  CompileInputs in;
  in.model = ParseModel(model, model_file);
  in.src = ParseLayout(from, from_file, in.model);
  in.dst = ParseLayout(to, to_file, in.model);
  in.cluster = ParseCluster(cluster, cluster_file);
  in.digest = Digest({model.dump(), from.dump(), to.dump(), cluster.dump()});
  return in;
}

CompileInputs LoadInputs(const std::string& model, const std::string& from, const std::string& to,
                         const std::string& cluster) {
  std::string cluster_file;
  const std::string cluster_text = ClusterText(cluster, "--cluster", &cluster_file);  // a file, or a bundled name
  return ParseInputs(LoadJson(model), LoadJson(from), LoadJson(to), ParseJson(cluster_text, cluster_file), model, from,
                     to, cluster_file);
}

RoundFill RoundFillOf(const fb::Plan& plan, const std::string& path) {
  const fb::RoundFill* f = plan.round_fill();
  if (f == nullptr) {
    throw Error("--fill-of " + path + ": the plan records no round fill (a gather plan, or one written before " +
                "reshard recorded it); compile without --fill-of");
  }
  // Plans written before the split share was recorded (-1): the fills then
  // split finely in the proportional fill with no min share, else coarsely.
  const double split = f->split_share() >= 0                            ? f->split_share()
                       : f->proportional() && f->min_share() == 0 ? 0.0
                                                                  : kCoarseSplit;
  if (!(f->staging_fill() > 0 && f->staging_fill() <= 1) || !(f->min_share() >= 0 && f->min_share() < 1) ||
      !(split >= 0 && split < 1) || !(f->nic_reserve() >= 0 && f->nic_reserve() <= 16) || f->stripe_mib() < 1 ||
      f->stripe_mib() > 4096) {
    throw Error("--fill-of " + path + ": its round fill is out of range (staging fill " +
                std::to_string(f->staging_fill()) + ", min share " + std::to_string(f->min_share()) +
                ", split share " + std::to_string(split) + ", NIC reserve " + std::to_string(f->nic_reserve()) +
                ", stripes of " + std::to_string(f->stripe_mib()) + " MiB)");
  }
  return {f->proportional(), f->staging_fill(), f->min_share(), split, f->nic_reserve(), f->stripe_mib()};
}

PlanIR BuildPlan(const CompileInputs& in, const CompileOptions& opt) {
  if (opt.fill_of && opt.strategy != "direct")
    throw Error("--fill-of: only direct plans fill rounds (this compile is --strategy " + opt.strategy + ")");
  if (opt.fill_of && opt.search_fills) throw Error("--fill-of excludes --search-fills");
  std::optional<Phase> phase(std::in_place, "expand");
  // The two sides expand independently: the training side on a thread of
  // its own. An error in it is reported first, as if they ran in turn.
  std::future<Expansion> src_future = std::async(std::launch::async, [&in] { return Expand(in.model, in.src); });
  std::optional<Expansion> dst_or;
  std::exception_ptr dst_error;
  try {
    dst_or = Expand(in.model, in.dst);
  } catch (...) {
    dst_error = std::current_exception();
  }
  Expansion src = src_future.get();
  if (dst_error) std::rethrow_exception(dst_error);
  Expansion dst = std::move(*dst_or);
  dst_or.reset();
  phase.emplace("memory check");
  const std::vector<MemoryWarning> memory =
      CheckGpuMemory(in.cluster, in.src, RankWeightBytes(src), in.dst, RankWeightBytes(dst));
  phase.emplace("route");
  // Scale tensors are numbered after the model's: the training side's, then
  // the inference side's.
  const int nt = static_cast<int>(in.model.tensors.size()), nsrc = static_cast<int>(src.scales.size());
  for (RankLayout& rl : dst.ranks)
    for (Fragment& f : rl.fragments)
      if (f.tensor >= nt) f.tensor += nsrc;
  for (ScaleTensor& s : dst.scales) s.side = 1;
  RouteOptions ro;
  ro.strategy = opt.strategy;
  ro.staging_bytes = opt.staging_mb << 20;
  ro.nvlink_exchange = opt.nvlink_exchange;
  ro.search_fills = opt.search_fills;
  ro.fill_candidate = opt.fill_candidate;
  ro.fill_of = opt.fill_of;
  ro.flow_budget = opt.flow_budget;
  ro.stripe_mib = opt.stripe_mib;
  ro.emit_threads = opt.emit_threads;
  ro.quantize_on_sender = opt.quantize_on_sender;
  PlanIR ir = Route(in.model, in.cluster, in.src, src, in.dst, dst, ro);
  phase.emplace("share packs");
  ir.shared_packs = SharePacks(ir);  // one pack, many sends
  phase.reset();
  ir.memory_warnings = memory;
  ir.scales = src.scales;
  ir.scales.insert(ir.scales.end(), dst.scales.begin(), dst.scales.end());
  Dispose(std::move(src));
  Dispose(std::move(dst));
  return ir;
}

nlohmann::ordered_json CompileSummary(const std::string& out, const std::string& strategy, const PlanIR& ir,
                                      size_t plan_bytes) {
  nlohmann::ordered_json j = {{"plan", out},
                              {"strategy", strategy},
                              {"ranks", ir.ranks.size()},
                              {"rounds", ir.num_rounds},
                              {"net_bytes", ir.net_bytes},
                              {"nvlink_bytes", ir.nvlink_bytes},
                              {"plan_bytes", plan_bytes}};
  // Groups of scale blocks that several training ranks hold parts of, by the way they are quantized.
  j["split_blocks"] = {{"partial_amaxes", ir.amax_assemblies}, {"assembled_frames", ir.frame_assemblies}};
  // Pack steps dropped because their round packs the same bytes already (one pack, many sends).
  j["shared_packs"] = {
      {"steps", ir.shared_packs.packs}, {"quantizing", ir.shared_packs.quant_packs}, {"bytes", ir.shared_packs.bytes}};
  // How the rounds were filled: "greedy" pair by pair, or "proportional" (every pair its share of each round).
  j["round_fill"] = ir.round_fill.proportional ? "proportional" : "greedy";
  // Proportional fills: no pair's share of a round below this part of the round's share (0: the smallest split).
  j["min_share"] = ir.round_fill.min_share;
  // No part split off a piece below this part of a round's share (nor 4 MiB; 0: 4 MiB).
  j["split_share"] = ir.round_fill.split_share;
  // Staging kept for NIC intake: this times a GPU's NIC bytes left per round left (0: none; RoundFill::nic_reserve).
  j["nic_reserve"] = ir.round_fill.nic_reserve;
  // The share of the staging budget the rounds were planned to fill.
  j["staging_fill"] = ir.round_fill.staging_fill;
  // A region several GPUs of a destination domain need enters it in stripes of at least this many MiB.
  j["stripe_mib"] = ir.round_fill.stripe_mib;
  // The kept fill's flow estimate and its busiest NIC's bytes at the NIC's bandwidth (0: no estimate).
  j["estimate"] = {{"flow_seconds", ir.flow_seconds}, {"busiest_nic_seconds", ir.busiest_nic_seconds}};
  // Ranks whose weights exceed the cluster's gpu_memory_GB: one entry per side, its heaviest rank.
  j["memory_warnings"] = MemoryWarningsJson(ir.memory_warnings);
  return j;
}

std::string CompileLine(const CompileInputs& in, const nlohmann::ordered_json& j) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "compiled %s -> %s (%s): %zu ranks, %zu rounds, %.3f GB over the network, %.3f GB over NVLink, "
                "plan %.2f MiB, %.2f s",
                in.src.name.c_str(), in.dst.name.c_str(), j["strategy"].get<std::string>().c_str(),
                j["ranks"].get<size_t>(), j["rounds"].get<size_t>(), j["net_bytes"].get<uint64_t>() / 1e9,
                j["nvlink_bytes"].get<uint64_t>() / 1e9, j["plan_bytes"].get<size_t>() / 1048576.0,
                j["seconds"].get<double>());
  return buf;
}

}  // namespace reshard
