#include "compiler/compile.h"
#include "compiler/share_packs.h"

#include <cstdio>

#include "compiler/expand.h"
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
  return ParseInputs(LoadJson(model), LoadJson(from), LoadJson(to), LoadJson(cluster), model, from, to, cluster);
}

PlanIR BuildPlan(const CompileInputs& in, const CompileOptions& opt) {
  Expansion src = Expand(in.model, in.src);
  Expansion dst = Expand(in.model, in.dst);
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
  ro.quantize_on_sender = opt.quantize_on_sender;
  PlanIR ir = Route(in.model, in.cluster, in.src, src, in.dst, dst, ro);
  ir.shared_packs = SharePacks(ir);  // one pack, many sends
  ir.scales = src.scales;
  ir.scales.insert(ir.scales.end(), dst.scales.begin(), dst.scales.end());
  return ir;
}

}  // namespace reshard
