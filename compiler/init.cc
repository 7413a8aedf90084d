// reshard init: config.json + framework settings -> model, train, infer specs.
// The driver: the model spec from the architecture table, each side's layout
// from its framework (frameworks/), both parsed back before anything is
// written; the built-in clusters.
#include "compiler/init.h"

#include <fstream>
#include <sstream>

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
  ordered_json dims = {{"layer", a.layers}};
  if (a.experts > 0) dims["expert"] = a.experts;
  m["dims"] = dims;
  ordered_json tensors = ordered_json::array();
  for (const auto& t : a.tensors) {
    ordered_json e = {{"name", t.name}, {"shape", t.shape}};
    if (t.fp32) e["dtype"] = "fp32";
    if (t.layers == Layers::dense && a.first_moe < a.layers) e["range"] = {{"layer", {0, a.first_moe}}};
    if (t.layers == Layers::moe && a.first_moe > 0) e["range"] = {{"layer", {a.first_moe, a.layers}}};
    if (t.head_dim > 0) e["heads"] = {{"dim", t.role == Role::o ? 1 : 0}, {"size", t.head_dim}};
    tensors.push_back(e);
  }
  m["tensors"] = tensors;
  return m;
}

// The clusters the samples ship, with where each figure comes from.
const char* kDgxH100 = R"json({
  "format": "reshard.cluster/1",
  "name": "dgx-h100",
  "gpus_per_domain": 8,
  "nic_gbps": 400,
  "nvlink_GBps": 450,
  "hbm_GBps": 3350,
  "nic_latency_us": 5.0,
  "nvlink_latency_us": 1.0,
  "placement": "disjoint",
  "sources": [
    "gpus_per_domain: NVIDIA DGX H100 datasheet - 8x NVIDIA H100 Tensor Core GPUs (SXM5) per system, joined by 4x third-generation NVSwitch",
    "nic_gbps: NVIDIA DGX H100 datasheet - 8x single-port NVIDIA ConnectX-7 VPI, up to 400 Gb/s InfiniBand/Ethernet each (one compute-fabric NIC per GPU); ConnectX-7 400G product brief",
    "nvlink_GBps: NVIDIA H100 SXM5 datasheet - fourth-generation NVLink 900 GB/s per GPU bidirectional, i.e. 450 GB/s per direction",
    "hbm_GBps: NVIDIA H100 SXM5 datasheet - 80 GB HBM3 at 3.35 TB/s",
    "nic_latency_us, nvlink_latency_us: modelling assumptions (typical end-to-end point-to-point latency of NDR InfiniBand and of NVLink through NVSwitch, including software), not datasheet figures",
    "placement: disjoint - training ranks fill NVLink domains from global rank 0, inference ranks follow"
  ]
}
)json";

const char* kGb200Nvl72 = R"json({
  "format": "reshard.cluster/1",
  "name": "gb200-nvl72",
  "gpus_per_domain": 72,
  "nic_gbps": 400,
  "nvlink_GBps": 900,
  "hbm_GBps": 8000,
  "nic_latency_us": 5.0,
  "nvlink_latency_us": 1.0,
  "placement": "disjoint",
  "infer_gpus_per_domain": 64,
  "sources": [
    "gpus_per_domain: NVIDIA GB200 NVL72 datasheet - 36 Grace CPUs and 72 Blackwell GPUs in one rack-scale NVLink domain (18 compute trays, 9 NVLink switch trays)",
    "nvlink_GBps: NVIDIA GB200 NVL72 datasheet - fifth-generation NVLink 1.8 TB/s per GPU bidirectional (130 TB/s for 72 GPUs), i.e. 900 GB/s per direction",
    "hbm_GBps: NVIDIA GB200 NVL72 datasheet - up to 13.4-13.5 TB HBM3e at 576 TB/s for 72 GPUs, i.e. 8 TB/s per GPU",
    "nic_gbps: NVIDIA ConnectX-7 400G - one 400 Gb/s InfiniBand/Ethernet NIC per GPU on the GB200 NVL72 compute trays (scale-out fabric)",
    "nic_latency_us, nvlink_latency_us: modelling assumptions (typical end-to-end point-to-point latency of NDR InfiniBand and of NVLink through NVLink switches, including software), not datasheet figures",
    "placement: disjoint - training ranks fill NVLink domains from global rank 0; inference ranks start on the next rack",
    "infer_gpus_per_domain: a deployment choice, not hardware - inference runs 64 GPUs of each 72-GPU rack so that TP8/TP16/TP32 groups never straddle two racks (two TP32 replicas per rack); the other 8 GPUs are spares"
  ]
}
)json";

std::string ReadFile(const std::string& path, const std::string& option) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(option + ": cannot open '" + path + "'; expected dgx-h100, gb200-nvl72 or a reshard.cluster/1 file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& BuiltinClusters() {
  static const std::vector<std::pair<std::string, std::string>> clusters = {{"dgx-h100", kDgxH100},
                                                                            {"gb200-nvl72", kGb200Nvl72}};
  return clusters;
}

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
  ParseLayout(nlohmann::json::parse(tl.dump()), "train.json", ms);
  ParseLayout(nlohmann::json::parse(il.dump()), "infer.json", ms);
  res.files.push_back({"model.json", Pretty(model)});
  res.files.push_back({"train.json", Pretty(tl)});
  res.files.push_back({"infer.json", Pretty(il)});
  res.notes.insert(res.notes.begin(), {"train: " + tl["name"].get<std::string>() + ", " +
                                           std::to_string(tl["ranks"].get<int64_t>()) + " ranks",
                                       "infer: " + il["name"].get<std::string>() + ", " +
                                           std::to_string(il["ranks"].get<int64_t>()) + " ranks"});
  if (!req.cluster.empty()) {
    std::string text;
    for (const auto& [n, t] : BuiltinClusters())
      if (n == req.cluster) text = t;
    if (text.empty()) text = ReadFile(req.cluster, "--cluster");
    ParseCluster(ParseJson(text, req.cluster), req.cluster);
    res.files.push_back({"cluster.json", text});
  }
  return res;
}

}  // namespace reshard::init
