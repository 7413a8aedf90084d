// reshard simulate: predicted refit time of a plan on a modelled cluster, the
// physical lower bound beside it, and a Chrome/Perfetto timeline.
#include <unistd.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "compiler/spec.h"
#include "runtime/error.h"
#include "runtime/plan.h"
#include "sim/bound.h"
#include "sim/simulate.h"
#include "sim/workload.h"
#include "tools/commands.h"

namespace reshard::cli {

namespace {

std::string Bytes(double b) {
  char buf[32];
  if (b >= 1e12) std::snprintf(buf, sizeof buf, "%.2f TB", b / 1e12);
  else if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

std::string Seconds(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.3f s", s);
  else if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f us", s * 1e6);
  return buf;
}

}  // namespace

void AddSimulateCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "simulate",
      "Predict how long a plan's refit takes on a cluster, with SimGrid's flow-level network model:\n"
      "every GPU has a full-duplex NIC into a non-blocking fabric and a full-duplex NVLink port into\n"
      "its domain's switch (bandwidths and latencies from the cluster spec); links are shared max-min\n"
      "fairly; pack, copy and unpack cost their bytes read and written through HBM. Every rank replays\n"
      "its rounds as the runtime does: local work, then all its transfers together (net and NVLink\n"
      "overlap), then unpacks; where the plan allows it (runtime/pipeline.h; RESHARD_PIPELINE=0 turns\n"
      "it off, here as in the runtime), the next round's packs and the previous round's unpacks run\n"
      "while a round's transfers fly.\n"
      "Prints the predicted time beside the physical lower bound of any plan for the same layouts,\n"
      "and splits their ratio at the busiest link: bytes (what it carries at its bandwidth, over the\n"
      "bound: above 1 where bytes are spread unevenly or more move than needed) x idle (1 / its\n"
      "utilization: time it waits on partners inside rounds); where a GPU's HBM work (packs, copies,\n"
      "unpacks) outlasts that link's bytes, at that GPU's HBM instead (colocated placements).\n"
      "Example:\n"
      "  reshard simulate qwen3.rsplan --cluster samples/clusters/dgx-h100.json --trace qwen3.trace.json\n"
      "  (open the trace in https://ui.perfetto.dev: one track per rank and channel)");
  struct Opts {
    std::string plan, cluster, trace;
    bool json = false, quiet = false;
    uint32_t overlap = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("plan", o->plan, "plan file (.rsplan)")->required();
  cmd->add_option("--cluster", o->cluster, ClusterOptionHelp("cluster spec (reshard.cluster/1) to simulate on"))
      ->required();
  cmd->add_option("--trace", o->trace, "write a Chrome/Perfetto timeline (JSON) here");
  cmd->add_flag("--json", o->json, "print the result as JSON");
  cmd->add_flag("-q,--quiet", o->quiet, "no progress messages");
  cmd->add_option("--what-if-overlap", o->overlap,
                  "what if the runtime kept this many rounds' messages in flight at once (the runtime keeps\n"
                  "one; 0, the default, simulates what it does): round r+1's messages start while round r\n"
                  "flies, except sends that forward what an earlier round received, which wait for it.\n"
                  "Staging is not modelled: such a runtime needs N + 1 staging arenas of the plan's round\n"
                  "size, so compare with a plan compiled with --staging-mb scaled by 2 / (N + 1)")
      ->check(CLI::Range(0, 8));
  cmd->callback([o, &exit_code] {
    std::string file;
    const std::string text = ClusterText(o->cluster, "--cluster", &file);  // a file, or a bundled name
    ClusterSpec cluster = ParseCluster(ParseJson(text, file), file);
    Plan plan = Plan::open(o->plan);
    sim::Workload w = sim::BuildWorkload(plan, cluster);
    sim::LowerBound lb = sim::ComputeLowerBound(plan, cluster);
    for (const std::string& warn : w.warnings) std::fprintf(stderr, "reshard: warning: %s\n", warn.c_str());
    sim::SimOptions opt;
    opt.trace_path = o->trace;
    opt.overlap_depth = o->overlap;
    if (!o->quiet && isatty(STDERR_FILENO)) {
      const uint32_t ranks = w.num_ranks;
      opt.progress = [ranks](double t, uint32_t done) {
        std::fprintf(stderr, "\rsimulating: %.3f s simulated, %u of %u ranks done", t, done, ranks);
      };
    }
    sim::SimResult r = sim::Simulate(w, cluster, opt);
    if (opt.progress) std::fprintf(stderr, "\r\033[K");
    const double ratio = lb.seconds > 0 ? r.seconds / lb.seconds : 1.0;
    const sim::GapToBound gap = sim::GapOf(r, lb.seconds, sim::LinkModel::Of(cluster));
    if (o->json) {
      nlohmann::ordered_json links = nlohmann::ordered_json::array();
      for (const sim::LinkLoad& l : r.busiest) {
        links.push_back({{"link", l.name()},
                         {"rank", l.rank},
                         {"path", l.path == sim::Path::net ? "net" : "nvlink"},
                         {"direction", l.egress ? "out" : "in"},
                         {"bytes", l.bytes},
                         {"utilization", l.utilization}});
      }
      nlohmann::ordered_json j = {
          {"plan", o->plan},
          {"cluster", cluster.name},
          {"ranks", w.num_ranks},
          {"rounds", w.num_rounds},
          {"what_if_overlap", o->overlap},
          {"predicted_seconds", r.seconds},
          {"lower_bound_seconds", lb.seconds},
          {"ratio_to_bound", ratio},
          {"bound",
           {{"binding", lb.binding()},
            {"ingress_seconds", lb.ingress_s},
            {"ingress_domain", lb.ingress_domain},
            {"ingress_bytes", lb.ingress_bytes},
            {"egress_seconds", lb.egress_s},
            {"egress_bytes", lb.egress_bytes},
            {"nvlink_seconds", lb.nvlink_s},
            {"needed_bytes", lb.needed_bytes},
            {"local_seconds", lb.local_s},
            {"local_rank", lb.local_rank},
            {"local_bytes", lb.local_bytes},
            {"latency_seconds", lb.latency_s}}},
          {"gap", !gap.has_split ? nlohmann::ordered_json(nullptr)
                  : gap.hbm      ? nlohmann::ordered_json{{"resource", "hbm"},
                                                          {"rank", r.hbm_rank},
                                                          {"hbm_seconds", r.hbm_seconds},
                                                          {"bytes_factor", gap.bytes},
                                                          {"idle_factor", gap.idle}}
                                 : nlohmann::ordered_json{{"resource", "link"},
                                                          {"link", gap.link.name()},
                                                          {"link_bytes", gap.link.bytes},
                                                          {"link_seconds", gap.link_seconds},
                                                          {"bytes_factor", gap.bytes},
                                                          {"idle_factor", gap.idle}}},
          {"bytes", {{"net", w.net_bytes}, {"nvlink", w.nvlink_bytes}, {"hbm_local", w.local_bytes},
                     {"hbm_unpack", w.unpack_bytes}}},
          {"hbm_seconds_max_rank", r.hbm_seconds},
          {"busiest_links", links},
          {"flows", r.comms},
          {"steps", w.steps},
          {"warnings", w.warnings},
          {"trace", o->trace},
          {"wall_seconds", r.wall_seconds}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s on %s: %u GPUs, %u rounds\n", o->plan.c_str(), cluster.name.c_str(), w.num_ranks,
                  w.num_rounds);
      if (o->overlap > 0)
        std::printf("  WHAT IF the runtime kept %u rounds' messages in flight (it keeps one)\n", o->overlap);
      std::printf("  predicted refit   %s\n", Seconds(r.seconds).c_str());
      std::printf("  lower bound       %s  (%s)\n", Seconds(lb.seconds).c_str(), lb.binding());
      std::printf("                      (a) domain ingress %s: domain %u takes in %s over its NICs\n",
                  Seconds(lb.ingress_s).c_str(), lb.ingress_domain, Bytes(lb.ingress_bytes).c_str());
      std::printf("                      (b) source egress  %s: %s must leave the domains holding it\n",
                  Seconds(lb.egress_s).c_str(), Bytes(lb.egress_bytes).c_str());
      std::printf("                      (c) GPU ingress    %s: GPUs need %s they do not hold%s\n",
                  Seconds(lb.nvlink_s).c_str(), Bytes(lb.needed_bytes).c_str(),
                  lb.nvlink_only ? " (one domain: over NVLink only)" : "");
      if (lb.local_bytes > 0)
        std::printf("                      (d) local copy     %s: GPU %u copies %s it holds itself through its HBM\n",
                    Seconds(lb.local_s).c_str(), lb.local_rank, Bytes(lb.local_bytes).c_str());
      std::printf("  plan / bound      %.2fx\n", ratio);
      if (gap.has_split && gap.hbm)
        std::printf("                      = HBM work %.3fx (GPU %u's packs, copies and unpacks: %s)\n"
                    "                      x idle %.3fx (its HBM is busy %.1f%% of the refit)\n",
                    gap.bytes, r.hbm_rank, Seconds(r.hbm_seconds).c_str(), gap.idle, 100 / gap.idle);
      else if (gap.has_split)
        std::printf("                      = bytes %.3fx (the busiest link, %s, carries %s: %s at its bandwidth)\n"
                    "                      x idle %.3fx (it is busy %.1f%% of the refit, waiting on partners)\n",
                    gap.bytes, gap.link.name().c_str(), Bytes(gap.link.bytes).c_str(), Seconds(gap.link_seconds).c_str(),
                    gap.idle, 100 / gap.idle);
      std::printf("  traffic           net %s, nvlink %s; HBM pack/copy %s, unpack %s (busiest rank %s)\n",
                  Bytes(w.net_bytes).c_str(), Bytes(w.nvlink_bytes).c_str(), Bytes(w.local_bytes).c_str(),
                  Bytes(w.unpack_bytes).c_str(), Seconds(r.hbm_seconds).c_str());
      std::printf("  busiest links    ");
      for (size_t i = 0; i < r.busiest.size() && i < 4; ++i) {
        std::printf("%s %s %.0f%%", i ? "," : "", r.busiest[i].name().c_str(), 100 * r.busiest[i].utilization);
      }
      std::printf("\n  simulated %llu flows of %llu steps in %.2f s%s%s\n",
                  static_cast<unsigned long long>(r.comms), static_cast<unsigned long long>(w.steps),
                  r.wall_seconds, o->trace.empty() ? "" : "; timeline in ", o->trace.c_str());
    }
    exit_code = 0;
  });
}

}  // namespace reshard::cli
