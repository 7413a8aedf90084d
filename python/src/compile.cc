// reshard.compile: the compiler in-process, the same passes as `reshard
// compile` (tools/cmd_compile.cc) with the same options and summary.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "python/src/ext.h"

namespace reshard::py {

void BindCompile(nb::module_& m) {
  m.def(
      "_compile",
      [](const std::string& model, const std::string& from, const std::string& to, const std::string& cluster,
         const std::string& output, const std::string& strategy, uint64_t staging_mb, bool nvlink_exchange,
         bool quantize_on_sender) {
        std::string summary;
        nb::dict d;
        size_t ranks = 0, rounds = 0, plan_bytes = 0, amax = 0, frames = 0;
        uint64_t net = 0, nvlink = 0;
        double secs = 0;
        {
          nb::gil_scoped_release release;
          Tagged(ErrorKind::kCompile, [&] {
            auto t0 = std::chrono::steady_clock::now();
            CompileInputs in = LoadInputs(model, from, to, cluster);
            CompileOptions opt;
            opt.strategy = strategy;
            opt.staging_mb = staging_mb;
            opt.nvlink_exchange = nvlink_exchange;
            opt.quantize_on_sender = quantize_on_sender;
            PlanIR ir = BuildPlan(in, opt);
            std::vector<uint8_t> bytes = EmitPlan(in, ir);
            WriteFileAtomic(output, bytes);
            secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            ranks = ir.ranks.size();
            rounds = ir.num_rounds;
            net = ir.net_bytes;
            nvlink = ir.nvlink_bytes;
            plan_bytes = bytes.size();
            amax = ir.amax_assemblies;
            frames = ir.frame_assemblies;
            // The CLI's summary line, word for word.
            char line[1024];
            std::snprintf(line, sizeof line,
                          "compiled %s -> %s (%s): %zu ranks, %zu rounds, %.3f GB over the network, %.3f GB over "
                          "NVLink, plan %.2f MiB, %.2f s",
                          in.src.name.c_str(), in.dst.name.c_str(), strategy.c_str(), ranks, rounds, net / 1e9,
                          nvlink / 1e9, plan_bytes / 1048576.0, secs);
            summary = line;
          });
        }
        d["plan"] = output;
        d["strategy"] = strategy;
        d["ranks"] = ranks;
        d["rounds"] = rounds;
        d["net_bytes"] = net;
        d["nvlink_bytes"] = nvlink;
        d["plan_bytes"] = plan_bytes;
        d["seconds"] = secs;
        nb::dict split;
        split["partial_amaxes"] = amax;
        split["assembled_frames"] = frames;
        d["split_blocks"] = split;
        d["summary"] = summary;
        return d;
      },
      nb::arg("model"), nb::arg("from_"), nb::arg("to"), nb::arg("cluster"), nb::arg("output"), nb::arg("strategy"),
      nb::arg("staging_mb"), nb::arg("nvlink_exchange"), nb::arg("quantize_on_sender"));
}

}  // namespace reshard::py
