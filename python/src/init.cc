// reshard.init: `reshard init` in-process (the library functions
// tools/cmd_init.cc calls: read the config, derive the specs, write them).
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>
#include <vector>

#include "compiler/init.h"
#include "compiler/spec.h"
#include "runtime/error.h"
#include "python/src/ext.h"

namespace reshard::py {

void BindInit(nb::module_& m) {
  m.def(
      "_init",
      [](const std::string& config_path, const std::string& config_text, const std::string& train,
         const std::string& infer, const std::string& cluster, const std::string& name, const std::string& out_dir) {
        if (!cluster.empty()) {  // an unknown name is a ValueError naming the argument, as in reshard.compile
          std::string file;
          try {
            ClusterText(cluster, "cluster", &file);
          } catch (const Error& e) {
            throw nb::value_error(e.what());
          }
        }
        init::Result res;
        {
          nb::gil_scoped_release release;
          Tagged(ErrorKind::kCompile, [&] {
            init::Request req;
            if (config_path.empty()) {  // a config given as a mapping, serialized by the caller
              req.config = ParseJson(config_text, "hf_config");
              req.config_file = "hf_config";
            } else {
              init::ReadConfig(config_path, req);
            }
            req.train = train;
            req.infer = infer;
            req.cluster = cluster;
            req.name = name;
            res = init::Generate(req);
            if (!out_dir.empty()) init::WriteFiles(out_dir, res);
          });
        }
        return std::make_pair(res.files, res.notes);
      },
      nb::arg("config_path"), nb::arg("config_text"), nb::arg("train"), nb::arg("infer"), nb::arg("cluster"),
      nb::arg("name"), nb::arg("out_dir"));
}

}  // namespace reshard::py
