// reshard compile: specs in, plan out.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "compiler/compile.h"
#include "compiler/compile_file.h"
#include "compiler/keep_until_exit.h"
#include "compiler/phase_times.h"
#include "runtime/error.h"
#include "runtime/plan.h"
#include "tools/commands.h"
#include "tools/plan_report.h"
#include "tools/simulate_fills.h"

namespace reshard::cli {

void AddCompileCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("compile",
                                 "Compile the refit from a training layout to an inference layout into a plan.\n"
                                 "Example:\n"
                                 "  reshard compile --model samples/tiny-moe/model.json \\\n"
                                 "      --from samples/tiny-moe/train.json --to samples/tiny-moe/infer.json \\\n"
                                 "      --cluster samples/clusters/dgx-h100.json -o tiny-moe.rsplan");
  struct Opts {
    std::string model, from, to, cluster, out, strategy = "direct", fill_of;
    uint64_t staging_mb = 512;
    bool quiet = false, json = false, no_exchange = false, requantize_on_receiver = false, search_fills = false,
         simulate_fills = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "model spec (reshard.model/1)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--from", o->from, "training layout (reshard.layout/1): where the weights are")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--to", o->to, "inference layout (reshard.layout/1): where they must go")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--cluster", o->cluster, ClusterOptionHelp("cluster spec (reshard.cluster/1): NVLink domains, "
                                                             "bandwidths and, optionally, each GPU's memory"))
      ->required();
  cmd->add_option("-o,--output", o->out, "plan file to write (.rsplan); written whole or not at all")->required();
  cmd->add_option("--strategy", o->strategy,
                  "direct: every destination region straight from a source that holds it (default);\n"
                  "gather: the usual gather-to-owner then broadcast chain, as a baseline")
      ->check(OneOf({"direct", "gather"}));
  cmd->add_option("--staging-mb", o->staging_mb, "staging memory per rank in MiB (2..4095, default 512); work is split into rounds to fit")
      ->check(CLI::Range(2, 4095));
  cmd->add_flag("--no-nvlink-exchange", o->no_exchange,
               "direct: every GPU pulls what it needs over the network itself, even when other GPUs of its\n"
               "NVLink domain need the same region (by default such a region enters the domain once,\n"
               "striped over the domain's NICs, and is forwarded over NVLink)");
  cmd->add_flag("--requantize-on-receiver", o->requantize_on_receiver,
                "quantized destinations receive the tensor's dtype (BF16) and quantize it themselves, even\n"
                "where the sender holds whole scale blocks (by default such a sender quantizes and sends FP8\n"
                "values plus scales: about half the bytes). Blocks that several training ranks hold parts of\n"
                "are quantized by the receiver either way, from the parts' partial amaxes");
  cmd->add_flag("--search-fills", o->search_fills,
                "direct: besides the default fills (greedy for 90% and for 95% of the staging budget, and\n"
                "every pair's proportional share: on plans of more than 16384 pieces at least a quarter of a\n"
                "round's; on smaller plans twice, for 90% and for 80% of the staging budget, with pieces split\n"
                "down to 4 MiB; on plans of more than 16384 pieces each fill keeps, in every round, staging\n"
                "for the NIC intake of each GPU whose NIC takes in at least what its NVLink port does, which\n"
                "its peers' NVLink pieces may not use: `show` prints it as \"staging kept for NIC intake\"),\n"
                "also fill the rounds greedily for 80% and 85% of the staging budget and, on large plans,\n"
                "with shares of at least 1/8 and 3/8 of a round's; keep the fill an estimate of\n"
                "the refit (its rounds replayed as messages sharing links, as `reshard simulate` does) finds\n"
                "fastest. Costs a fill each, as many at once as the machine has threads; the plan may be\n"
                "larger (docs/benchmarks.md has what it buys on the bundled rows)");
  cmd->add_flag("--simulate-fills", o->simulate_fills,
                "direct: compile the plan once for each fill --search-fills tries, simulate each on --cluster\n"
                "(as `reshard simulate` does, with latencies and HBM passes, which the estimate leaves out)\n"
                "and keep the one predicted fastest, instead of the one the estimate picks (the two rarely\n"
                "differ, and then by little). Slow: a compile and a simulation per fill (5 or 7),\n"
                "each in a process of its own, as many at once as the machine has cores; for CI, not for job\n"
                "start. --json lists every fill's prediction (\"fills\") and the one kept (\"kept_fill\")");
  auto* fill_of =
      cmd->add_option("--fill-of", o->fill_of,
                      "direct: fill the rounds the way PLAN, an earlier plan of this job, was filled, and cut its\n"
                      "stripes so (`reshard show` prints both), instead of trying three fills and keeping the\n"
                      "fastest by an estimate: a recompile after an inference-side change (an EPLB step) then runs\n"
                      "one fill and no estimate, a faster recompile of the same plan. Where the change makes another\n"
                      "fill faster, the plan is the slower one; compile without it in CI")
          ->check(CLI::ExistingFile);
  cmd->add_flag("-q,--quiet", o->quiet, "print nothing on success");
  cmd->add_flag("--json", o->json, "print the summary as JSON");
  fill_of->excludes("--search-fills")->excludes("--simulate-fills");
  cmd->callback([o, &exit_code] {
    auto t0 = std::chrono::steady_clock::now();
    SetKeepUntilExit(true);  // a process of its own: what it built is left to the exit
    std::optional<Phase> load(std::in_place, "read specs");
    CompileInputs in = LoadInputs(o->model, o->from, o->to, o->cluster);
    load.reset();
    CompileOptions opt;
    opt.strategy = o->strategy;
    opt.staging_mb = o->staging_mb;
    opt.nvlink_exchange = !o->no_exchange;
    opt.quantize_on_sender = !o->requantize_on_receiver;
    opt.search_fills = o->search_fills;
    if (!o->fill_of.empty()) opt.fill_of = RoundFillOf(Plan::open(o->fill_of).root(), o->fill_of);
    nlohmann::ordered_json j;
    if (o->simulate_fills) {
      const bool show = !o->quiet && !o->json && isatty(STDERR_FILENO);
      j = SimulateFills(in, opt, o->out, [show](size_t done, size_t total) {
        if (show) std::fprintf(stderr, "\rsimulating fills: %zu of %zu done", done, total);
      });
      if (show) std::fprintf(stderr, "\r\033[K");
    } else {
      j = CompilePlanFile(in, opt, o->out);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    j["seconds"] = secs;
    // Weights a GPU cannot hold (the cluster's gpu_memory_GB): a warning, also in --json's "memory_warnings".
    for (const auto& w : j["memory_warnings"])
      std::fprintf(stderr, "reshard: warning: %s\n", w["message"].get<std::string>().c_str());
    if (o->json) {
      std::printf("%s\n", j.dump().c_str());
    } else if (!o->quiet) {
      std::printf("%s\n", CompileLine(in, j).c_str());
      const size_t amax = j["split_blocks"]["partial_amaxes"], frames = j["split_blocks"]["assembled_frames"];
      if (amax + frames > 0) {
        std::printf(
            "  %zu groups of scale blocks that several training ranks hold parts of, quantized by their "
            "receivers: %zu with scales from partial amaxes, %zu assembled whole in a frame (FP8 sources)\n",
            amax + frames, amax, frames);
      }
      const uint64_t shared = j["shared_packs"]["steps"];
      if (shared > 0) {
        std::printf("  %llu packs (%llu of them quantizing) done once for several sends: %.3f GB of staging writes saved\n",
                    static_cast<unsigned long long>(shared),
                    static_cast<unsigned long long>(j["shared_packs"]["quantizing"].get<uint64_t>()),
                    j["shared_packs"]["bytes"].get<uint64_t>() / 1e9);
      }
      const bool proportional = j["round_fill"] == "proportional";
      const double fill = j["staging_fill"];
      const std::string filled = report::RoundFillText(proportional, j["min_share"], fill, j["split_share"], j["nic_reserve"],
                                                         j["stripe_mib"]);
      if (o->simulate_fills) {
        std::printf("  %s: predicted %.5g s (%.3fx of the bound), the fastest of %zu fills simulated:\n",
                    filled.c_str(), j["predicted_seconds"].get<double>(),
                    j["predicted_seconds"].get<double>() / j["lower_bound_seconds"].get<double>(), j["fills"].size());
        for (const auto& f : j["fills"]) {
          std::printf("    fill %zu: %-12s planned for %3.0f%%, min share %.3f, split share %.4f, NIC reserve %.2g: %.5g s, plan %.2f MiB%s\n",
                      f["fill"].get<size_t>(), f["round_fill"].get<std::string>().c_str(),
                      f["staging_fill"].get<double>() * 100, f["min_share"].get<double>(),
                      f["split_share"].get<double>(), f["nic_reserve"].get<double>(), f["predicted_seconds"].get<double>(), f["plan_bytes"].get<size_t>() / 1048576.0,
                      f["fill"] == j["kept_fill"] ? "  (kept)" : "");
        }
      } else if (!o->fill_of.empty()) {
        std::printf("  %s, as %s was (--fill-of)\n", filled.c_str(), o->fill_of.c_str());
      } else if (proportional || fill != kDefaultStagingFill) {
        std::printf("  %s (the fastest of the fills tried)\n", filled.c_str());
      }
    }
    exit_code = 0;
  });
}

}  // namespace reshard::cli
