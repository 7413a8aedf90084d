// The clusters bundled with reshard (every `--cluster` takes their names),
// with where each figure comes from. samples/clusters/ holds the same text
// (samples/regenerate.sh writes it through `reshard init --cluster NAME`).
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "compiler/spec.h"
#include "runtime/error.h"

namespace reshard {
namespace {

// The clusters the samples ship, with where each figure comes from.
const char* kDgxH100 = R"json({
  "format": "reshard.cluster/1",
  "name": "dgx-h100",
  "gpus_per_domain": 8,
  "nic_gbps": 400,
  "nvlink_GBps": 450,
  "hbm_GBps": 3350,
  "gpu_memory_GB": 80,
  "nic_latency_us": 5.0,
  "nvlink_latency_us": 1.0,
  "placement": "disjoint",
  "sources": [
    "gpus_per_domain: NVIDIA DGX H100 datasheet - 8x NVIDIA H100 Tensor Core GPUs (SXM5) per system, joined by 4x third-generation NVSwitch",
    "nic_gbps: NVIDIA DGX H100 datasheet - 8x single-port NVIDIA ConnectX-7 VPI, up to 400 Gb/s InfiniBand/Ethernet each (one compute-fabric NIC per GPU); ConnectX-7 400G product brief",
    "nvlink_GBps: NVIDIA H100 SXM5 datasheet - fourth-generation NVLink 900 GB/s per GPU bidirectional, i.e. 450 GB/s per direction",
    "hbm_GBps: NVIDIA H100 SXM5 datasheet - 80 GB HBM3 at 3.35 TB/s",
    "gpu_memory_GB: NVIDIA H100 SXM5 datasheet - 80 GB HBM3 per GPU, taken as 80e9 bytes (a little less than the GPU reports: the check errs towards warning)",
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
  "gpu_memory_GB": 186,
  "nic_latency_us": 5.0,
  "nvlink_latency_us": 1.0,
  "placement": "disjoint",
  "infer_gpus_per_domain": 64,
  "sources": [
    "gpus_per_domain: NVIDIA GB200 NVL72 datasheet - 36 Grace CPUs and 72 Blackwell GPUs in one rack-scale NVLink domain (18 compute trays, 9 NVLink switch trays)",
    "nvlink_GBps: NVIDIA GB200 NVL72 datasheet - fifth-generation NVLink 1.8 TB/s per GPU bidirectional (130 TB/s for 72 GPUs), i.e. 900 GB/s per direction",
    "hbm_GBps: NVIDIA GB200 NVL72 datasheet - up to 13.4-13.5 TB HBM3e at 576 TB/s for 72 GPUs, i.e. 8 TB/s per GPU",
    "gpu_memory_GB: NVIDIA GB200 NVL72 datasheet - up to 13.4 TB HBM3e for 72 GPUs (up to 372 GB per GB200 superchip of 2 GPUs), i.e. 186 GB per GPU",
    "nic_gbps: NVIDIA ConnectX-7 400G - one 400 Gb/s InfiniBand/Ethernet NIC per GPU on the GB200 NVL72 compute trays (scale-out fabric)",
    "nic_latency_us, nvlink_latency_us: modelling assumptions (typical end-to-end point-to-point latency of NDR InfiniBand and of NVLink through NVLink switches, including software), not datasheet figures",
    "placement: disjoint - training ranks fill NVLink domains from global rank 0; inference ranks start on the next rack",
    "infer_gpus_per_domain: a deployment choice, not hardware - inference runs 64 GPUs of each 72-GPU rack so that TP8/TP16/TP32 groups never straddle two racks (two TP32 replicas per rack); the other 8 GPUs are spares"
  ]
}
)json";

}  // namespace

const std::vector<std::pair<std::string, std::string>>& BuiltinClusters() {
  static const std::vector<std::pair<std::string, std::string>> clusters = {{"dgx-h100", kDgxH100},
                                                                            {"gb200-nvl72", kGb200Nvl72}};
  return clusters;
}

namespace {

// What a bundled cluster is, for a name that is none of them: "'dgx-h100'
// (H100 80 GB, 8 GPUs per NVLink domain)". A suggestion never changes the GPU,
// so the list says which GPU each one has.
std::string Described(const std::string& name, const std::string& text) {
  static const std::vector<std::pair<std::string, std::string>> gpus = {{"dgx-h100", "H100"}, {"gb200-nvl72", "GB200"}};
  const nlohmann::json j = nlohmann::json::parse(text);
  std::string gpu;
  for (const auto& [n, g] : gpus)
    if (n == name) gpu = g;
  std::ostringstream out;
  out << "'" << name << "' (" << gpu << " " << j.at("gpu_memory_GB").get<double>() << " GB, "
      << j.at("gpus_per_domain").get<int64_t>() << " GPUs per NVLink domain)";
  return out.str();
}

}  // namespace

std::string ClusterText(const std::string& path_or_name, const std::string& option, std::string* file) {
  *file = path_or_name;
  std::error_code ec;
  if (!std::filesystem::exists(path_or_name, ec)) {
    std::vector<std::string> names;
    std::string listed;
    const auto& all = BuiltinClusters();
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i].first == path_or_name) return all[i].second;
      names.push_back(all[i].first);
      listed += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + Described(all[i].first, all[i].second);
    }
    throw Error(option + ": cannot open '" + path_or_name + "'; expected a reshard.cluster/1 file or a bundled cluster: " +
                listed + DidYouMeanSameKind(path_or_name, names));
  }
  if (std::filesystem::is_directory(path_or_name, ec))
    throw Error(option + ": '" + path_or_name + "' is a directory; expected dgx-h100, gb200-nvl72 or a reshard.cluster/1 file");
  std::ifstream in(path_or_name, std::ios::binary);
  if (!in) throw Error(option + ": cannot open '" + path_or_name + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace reshard
