// reshard init: config.json + framework settings -> model, train, infer specs.
// The driver: the model spec from the architecture table, each side's layout
// from its framework (frameworks/), both parsed back before anything is
// written; the memory check when a cluster is given.
#include "compiler/init.h"

#include "compiler/expand.h"
#include "compiler/memory_check.h"
#include "compiler/spec.h"
#include "frameworks/architectures.h"
#include "frameworks/layout_builder.h"
#include "runtime/error.h"

namespace reshard::init {
namespace {

using nlohmann::ordered_json;

// One line per value, with the spacing the hand-written samples used:
// {"a": 1, "b": [1, 2]}.
std::string Compact(const ordered_json& j) {
  if (j.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      out += (first ? "" : ", ") + ordered_json(it.key()).dump() + ": " + Compact(it.value());
      first = false;
    }
    return out + "}";
  }
  if (j.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + Compact(j[i]);
    return out + "]";
  }
  return j.dump();
}

// A spec file: top-level fields one per line; lists of objects and objects of
// lists (meshes) one entry per line.
std::string Pretty(const ordered_json& j) {
  std::string out = "{\n";
  size_t k = 0;
  for (auto it = j.begin(); it != j.end(); ++it, ++k) {
    out += "  " + ordered_json(it.key()).dump() + ": ";
    const ordered_json& v = it.value();
    const bool list_of_objects = v.is_array() && !v.empty() && v[0].is_object();
    const bool object_of_lists = v.is_object() && !v.empty() && v.begin().value().is_array();
    if (list_of_objects) {
      out += "[\n";
      for (size_t i = 0; i < v.size(); ++i) out += "    " + Compact(v[i]) + (i + 1 < v.size() ? ",\n" : "\n");
      out += "  ]";
    } else if (object_of_lists) {
      out += "{\n";
      size_t i = 0;
      for (auto m = v.begin(); m != v.end(); ++m, ++i)
        out += "    " + ordered_json(m.key()).dump() + ": " + Compact(m.value()) + (i + 1 < v.size() ? ",\n" : "\n");
      out += "  }";
    } else {
      out += Compact(v);
    }
    out += k + 1 < j.size() ? ",\n" : "\n";
  }
  return out + "}\n";
}

ordered_json ModelJson(const Arch& a, const std::string& name) {
  ordered_json m;
  m["format"] = "reshard.model/1";
  m["name"] = name;
  m["dtype"] = "bf16";
  if (!a.model_notes.empty()) m["notes"] = a.model_notes;
  ordered_json dims = {{"layer", a.layers}};
  if (a.experts > 0) dims["expert"] = a.experts;
  m["dims"] = dims;
  ordered_json tensors = ordered_json::array();
  for (const auto& t : a.tensors) {
    ordered_json e = {{"name", t.name}, {"shape", t.shape}};
    if (t.fp32) e["dtype"] = "fp32";
    if (t.layers != Layers::none && t.layers != Layers::all)
      if (ordered_json r = LayerRange(a, LayerRuns(a, t.layers)); !r.is_null()) e["range"] = {{"layer", r}};
    if (t.head_dim > 0) e["heads"] = {{"dim", t.role == Role::o || t.role == Role::lin_out ? 1 : 0}, {"size", t.head_dim}};
    tensors.push_back(e);
  }
  m["tensors"] = tensors;
  return m;
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& BuiltinClusters() { return reshard::BuiltinClusters(); }

std::vector<std::string> SupportedModelTypes() { return ArchModelTypes(); }

Result Generate(const Request& req) {
  const Arch arch = ParseArch(req.config, req.config_file);
  const std::string name = req.name.empty() ? arch.name : req.name;
  Result res;
  const Settings train = ParseSettings(req.train, "--train");
  const Settings infer = ParseSettings(req.infer, "--infer");
  const ordered_json model = ModelJson(arch, name);
  const ordered_json tl = MakeLayout(arch, name, train, res.notes);
  const ordered_json il = MakeLayout(arch, name, infer, res.notes);
  // What we write must parse: a generated spec the compiler refuses is a bug here.
  const ModelSpec ms = ParseModel(nlohmann::json::parse(model.dump()), "model.json");
  const LayoutSpec ts = ParseLayout(nlohmann::json::parse(tl.dump()), "train.json", ms);
  const LayoutSpec is = ParseLayout(nlohmann::json::parse(il.dump()), "infer.json", ms);
  res.files.push_back({"model.json", Pretty(model)});
  res.files.push_back({"train.json", Pretty(tl)});
  res.files.push_back({"infer.json", Pretty(il)});
  std::vector<std::string> first = {"train: " + tl["name"].get<std::string>() + ", " +
                                        std::to_string(tl["ranks"].get<int64_t>()) + " ranks",
                                    "infer: " + il["name"].get<std::string>() + ", " +
                                        std::to_string(il["ranks"].get<int64_t>()) + " ranks"};
  first.insert(first.end(), arch.notes.begin(), arch.notes.end());  // what the config left out and was assumed
  res.notes.insert(res.notes.begin(), first.begin(), first.end());
  if (!req.cluster.empty()) {
    std::string file;
    const std::string text = ClusterText(req.cluster, "--cluster", &file);  // a file, or a bundled name
    const ClusterSpec cs = ParseCluster(ParseJson(text, file), file);
    res.files.push_back({"cluster.json", text});
    // Do the weights fit the GPUs? A warning, as `reshard compile` gives (compiler/memory_check.h).
    if (cs.gpu_memory_GB > 0) {
      for (const MemoryWarning& w :
           CheckGpuMemory(cs, ts, RankWeightBytes(Expand(ms, ts)), is, RankWeightBytes(Expand(ms, is))))
        res.warnings.push_back(w.message);
    }
  }
  return res;
}

}  // namespace reshard::init
