// reshard init: the three specs (model, training layout, inference layout) and
// a cluster, derived from a Hugging Face config.json and the frameworks'
// parallel settings (README.md, "Specs from a config: reshard init").
//
// This is the driver (compiler/init.cc: the specs; init_files.cc: reading the
// config, writing the files). The knowledge lives in frameworks/:
//  - frameworks/architectures.cc: one table per architecture (`model_type`):
//    which tensors the HF checkpoint holds, their shapes from the config, and
//    the *role* of each (column-parallel, row-parallel, vocab, norm, expert, ...);
//  - one file per framework (frameworks/megatron.cc, vllm.cc, hf.cc, fsdp2.cc): what it
//    does with a role: its buffer names, dtypes, fusions and sharding, with the
//    framework's sources; frameworks/layout_builder.h what they share.
// Adding an architecture is one table; the frameworks follow from the roles.
// Adding a framework is one file (and its line in Frameworks(), layout_builder.cc).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace reshard::init {

/// What `reshard init` was asked for. `train` and `infer` are framework
/// settings such as "megatron:tp=4,pp=8,ep=16", "vllm:tp=8,dp=16,ep",
/// "fsdp2:dp_shard=8,tp=2" or "hf:tp=2"; `cluster` is empty, a built-in
/// cluster name or a file's path.
struct Request {
  nlohmann::json config;         // the HF config.json
  std::string config_file;       // its name, for messages
  std::string train, infer;
  std::string cluster;           // "", a path, or "dgx-h100" / "gb200-nvl72" (a path that exists wins)
  std::string name;              // the model spec's name; "" derives it from the config
};

/// The specs to write: file name -> JSON text (ending in a newline), in order
/// model.json, train.json, infer.json[, cluster.json]; and a few lines that say
/// what was derived (ranks, meshes, padding).
struct Result {
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::string> notes;
  /// Where the specs will not run as written, though they compile: a rank
  /// whose weights exceed the cluster's gpu_memory_GB (compiler/memory_check.h).
  std::vector<std::string> warnings;
};

/// Derives the specs. Throws reshard::Error naming the config field or the
/// option and, for a combination a framework refuses, the framework's rule.
Result Generate(const Request& req);

/// `--hf-config PATH`: reads the config.json at PATH (or PATH/config.json
/// when PATH is a directory) into req.config and req.config_file. Errors name
/// the file (and, for a syntax error, the line and column).
void ReadConfig(const std::string& path, Request& req);

/// Writes res.files into `dir` (created if missing), each file whole (a
/// temporary name, then renamed), as `reshard init -o DIR` does. Generate
/// has checked everything before: nothing is written for a bad input.
void WriteFiles(const std::string& dir, const Result& res);

/// The built-in clusters (`--cluster dgx-h100|gb200-nvl72`): name -> JSON text
/// (reshard::BuiltinClusters, compiler/clusters.cc; every --cluster takes them).
const std::vector<std::pair<std::string, std::string>>& BuiltinClusters();

/// The architectures `init` knows (`model_type` values), for help and errors.
std::vector<std::string> SupportedModelTypes();

}  // namespace reshard::init
