// reshard init's file side, shared by the CLI (tools/cmd_init.cc) and the
// Python package (reshard.init): reading the HF config, writing the specs.
// What the specs say comes from frameworks/ (see compiler/init.h).
#include <filesystem>
#include <vector>

#include "compiler/compile.h"
#include "compiler/init.h"
#include "compiler/spec.h"
#include "compiler/write_file.h"
#include "runtime/error.h"

namespace reshard::init {

void ReadConfig(const std::string& path, Request& req) {
  std::string config = path;
  if (std::filesystem::is_directory(config)) config = (std::filesystem::path(config) / "config.json").string();
  req.config = LoadJson(config);
  req.config_file = config;
}

void WriteFiles(const std::string& dir, const Result& res) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("-o: cannot create directory '" + dir + "': " + ec.message());
  for (const auto& [name, text] : res.files)
    WriteFileAtomic((std::filesystem::path(dir) / name).string(), std::vector<uint8_t>(text.begin(), text.end()));
}

}  // namespace reshard::init
