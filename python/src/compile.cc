// reshard.compile: the compiler in-process, the passes `reshard compile`
// runs (compiler/compile_file.h) with the same options and summary.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "compiler/compile_file.h"
#include "compiler/spec.h"
#include "runtime/error.h"
#include "runtime/plan.h"
#include "python/src/ext.h"

namespace reshard::py {

void BindCompile(nb::module_& m) {
  // Returns the summary `reshard compile --json` prints (as JSON text, the
  // wall time included) and the CLI's human line.
  m.def(
      "_compile",
      [](const std::string& model, const std::string& from, const std::string& to, const std::string& cluster,
         const std::string& output, const std::string& strategy, uint64_t staging_mb, bool nvlink_exchange,
         bool quantize_on_sender, bool search_fills, const std::string& fill_of) {
        // The cluster argument first: an unknown name is a ValueError naming
        // the argument ("cluster: cannot open 'dgx-h200'; ..."), not a
        // compile error naming the CLI's --cluster.
        std::string cluster_file, cluster_text;
        try {
          cluster_text = ClusterText(cluster, "cluster", &cluster_file);
        } catch (const Error& e) {
          throw nb::value_error(e.what());
        }
        std::string json, line;
        {
          nb::gil_scoped_release release;
          Tagged(ErrorKind::kCompile, [&] {
            auto t0 = std::chrono::steady_clock::now();
            CompileInputs in = ParseInputs(LoadJson(model), LoadJson(from), LoadJson(to),
                                           ParseJson(cluster_text, cluster_file), model, from, to, cluster_file);
            CompileOptions opt;
            opt.strategy = strategy;
            opt.staging_mb = staging_mb;
            opt.nvlink_exchange = nvlink_exchange;
            opt.quantize_on_sender = quantize_on_sender;
            opt.search_fills = search_fills;
            if (!fill_of.empty()) opt.fill_of = RoundFillOf(Plan::open(fill_of).root(), fill_of);
            nlohmann::ordered_json j = CompilePlanFile(in, opt, output);
            j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            json = j.dump();
            line = CompileLine(in, j);  // the CLI's line, word for word
          });
        }
        return nb::make_tuple(json, line);
      },
      nb::arg("model"), nb::arg("from_"), nb::arg("to"), nb::arg("cluster"), nb::arg("output"), nb::arg("strategy"),
      nb::arg("staging_mb"), nb::arg("nvlink_exchange"), nb::arg("quantize_on_sender"), nb::arg("search_fills"),
      nb::arg("fill_of"));
}

}  // namespace reshard::py
