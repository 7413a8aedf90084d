// reshard compile: specs in, plan out.
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "compiler/compile.h"
#include "runtime/error.h"
#include "tools/commands.h"

namespace reshard::cli {

void AddCompileCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("compile",
                                 "Compile the refit from a training layout to an inference layout into a plan.\n"
                                 "Example:\n"
                                 "  reshard compile --model samples/tiny-moe/model.json \\\n"
                                 "      --from samples/tiny-moe/train.json --to samples/tiny-moe/infer.json \\\n"
                                 "      --cluster samples/clusters/dgx-h100.json -o tiny-moe.rsplan");
  struct Opts {
    std::string model, from, to, cluster, out, strategy = "direct";
    uint64_t staging_mb = 512;
    bool quiet = false, json = false, no_exchange = false, requantize_on_receiver = false, search_fills = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "model spec (reshard.model/1)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--from", o->from, "training layout (reshard.layout/1): where the weights are")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--to", o->to, "inference layout (reshard.layout/1): where they must go")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--cluster", o->cluster, "cluster spec (reshard.cluster/1): NVLink domains and bandwidths")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", o->out, "plan file to write (.rsplan); written whole or not at all")->required();
  cmd->add_option("--strategy", o->strategy,
                  "direct: every destination region straight from a source that holds it (default);\n"
                  "gather: the usual gather-to-owner then broadcast chain, as a baseline")
      ->check(CLI::IsMember({"direct", "gather"}));
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
                "direct: besides the three default fills (greedy for 90% and for 95% of the staging budget,\n"
                "and every pair's proportional share: on plans of more than 16384 pieces at least a quarter\n"
                "of a round's), also fill the rounds greedily for 80% and 85% of the staging budget and, on\n"
                "large plans, with shares of at least 1/8 and 3/8 of a round's; keep the fill an estimate of\n"
                "the replay finds fastest. Costs a fill each, as many at once as the machine has threads\n"
                "(DeepSeek-V3: about 0.5 s each; its refit predicted 1.4% faster on DGX H100, Kimi-K2 1%;\n"
                "plans up to 10% larger)");
  cmd->add_flag("-q,--quiet", o->quiet, "print nothing on success");
  cmd->add_flag("--json", o->json, "print the summary as JSON");
  cmd->callback([o, &exit_code] {
    auto t0 = std::chrono::steady_clock::now();
    CompileInputs in = LoadInputs(o->model, o->from, o->to, o->cluster);
    CompileOptions opt;
    opt.strategy = o->strategy;
    opt.staging_mb = o->staging_mb;
    opt.nvlink_exchange = !o->no_exchange;
    opt.quantize_on_sender = !o->requantize_on_receiver;
    opt.search_fills = o->search_fills;
    PlanIR ir = BuildPlan(in, opt);
    std::vector<uint8_t> bytes = EmitPlan(in, ir);
    WriteFileAtomic(o->out, bytes);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o->json) {
      nlohmann::ordered_json j = {{"plan", o->out},           {"strategy", o->strategy},
                                  {"ranks", ir.ranks.size()}, {"rounds", ir.num_rounds},
                                  {"net_bytes", ir.net_bytes}, {"nvlink_bytes", ir.nvlink_bytes},
                                  {"plan_bytes", bytes.size()}, {"seconds", secs}};
      // Groups of scale blocks that several training ranks hold parts of, by the way they are quantized.
      j["split_blocks"] = {{"partial_amaxes", ir.amax_assemblies}, {"assembled_frames", ir.frame_assemblies}};
      // Pack steps dropped because their round packs the same bytes already (one pack, many sends).
      j["shared_packs"] = {{"steps", ir.shared_packs.packs}, {"quantizing", ir.shared_packs.quant_packs}, {"bytes", ir.shared_packs.bytes}};
      // How the rounds were filled: "greedy" pair by pair, or "proportional" (every pair its share of each round).
      j["round_fill"] = ir.proportional_fill ? "proportional" : "greedy";
      // Proportional fills: no pair's share of a round below this part of the round's share (0: the smallest split).
      j["min_share"] = ir.proportional_min_share;
      // The share of the staging budget the rounds were planned to fill.
      j["staging_fill"] = ir.staging_fill;
      std::printf("%s\n", j.dump().c_str());
    } else if (!o->quiet) {
      std::printf("compiled %s -> %s (%s): %zu ranks, %zu rounds, %.3f GB over the network, %.3f GB over NVLink, "
                  "plan %.2f MiB, %.2f s\n",
                  in.src.name.c_str(), in.dst.name.c_str(), o->strategy.c_str(), ir.ranks.size(), ir.num_rounds,
                  ir.net_bytes / 1e9, ir.nvlink_bytes / 1e9, bytes.size() / 1048576.0, secs);
      if (ir.amax_assemblies + ir.frame_assemblies > 0) {
        std::printf(
            "  %zu groups of scale blocks that several training ranks hold parts of, quantized by their "
            "receivers: %zu with scales from partial amaxes, %zu assembled whole in a frame (FP8 sources)\n",
            ir.amax_assemblies + ir.frame_assemblies, ir.amax_assemblies, ir.frame_assemblies);
      }
      if (ir.shared_packs.packs > 0) {
        std::printf("  %llu packs (%llu of them quantizing) done once for several sends: %.3f GB of staging writes saved\n",
                    static_cast<unsigned long long>(ir.shared_packs.packs),
                    static_cast<unsigned long long>(ir.shared_packs.quant_packs), ir.shared_packs.bytes / 1e9);
      }
      if (ir.proportional_fill || ir.staging_fill != kDefaultStagingFill) {
        const std::string how =
            !ir.proportional_fill ? "greedily"
            : ir.proportional_min_share > 0
                ? "with every pair's proportional share, at least " +
                      std::to_string(static_cast<int>(ir.proportional_min_share * 100 + 0.5)) + "% of a round's"
                : "with every pair's proportional share";
        std::printf("  rounds filled %s, planned for %.0f%% of the staging budget (the fastest of the fills tried)\n",
                    how.c_str(), ir.staging_fill * 100);
      }
    }
    exit_code = 0;
  });
}

}  // namespace reshard::cli
