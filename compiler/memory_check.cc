#include "compiler/memory_check.h"

#include <algorithm>
#include <cstdio>

namespace reshard {
namespace {

std::string Gb(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, bytes >= 10000000 ? "%.2f GB" : "%.3g GB", bytes / 1e9);
  return buf;
}

std::string Limit(const ClusterSpec& c) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g GB", c.gpu_memory_GB);
  return std::string(buf) + " (" + c.file + ": /gpu_memory_GB)";
}

}  // namespace

std::vector<uint64_t> RankWeightBytes(const Expansion& e) {
  std::vector<uint64_t> out;
  out.reserve(e.ranks.size());
  for (const RankLayout& r : e.ranks) {
    uint64_t b = 0;
    for (const BufferDesc& d : r.buffers) b += static_cast<uint64_t>(d.elements()) * DtypeBytes(d.dtype);
    out.push_back(b);
  }
  return out;
}

std::vector<MemoryWarning> CheckGpuMemory(const ClusterSpec& cluster, const LayoutSpec& src,
                                          const std::vector<uint64_t>& src_bytes, const LayoutSpec& dst,
                                          const std::vector<uint64_t>& dst_bytes) {
  std::vector<MemoryWarning> out;
  if (!(cluster.gpu_memory_GB > 0)) return out;
  const uint64_t limit = static_cast<uint64_t>(cluster.gpu_memory_GB * 1e9);
  // The heaviest of `bytes` over `limit`, and how many are.
  auto worst = [limit](const std::vector<uint64_t>& bytes, MemoryWarning& w) {
    w.limit_bytes = limit;
    w.ranks = static_cast<int64_t>(bytes.size());
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (bytes[i] <= limit) continue;
      ++w.ranks_over;
      if (bytes[i] > w.bytes) w.bytes = bytes[i], w.rank = static_cast<int64_t>(i);
    }
    return w.ranks_over > 0;
  };
  if (cluster.colocated) {
    // Rank i of both sides on GPU i.
    std::vector<uint64_t> gpu(std::max(src_bytes.size(), dst_bytes.size()), 0);
    for (size_t i = 0; i < src_bytes.size(); ++i) gpu[i] += src_bytes[i];
    for (size_t i = 0; i < dst_bytes.size(); ++i) gpu[i] += dst_bytes[i];
    MemoryWarning w;
    w.side = "train+infer";
    w.layout = src.file + ", " + dst.file;
    if (!worst(gpu, w)) return out;
    const size_t g = static_cast<size_t>(w.rank);
    const uint64_t s = g < src_bytes.size() ? src_bytes[g] : 0, d = g < dst_bytes.size() ? dst_bytes[g] : 0;
    w.message = src.file + " + " + dst.file + " (colocated): GPU " + std::to_string(g) + " holds " + Gb(w.bytes) +
                " of weights (train rank " + std::to_string(g) + ": " + Gb(s) + ", infer rank " + std::to_string(g) +
                ": " + Gb(d) + "; " + std::to_string(w.bytes) + " bytes), more than its " + Limit(cluster) + "; " +
                std::to_string(w.ranks_over) + " of the " + std::to_string(w.ranks) + " GPUs do";
    out.push_back(w);
    return out;
  }
  for (int side = 0; side < 2; ++side) {
    const LayoutSpec& l = side == 0 ? src : dst;
    MemoryWarning w;
    w.side = side == 0 ? "train" : "infer";
    w.layout = l.file;
    if (!worst(side == 0 ? src_bytes : dst_bytes, w)) continue;
    w.message = l.file + " (" + l.name + "): rank " + std::to_string(w.rank) + " holds " + Gb(w.bytes) +
                " of weights (" + std::to_string(w.bytes) + " bytes), more than its GPU's " + Limit(cluster) + "; " +
                std::to_string(w.ranks_over) + " of its " + std::to_string(w.ranks) + " ranks do";
    out.push_back(w);
  }
  return out;
}

nlohmann::ordered_json MemoryWarningsJson(const std::vector<MemoryWarning>& ws) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const MemoryWarning& w : ws)
    out.push_back({{"side", w.side},
                   {"layout", w.layout},
                   {"rank", w.rank},
                   {"bytes", w.bytes},
                   {"limit_bytes", w.limit_bytes},
                   {"ranks_over", w.ranks_over},
                   {"ranks", w.ranks},
                   {"message", w.message}});
  return out;
}

}  // namespace reshard
