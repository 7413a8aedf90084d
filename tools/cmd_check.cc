// reshard check: compare the buffers a layout binds on each rank (name, dtype,
// shape) with a dump of the framework's real parameters.
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "compiler/expand.h"
#include "compiler/spec.h"
#include "compiler/state_dict_check.h"
#include "runtime/error.h"
#include "tools/commands.h"

namespace reshard::cli {

void AddCheckCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "check",
      "Compare, rank by rank, the buffers a layout binds (name, dtype, shape) with a dump of a framework's real\n"
      "parameters, and print every difference: missing (the layout binds it, the dump lacks it), extra (the\n"
      "dump has it, the layout does not bind it), wrong shape, wrong dtype. Write the dump from any\n"
      "torch.nn.Module with tools/dump_state_dict.py (named_parameters() plus persistent buffers):\n"
      "  {\"rank\": R, \"params\": [{\"name\": N, \"dtype\": \"torch.bfloat16\", \"shape\": [..]}, ...]}\n"
      "one file per rank or a list of those in one file. Torch dtypes map to reshard's: bfloat16 bf16,\n"
      "float16 fp16, float32 fp32, float8_e4m3fn fp8_e4m3, float8_e8m0fnu e8m0.\n"
      "Tensors an engine holds beyond the checkpoint are listed apart as 'engine', with the reason, when the\n"
      "dump's \"framework\" field names the engine (\"vLLM 0.33.0\"): vLLM's attention scales (_k_scale,\n"
      "_v_scale, _q_scale, _prob_scale: runtime buffers) and MLA's W_UV / W_UK_T (derived at load from\n"
      "kv_b_proj; reshard.vllm recomputes them after a refit). Any other unbound tensor is a difference.\n"
      "  reshard check --layout train.json --model model.json --state-dict dump/rank*.json\n"
      "Exit status: 0 no difference, 1 differences (listed), 2 unreadable input.");
  struct Opts {
    std::string layout, model;
    std::vector<std::string> dumps;
    int64_t rank = -1;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--layout", o->layout, "layout spec (reshard.layout/1)")->required();
  cmd->add_option("--model", o->model, "model spec (reshard.model/1)")->required();
  cmd->add_option("--state-dict", o->dumps, "dump file(s): one per rank, or one with every rank")->required();
  cmd->add_option("--rank", o->rank, "compare this rank only (the dump must have it)")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", o->json, "print the result as JSON");
  cmd->callback([o, &exit_code] {
    ModelSpec model = ParseModel(LoadJson(o->model), o->model);
    LayoutSpec layout = ParseLayout(LoadJson(o->layout), o->layout, model);
    Expansion ex = Expand(model, layout);
    std::vector<RankDump> dumps = LoadStateDictDumps(o->dumps);
    StateDictReport rep =
        CheckStateDict(layout, ex, dumps, o->rank >= 0 ? std::optional<int64_t>(o->rank) : std::nullopt);
    std::string ranks;
    for (size_t i = 0; i < rep.ranks.size(); ++i) ranks += (i ? "," : "") + std::to_string(rep.ranks[i]);
    if (o->json) {
      nlohmann::ordered_json diffs = nlohmann::ordered_json::array();
      for (const StateDictDiff& d : rep.diffs)
        diffs.push_back({{"rank", d.rank},
                         {"kind", DiffKindString(d.kind)},
                         {"name", d.name},
                         {"layout", d.layout},
                         {"dump", d.dump},
                         {"message", d.message}});
      nlohmann::ordered_json engine = nlohmann::ordered_json::array();
      for (const EngineTensorLine& e : rep.engine)
        engine.push_back({{"rank", e.rank},
                          {"name", e.name},
                          {"dump", e.dump},
                          {"kind", EngineTensorKindString(e.what.kind)},
                          {"framework", e.what.framework},
                          {"from", e.what.from},
                          {"reason", e.what.reason}});
      nlohmann::ordered_json j = {{"layout", o->layout},
                                  {"model", o->model},
                                  {"state_dict", o->dumps},
                                  {"ok", rep.ok()},
                                  {"layout_ranks", ex.ranks.size()},
                                  {"ranks", rep.ranks},
                                  {"layout_buffers", rep.layout_buffers},
                                  {"dump_params", rep.dump_params},
                                  {"differences", diffs},
                                  {"views", rep.views},
                                  {"engine_tensors", engine}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      for (const StateDictDiff& d : rep.diffs) std::printf("%s\n", d.message.c_str());
      for (const std::string& v : rep.views) std::printf("%s\n", v.c_str());
      for (const EngineTensorLine& e : rep.engine) std::printf("%s\n", e.message.c_str());
      std::string what = std::to_string(rep.ranks.size()) + " of " + std::to_string(ex.ranks.size()) + " ranks (" +
                         ranks + "), " + std::to_string(rep.layout_buffers) + " layout buffers, " +
                         std::to_string(rep.dump_params) + " dumped parameters";
      const std::string views =
          rep.views.empty() ? "" : " (" + std::to_string(rep.views.size()) + " of them permuted views of its memory)";
      const std::string engine =
          rep.engine.empty() ? ""
                             : "; " + std::to_string(rep.engine.size()) +
                                   " more dumped tensors are the engine's own (runtime buffers, derived at load, "
                                   "outside the model spec), not written by a refit";
      if (rep.ok())
        std::printf("%s: matches the dump: %s, same names, dtypes and shapes%s%s\n", o->layout.c_str(), what.c_str(),
                    views.c_str(), engine.c_str());
      else
        std::printf("%s: %zu differences from the dump: %s\n", o->layout.c_str(), rep.diffs.size(), what.c_str());
    }
    exit_code = rep.ok() ? 0 : 1;
  });
}

}  // namespace reshard::cli
