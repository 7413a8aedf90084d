#include "compiler/random_specs.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace reshard {
namespace {

using nlohmann::json;

// SplitMix64: small, fast and the same on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int64_t Int(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1)); }
  bool Chance(int percent) { return Int(0, 99) < percent; }
  template <class T>
  const T& Pick(const std::vector<T>& v) { return v[Next() % v.size()]; }

 private:
  uint64_t s_;
};

struct Family {
  std::string name;
  std::vector<std::string> stack;  // dim names
  std::vector<int64_t> shape;
  int group = -1;                  // fused pair id
};

// Axis sizes multiplying to `ranks`.
std::vector<std::pair<std::string, int64_t>> RandomMesh(Rng& rng, int64_t ranks, const std::string& prefix) {
  std::vector<int64_t> sizes;
  int64_t rem = ranks;
  for (int64_t f : {2, 3, 2, 2}) {
    while (rem % f == 0 && rng.Chance(60)) {
      if (!sizes.empty() && rng.Chance(50)) sizes.back() *= f;
      else sizes.push_back(f);
      rem /= f;
    }
  }
  if (rem > 1) sizes.push_back(rem);
  if (sizes.empty() || rng.Chance(20)) sizes.insert(sizes.begin() + rng.Int(0, static_cast<int64_t>(sizes.size())), 1);
  std::vector<std::pair<std::string, int64_t>> axes;
  for (size_t i = 0; i < sizes.size(); ++i) axes.emplace_back(prefix + std::to_string(i), sizes[i]);
  return axes;
}

json AxisJson(const std::vector<std::pair<std::string, int64_t>>& axes) {
  json a = json::array();
  for (auto& [n, s] : axes) a.push_back({n, s});
  return a;
}

// Placement of one family (or fused pair) on one mesh.
json RandomPlacement(Rng& rng, const Family& f, const std::map<std::string, int64_t>& dims,
                     const std::vector<std::pair<std::string, int64_t>>& axes, bool source, int64_t& plain_dim0) {
  json p = json::object();
  int nd = static_cast<int>(f.stack.size() + f.shape.size());
  std::vector<int64_t> local(nd);
  for (int d = 0; d < nd; ++d)
    local[d] = d < static_cast<int>(f.stack.size()) ? dims.at(f.stack[d]) : f.shape[d - f.stack.size()];
  std::vector<bool> closed(nd, false);
  plain_dim0 = 1;
  bool used_at = false;
  for (auto& [axis, n] : axes) {
    int roll = static_cast<int>(rng.Int(0, 99));
    if (roll < 35 || n == 1) continue;  // replicate
    if (roll < 43 && !used_at) {
      used_at = true;
      int64_t at = rng.Chance(30) ? -1 : rng.Int(0, n - 1);
      p[axis] = {{"at", at}};
      continue;
    }
    int d = static_cast<int>(rng.Int(0, nd - 1));
    if (closed[d]) continue;
    int64_t L = local[d];
    json spec;
    if (d < static_cast<int>(f.stack.size())) spec["shard"] = f.stack[d];
    else spec["shard"] = d - static_cast<int>(f.stack.size());
    bool fused_dim0 = f.group >= 0 && d == static_cast<int>(f.stack.size());
    int kind = static_cast<int>(rng.Int(0, 5));
    if (fused_dim0) kind = 0;  // interleave groups need whole-group shards
    if (kind == 0 && L % n == 0) {
      local[d] = L / n;
      if (d == static_cast<int>(f.stack.size())) plain_dim0 *= n;
    } else if (kind == 1 || (kind == 0 && L % n != 0)) {
      if (fused_dim0) continue;
      std::vector<int64_t> sizes(n, 0);
      for (int64_t i = 0; i < L; ++i) ++sizes[rng.Int(0, n - 1)];
      spec["sizes"] = sizes;
      closed[d] = true;
    } else if (kind == 2) {
      std::vector<int64_t> ks;
      for (int64_t k = 2; k <= L; ++k)
        if (L % k == 0 && (L / k) % n == 0) ks.push_back(k);
      if (ks.empty()) continue;
      spec["blocks"] = rng.Pick(ks);
      closed[d] = true;
    } else if (kind == 3) {
      spec["cyclic"] = rng.Int(1, 2);
      closed[d] = true;
    } else if (kind == 4) {
      std::vector<int64_t> ps;
      for (int64_t q = 1; q < n; ++q)
        if (n % q == 0 && L % q == 0) ps.push_back(q);
      if (ps.empty()) continue;
      spec["parts"] = rng.Pick(ps);
      closed[d] = true;
    } else {
      std::vector<std::vector<int64_t>> assign(n);
      if (source)
        for (int64_t i = 0; i < L; ++i) assign[rng.Int(0, n - 1)].push_back(i);
      for (int64_t pos = 0; pos < n; ++pos)
        if (assign[pos].empty() || rng.Chance(30)) assign[pos].push_back(rng.Int(0, L - 1));
      for (auto& a : assign) {
        std::sort(a.begin(), a.end());
        a.erase(std::unique(a.begin(), a.end()), a.end());
      }
      spec["assign"] = assign;
      closed[d] = true;
    }
    p[axis] = spec;
  }
  return p;
}

json RandomLayout(Rng& rng, const std::string& name, const std::vector<Family>& fams,
                  const std::map<std::string, int64_t>& dims, bool source, bool rename_all) {
  int64_t ranks = rng.Pick(std::vector<int64_t>{1, 2, 3, 4, 4, 6, 8, 8, 12});
  json l;
  l["format"] = "reshard.layout/1";
  l["name"] = name;
  l["ranks"] = ranks;
  std::vector<std::vector<std::pair<std::string, int64_t>>> meshes = {RandomMesh(rng, ranks, "a")};
  if (rng.Chance(50)) meshes.push_back(RandomMesh(rng, ranks, "b"));
  l["meshes"] = json::object();
  for (size_t m = 0; m < meshes.size(); ++m) l["meshes"]["m" + std::to_string(m)] = AxisJson(meshes[m]);
  l["placements"] = json::array();
  l["buffers"] = json::array();
  l["default_buffers"] = true;  // random rules name some tensors; the rest keep the model's names
  std::map<int, json> group_rule;
  for (size_t i = 0; i < fams.size(); ++i) {
    const Family& f = fams[i];
    json rule;
    int64_t plain0 = 1;
    if (f.group >= 0 && group_rule.count(f.group)) {
      rule = group_rule[f.group];
      rule["match"] = f.name;
    } else {
      size_t m = static_cast<size_t>(rng.Int(0, static_cast<int64_t>(meshes.size()) - 1));
      rule = RandomPlacement(rng, f, dims, meshes[m], source, plain0);
      rule["match"] = f.name;
      rule["mesh"] = "m" + std::to_string(m);
      rule["_plain0"] = plain0;
      if (f.group >= 0) group_rule[f.group] = rule;
    }
    json clean = rule;
    clean.erase("_plain0");
    l["placements"].push_back(clean);
  }
  // Fused pairs and renamed buffers.
  for (size_t i = 0; i < fams.size(); ++i) {
    const Family& f = fams[i];
    std::string tmpl = name + ".buf" + std::to_string(i);
    for (const auto& s : f.stack) {
      if (s == "expert" && rng.Chance(50)) continue;  // kept as a leading physical dim
      tmpl += rng.Chance(50) ? ".{" + s + "}" : ".{" + s + ".local}";
    }
    if (f.group >= 0) {
      if (i + 1 < fams.size() && fams[i + 1].group == f.group) {
        json b = {{"name", tmpl}, {"parts", {f.name, fams[i + 1].name}}};
        int64_t plain0 = group_rule[f.group]["_plain0"];
        int64_t a = f.shape[0];
        std::vector<int64_t> gs;
        for (int64_t g = plain0; g <= a; g += plain0)
          if (a % g == 0 && g % plain0 == 0) gs.push_back(g);
        if (!gs.empty() && rng.Chance(50)) b["interleave"] = {{"dim", 0}, {"groups", rng.Pick(gs)}};
        else b["concat"] = static_cast<int64_t>(rng.Int(0, static_cast<int64_t>(f.shape.size()) - 1));
        l["buffers"].push_back(b);
      }
      continue;
    }
    if (rename_all || rng.Chance(40)) {
      json b = {{"name", tmpl}, {"parts", {f.name}}};
      if (rng.Chance(40)) {
        std::vector<int64_t> padded = f.shape;
        padded.back() += rng.Int(1, 3);
        b["shape"] = padded;
      }
      l["buffers"].push_back(b);
    }
  }
  l["placements"].push_back({{"match", "*"}, {"mesh", "m0"}});
  return l;
}

}  // namespace

RandomSpecs MakeRandomSpecs(uint64_t seed) {
  Rng rng(seed);
  RandomSpecs r;
  std::map<std::string, int64_t> dims;
  dims["layer"] = rng.Int(1, 5);
  bool experts = rng.Chance(60);
  if (experts) dims["expert"] = rng.Int(2, 6);
  std::vector<int64_t> sizes = {4, 6, 8, 12, 16, 24};
  std::vector<Family> fams;
  int nf = static_cast<int>(rng.Int(2, 5));
  int group = 0;
  for (int i = 0; i < nf; ++i) {
    Family f;
    int kind = static_cast<int>(rng.Int(0, experts ? 4 : 3));
    if (kind == 0) f.shape = {rng.Pick(sizes)};
    else if (kind == 1) f.stack = {"layer"}, f.shape = {rng.Pick(sizes)};
    else if (kind == 2 || kind == 3) f.stack = {"layer"}, f.shape = {rng.Pick(sizes), rng.Pick(sizes)};
    else f.stack = {"layer", "expert"}, f.shape = {rng.Pick(sizes), rng.Pick(sizes)};
    std::string base = "t" + std::to_string(i);
    f.name = "model";
    for (const auto& s : f.stack) f.name.append(".").append(s, 0, 1).append("{").append(s).append("}");
    f.name += "." + base;
    if (f.shape.size() == 2 && rng.Chance(35)) {
      f.group = group++;
      Family g = f;
      g.name = f.name + "_b";
      f.name += "_a";
      fams.push_back(f);
      fams.push_back(g);
    } else {
      fams.push_back(f);
    }
  }
  r.model = {{"format", "reshard.model/1"}, {"name", "random-" + std::to_string(seed)}, {"dtype", "bf16"}};
  r.model["dims"] = json::object();
  for (auto& [k, v] : dims) r.model["dims"][k] = v;
  r.model["tensors"] = json::array();
  bool ranged_group = false;
  json range_group;
  for (size_t i = 0; i < fams.size(); ++i) {
    const Family& f = fams[i];
    json t = {{"name", f.name}, {"shape", f.shape}};
    if (f.group < 0 && rng.Chance(15)) t["dtype"] = "fp32";
    bool second = i > 0 && f.group >= 0 && fams[i - 1].group == f.group;
    bool ranged = second ? ranged_group
                         : (!f.stack.empty() && f.stack[0] == "layer" && dims["layer"] > 2 && rng.Chance(25));
    ranged_group = ranged;
    // One interval, or two apart (a hybrid model's layers of one kind); a
    // fused pair's parts exist for the same layers.
    if (ranged && !second)
      range_group = dims["layer"] > 3 && rng.Chance(50)
                        ? json::array({json::array({0, 1}), json::array({2, dims["layer"]})})
                        : json::array({1, dims["layer"]});
    if (ranged) t["range"] = {{"layer", range_group}};
    r.model["tensors"].push_back(t);
  }
  bool colocated = rng.Chance(20);
  r.train = RandomLayout(rng, "train", fams, dims, true, false);
  r.infer = RandomLayout(rng, "infer", fams, dims, false, colocated);
  r.cluster = {{"format", "reshard.cluster/1"}, {"name", "random"}, {"gpus_per_domain", rng.Pick(std::vector<int64_t>{2, 4, 8})},
               {"nic_gbps", 400}, {"nvlink_GBps", 450}};
  if (colocated && r.infer["ranks"].get<int64_t>() <= r.train["ranks"].get<int64_t>())
    r.cluster["placement"] = "colocated";
  return r;
}

RandomSpecs MakeRandomQuantSpecs(uint64_t seed) {
  RandomSpecs r = MakeRandomSpecs(seed);
  Rng rng(seed ^ 0x51554E54ull);
  std::map<std::string, size_t> ndim;  // model tensor -> dims of its shape (beyond stack dims)
  for (const json& t : r.model["tensors"]) ndim[t["name"]] = t["shape"].size();
  auto quant = [&](const std::string& name) {
    json q = {{"scale_name", name + "_scale"}};
    switch (rng.Int(0, 5)) {
      case 0:
        q["format"] = "mxfp8";
        break;
      case 1:
        q["format"] = "fp8_e4m3", q["scale"] = "channel";
        break;
      case 2:
      case 3:
        q["format"] = "fp8_e4m3", q["scale"] = "tensor";
        break;
      default:
        q["format"] = "fp8_e4m3", q["scale"] = "block";
        q["block"] = {rng.Pick(std::vector<int64_t>{1, 2, 4, 8, 16}), rng.Pick(std::vector<int64_t>{2, 4, 8, 16, 32})};
    }
    return q;
  };
  // A quantized dim must be one piece per rank: no "blocks", "cyclic" or "assign" shards of the tensor's own dims.
  auto eligible_in = [&](const json& layout, const std::string& name) {
    if (ndim[name] != 2) return false;
    for (const json& rule : layout["placements"]) {
      if (rule["match"] != name && rule["match"] != "*") continue;
      for (const auto& [axis, how] : rule.items())
        if (how.is_object() && how.value("shard", json()).is_number() &&
            (how.contains("blocks") || how.contains("cyclic") || how.contains("assign")))
          return false;
      return true;
    }
    return true;
  };
  auto quantize = [&](json& layout, int percent) {
    std::map<std::string, bool> ruled;
    json& buffers = layout["buffers"];
    for (json& b : buffers) {
      bool two_d = true;
      for (const json& part : b.value("parts", json::array({b.value("tensor", "")}))) {
        ruled[part] = true;
        two_d = two_d && eligible_in(layout, part);
      }
      if (two_d && !b.contains("interleave") && !b.contains("shape") && rng.Chance(percent))
        b["quant"] = quant(b["name"]);
    }
    for (const auto& [name, n] : ndim)
      if (!ruled[name] && eligible_in(layout, name) && rng.Chance(percent))
        buffers.push_back({{"name", name}, {"tensor", name}, {"quant", quant(name)}});
  };
  quantize(r.infer, 60);
  // FP8 training weights too (dequantized by their senders), but not colocated:
  // a GPU holding a tensor quantized on both sides is refused.
  if (!r.cluster.contains("placement") && rng.Chance(50)) quantize(r.train, 70);
  return r;
}

RandomSpecs MakeRandomTransformSpecs(uint64_t seed) {
  RandomSpecs r = MakeRandomSpecs(seed);
  Rng rng(seed ^ 0x5846524Dull);
  const std::vector<double> offsets = {-1, 1, 0.5, -2};
  auto transform = [&](json& layout) {
    std::map<std::string, bool> ruled;
    for (json& b : layout["buffers"]) {
      for (const json& part : b.value("parts", json::array({b.value("tensor", "")}))) ruled[part] = true;
      if (rng.Chance(50)) b["transform"] = {{"offset", rng.Pick(offsets)}};
    }
    for (const json& t : r.model["tensors"])
      if (!ruled[t["name"]] && rng.Chance(40))
        layout["buffers"].push_back({{"name", t["name"]}, {"tensor", t["name"]},
                                     {"transform", {{"offset", rng.Pick(offsets)}}}});
  };
  transform(r.train);
  transform(r.infer);
  return r;
}

}  // namespace reshard
