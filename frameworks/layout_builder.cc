// What the frameworks' layouts share: the settings parser, the dispatch to
// each framework's FrameworkDef, the layout Builder and the role helpers.
// The frameworks themselves: frameworks/megatron.cc, vllm.cc, sglang.cc, hf.cc, fsdp2.cc.
#include "frameworks/layout_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "compiler/spec.h"
#include "runtime/error.h"

namespace reshard::init {

using nlohmann::ordered_json;

const std::vector<const FrameworkDef*>& Frameworks() {
  static const std::vector<const FrameworkDef*> all = {&MegatronFramework(), &VllmFramework(),
                                                        &SglangFramework(), &HfFramework(),
                                                        &Fsdp2Framework()};
  return all;
}

std::string S(int64_t x) { return std::to_string(x); }

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out;
}

[[noreturn]] void Fail(const Settings& s, const std::string& what) {
  throw Error(s.option + " '" + s.text + "': " + what);
}

std::string DidYouMean(const std::string& word, const std::vector<std::string>& candidates) {
  return reshard::DidYouMean(word, candidates, 2);  // compiler/spec.cc's, at two edits
}

int64_t PositiveInt(const Settings& s, const std::string& key, const std::string& value) {
  // Any parallel size or layer count past kMaxRanks is too large for a spec;
  // so is a number written with an exponent (1e30), which is no fraction.
  const auto too_large = [&] {
    Fail(s, "'" + key + "' is too large: expected a positive integer up to " + S(kMaxRanks) + ", got '" + value + "'");
  };
  if (!value.empty() && std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    int64_t x = 0;
    for (char c : value)
      if ((x = x * 10 + (c - '0')) > kMaxRanks) too_large();
    if (x >= 1) return x;
  } else {
    char* end = nullptr;
    const double d = std::strtod(value.c_str(), &end);
    if (!value.empty() && end == value.c_str() + value.size() && d > kMaxRanks && d == std::floor(d)) too_large();
  }
  Fail(s, "'" + key + "' expects a positive integer, got '" + value + "'");
}

// --- settings ---------------------------------------------------------------------

Settings ParseSettings(const std::string& text, const std::string& option) {
  Settings s;
  s.option = option;
  s.text = text;
  const auto colon = text.find(':');
  const std::string fw = text.substr(0, colon);
  for (const FrameworkDef* d : Frameworks())
    if (d->name == fw) s.def = d;
  if (!s.def) {
    std::string expected;
    const auto& all = Frameworks();
    for (size_t i = 0; i < all.size(); ++i)
      expected += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + all[i]->usage;
    std::vector<std::string> names;
    for (const FrameworkDef* d : all) names.push_back(d->name);
    throw Error(option + " '" + text + "': unknown framework '" + fw + "', expected " + expected + DidYouMean(fw, names));
  }
  const FrameworkDef& def = *s.def;
  if (colon == std::string::npos || colon + 1 == text.size()) {
    if (def.bare) return s;
    Fail(s, "expected " + fw + ":key=value,... (" + Join(def.keys) + ")");
  }
  std::vector<std::string> items;
  std::string rest = text.substr(colon + 1), cur;
  for (char ch : rest + ",") {
    if (ch == ',') items.push_back(cur), cur.clear();
    else cur += ch;
  }
  auto has = [](const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  std::set<std::string> seen;
  std::string list_key;  // pp-layers=3,4,4,...: bare numbers continue the list
  for (const std::string& item : items) {
    const auto eq = item.find('=');
    if (eq == std::string::npos && !list_key.empty() && !item.empty() &&
        std::all_of(item.begin(), item.end(), ::isdigit)) {
      def.set(s, list_key, item);
      continue;
    }
    list_key.clear();
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (!has(def.keys, key))
      Fail(s, "unknown option '" + key + "' for " + fw + ", expected one of " + Join(def.keys) + DidYouMean(key, def.keys));
    if (!seen.insert(key).second) Fail(s, "'" + key + "' given twice");
    const bool flag = has(def.flags, key);
    if (flag && eq != std::string::npos) Fail(s, "'" + key + "' is a flag and takes no value");
    if (!flag && eq == std::string::npos) Fail(s, "'" + key + "' needs a value (" + key + "=...)");
    def.set(s, key, value);
    if (has(def.list_keys, key)) list_key = key;
  }
  return s;
}

namespace {

// A refusal that another TP, or quant=none, may fix (FailTp).
struct TpRefusal : Error {
  TpRefusal(const std::string& what, bool quant_none) : Error(what), try_quant_none(quant_none) {}
  bool try_quant_none;
};

bool Works(const Arch& arch, const std::string& model_name, Settings s) {
  Notes ignored;
  try {
    s.def->make(arch, model_name, s, ignored);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// What fixes a TpRefusal of `given`: the TPs that work with the other
// settings as given (every framework splits the attention heads over TP, so
// the divisors of num_attention_heads), and quant=none when asked to try it;
// "" when none does.
std::string Fixes(const Arch& arch, const std::string& model_name, const Settings& given, bool try_quant_none) {
  std::vector<std::string> tps;
  for (int64_t tp = 1; tp <= std::min<int64_t>(arch.heads, 1024); ++tp) {
    if (arch.heads % tp != 0 || tp == given.tp) continue;
    Settings t = given;
    t.tp = tp;
    if (Works(arch, model_name, t)) tps.push_back("tp=" + S(tp));
  }
  bool quant_none = false;
  if (try_quant_none) {
    Settings t = given;
    t.quant = "none";
    quant_none = Works(arch, model_name, t);
  }
  std::string out;
  for (size_t i = 0; i < tps.size(); ++i) out += (i == 0 ? "" : i + 1 == tps.size() ? " or " : ", ") + tps[i];
  if (quant_none) out += (out.empty() ? "" : ", or ") + std::string("quant=none (BF16 weights)");
  return out.empty() ? "" : "; use " + out;  // nothing else fixes it alone: the message as it was
}

}  // namespace

[[noreturn]] void FailTp(const Settings& s, const std::string& what, bool try_quant_none) {
  throw TpRefusal(s.option + " '" + s.text + "': " + what, try_quant_none);
}

ordered_json MakeLayout(const Arch& arch, const std::string& model_name, Settings s, Notes& notes) {
  const Settings given = s;  // make() resolves defaults in s
  try {
    return s.def->make(arch, model_name, s, notes);
  } catch (const TpRefusal& e) {
    throw Error(e.what() + Fixes(arch, model_name, given, e.try_quant_none));
  }
}

// --- roles -------------------------------------------------------------------------

Cut CutOf(Role r) {
  switch (r) {
    case Role::embed: case Role::lm_head: return Cut::vocab;
    case Role::q: case Role::k: case Role::v: case Role::q_bias: case Role::k_bias: case Role::v_bias:
    case Role::mla_q: case Role::mla_q_b: case Role::mla_kv_b: case Role::gate: case Role::up:
    case Role::shared_gate: case Role::shared_up: case Role::sinks: case Role::q_gate: case Role::q_odd: case Role::k_odd:
    case Role::lin_q: case Role::lin_k: case Role::lin_v: case Role::lin_z: case Role::lin_b: case Role::lin_a:
    case Role::conv_q: case Role::conv_k: case Role::conv_v: case Role::lin_dt_bias: case Role::lin_a_log:
      return Cut::column;
    case Role::o: case Role::down: case Role::shared_down: case Role::lin_out: return Cut::row;
    case Role::expert_gate: case Role::expert_up: case Role::expert_gate_bias: case Role::expert_up_bias:
      return Cut::expert_column;
    case Role::expert_down: return Cut::expert_row;
    case Role::expert_down_bias: return Cut::expert_whole;
    default: return Cut::replicate;
  }
}

bool IsNorm(Role r) {
  return r == Role::input_norm || r == Role::post_norm || r == Role::final_norm || r == Role::q_norm ||
         r == Role::k_norm || r == Role::mla_q_a_norm || r == Role::mla_kv_a_norm || r == Role::lin_norm;
}

bool IsExpert(Role r) {
  return r == Role::expert_gate || r == Role::expert_up || r == Role::expert_down || r == Role::expert_gate_bias ||
         r == Role::expert_up_bias || r == Role::expert_down_bias;
}

bool IsQuantized(Role r) {
  switch (r) {
    case Role::q: case Role::k: case Role::v: case Role::o: case Role::mla_q: case Role::mla_q_a:
    case Role::mla_q_b: case Role::mla_kv_a: case Role::mla_kv_b: case Role::gate: case Role::up: case Role::down:
    case Role::expert_gate: case Role::expert_up: case Role::expert_down: case Role::shared_gate:
    case Role::shared_up: case Role::shared_down:
      return true;
    default: return false;
  }
}

Role UpOf(Role gate) {
  switch (gate) {
    case Role::gate: return Role::up;
    case Role::shared_gate: return Role::shared_up;
    case Role::expert_gate: return Role::expert_up;
    case Role::expert_gate_bias: return Role::expert_up_bias;
    default: throw Error("internal: no up part for this role");
  }
}

bool InCheckpointFusion(const Arch& a, const ArchTensor& t) {
  switch (t.role) {
    case Role::q_gate: case Role::q_odd: case Role::k_odd:
    case Role::lin_q: case Role::lin_k: case Role::lin_v: case Role::lin_z: case Role::lin_b: case Role::lin_a:
    case Role::conv_q: case Role::conv_k: case Role::conv_v:
      return true;
    case Role::q: return Find(a, Role::q_gate) || Find(a, Role::q_odd);
    case Role::k: return Find(a, Role::k_odd) != nullptr;
    default: return false;
  }
}

nlohmann::ordered_json CheckpointFusion(const Arch& a, const ArchTensor& t) {
  using nlohmann::ordered_json;
  auto name = [&](Role r) { return Find(a, r)->name; };
  auto interleave = [](int64_t groups) { return ordered_json{{"dim", 0}, {"groups", groups}}; };
  const ArchTensor* lq = Find(a, Role::lin_q);
  const int64_t key_heads = lq ? lq->shape[0] / lq->head_dim : 0;
  switch (t.role) {
    case Role::q:
      if (Find(a, Role::q_gate))  // Qwen3-Next: per head [query; gate]
        return {{"name", Rename(t.name, "q_proj.query.weight", "q_proj.weight")},
                {"parts", {t.name, name(Role::q_gate)}},
                {"interleave", interleave(a.heads)}};
      if (Find(a, Role::q_odd))  // Llama 4: each head's RoPE pairs, even row then odd
        return {{"name", Rename(t.name, "q_proj.even.weight", "q_proj.weight")},
                {"parts", {t.name, name(Role::q_odd)}},
                {"interleave", interleave(t.shape[0])}};
      return nullptr;
    case Role::k:
      if (!Find(a, Role::k_odd)) return nullptr;
      return {{"name", Rename(t.name, "k_proj.even.weight", "k_proj.weight")},
              {"parts", {t.name, name(Role::k_odd)}},
              {"interleave", interleave(t.shape[0])}};
    case Role::lin_q:  // per key head [q; k; v; z]
      return {{"name", Rename(t.name, "in_proj_qkvz.q.weight", "in_proj_qkvz.weight")},
              {"parts", {t.name, name(Role::lin_k), name(Role::lin_v), name(Role::lin_z)}},
              {"interleave", interleave(key_heads)}};
    case Role::lin_b:  // per key head [b; a]
      return {{"name", Rename(t.name, "in_proj_ba.b.weight", "in_proj_ba.weight")},
              {"parts", {t.name, name(Role::lin_a)}},
              {"interleave", interleave(key_heads)}};
    case Role::conv_q:  // [q; k; v] channels
      return {{"name", Rename(t.name, "conv1d.q.weight", "conv1d.weight")},
              {"parts", {t.name, name(Role::conv_k), name(Role::conv_v)}},
              {"concat", 0}};
    default: return nullptr;
  }
}

const ArchTensor* Find(const Arch& a, Role r) {
  for (const auto& t : a.tensors)
    if (t.role == r) return &t;
  return nullptr;
}

std::string Rename(std::string name, const std::string& from, const std::string& to) {
  auto at = name.rfind(from);
  if (at == std::string::npos) throw Error("internal: '" + from + "' not in '" + name + "'");
  return name.replace(at, from.size(), to);
}

// --- the layout being built -------------------------------------------------------------

void Builder::AddMesh(const std::string& name, std::vector<Axis> axes) {
  std::vector<Axis> kept;
  for (auto& ax : axes)
    if (ax.size > 1) kept.push_back(ax);
  if (kept.empty()) kept.push_back(axes.back());
  meshes_.push_back({name, kept});
}

bool Builder::HasAxis(const std::string& mesh, const std::string& axis) const {
  for (const auto& m : meshes_)
    if (m.first == mesh)
      for (const auto& ax : m.second)
        if (ax.name == axis) return true;
  return false;
}

void Builder::Place(const ArchTensor& t, const std::string& mesh,
                    const std::vector<std::pair<std::string, ordered_json>>& axes, const ordered_json& extra) {
  ordered_json p;
  p["match"] = t.name;
  p["mesh"] = mesh;
  for (const auto& [axis, spec] : axes)
    if (HasAxis(mesh, axis)) p[axis] = spec;
  for (auto it = extra.begin(); it != extra.end(); ++it) p[it.key()] = it.value();
  placements_.push_back(p);
}

ordered_json Builder::Finish(const std::string& name, const std::string& model, int64_t ranks, bool default_buffers,
                             const std::string& notes) {
  ordered_json j;
  j["format"] = "reshard.layout/1";
  j["name"] = name;
  j["model"] = model;
  if (!notes.empty()) j["notes"] = notes;
  j["ranks"] = ranks;
  if (!dtype_.empty()) j["dtype"] = dtype_;
  ordered_json meshes = ordered_json::object();
  for (const auto& [n, axes] : meshes_) {
    ordered_json list = ordered_json::array();
    for (const auto& ax : axes) list.push_back({ax.name, ax.size});
    meshes[n] = list;
  }
  j["meshes"] = meshes;
  j["placements"] = placements_;
  if (default_buffers) j["default_buffers"] = true;
  j["buffers"] = buffers_.is_null() ? ordered_json::array() : buffers_;
  return j;
}

ordered_json Shard(int64_t dim) { return {{"shard", dim}}; }

void AddTpAxis(const ArchTensor& t, bool kv_replicated, int64_t kv_heads, const VocabSplit& vocab,
               std::vector<std::pair<std::string, ordered_json>>& axes) {
  const Cut c = CutOf(t.role);
  const bool kv = t.role == Role::k || t.role == Role::v || t.role == Role::k_bias || t.role == Role::v_bias ||
                  t.role == Role::k_odd;
  if (c == Cut::column) {
    ordered_json ax = Shard(0);
    if (kv && kv_replicated) ax["parts"] = kv_heads;
    axes.push_back({"tp", ax});
  }
  if (c == Cut::row) axes.push_back({"tp", Shard(1)});
  if (c == Cut::vocab && !vocab.axis.is_null()) axes.push_back({"tp", vocab.axis});
}

VocabSplit SplitVocab(int64_t vocab, int64_t multiple, int64_t n) {
  VocabSplit v;
  v.padded = multiple > 0 ? (vocab + multiple - 1) / multiple * multiple : vocab;
  v.per_rank = v.padded / n;
  if (n > 1) {
    v.axis = Shard(0);
    if (v.padded != vocab) {
      ordered_json sizes = ordered_json::array();
      for (int64_t r = 0; r < n; ++r) sizes.push_back(std::clamp<int64_t>(vocab - r * v.per_rank, 0, v.per_rank));
      v.axis["sizes"] = sizes;
    }
  }
  return v;
}

// --- quantized storage ------------------------------------------------------------------

QuantFormat QuantOf(const Arch& a, const std::string& kind) {
  QuantFormat q;
  std::string qkind = kind;
  if (qkind.empty() && a.fp8_block) qkind = "fp8-block";
  if (qkind == "none") qkind.clear();
  if (!qkind.empty()) {
    q.kind = qkind;
    if (qkind == "fp8-block") {
      q.block_rows = a.fp8_block ? a.fp8_block->first : 128;
      q.block_cols = a.fp8_block ? a.fp8_block->second : 128;
      q.scale_suffix = "_scale_inv";
    } else if (qkind == "fp8-channel") {
      q.scale_suffix = "_scale";
    } else {
      q.block_rows = 1, q.block_cols = 32, q.scale_suffix = "_scale";
    }
  }
  return q;
}

ordered_json QuantJson(const QuantFormat& q, const std::string& buffer) {
  if (q.kind == "fp8-block")
    return {{"format", "fp8_e4m3"}, {"scale", "block"}, {"block", {q.block_rows, q.block_cols}},
            {"scale_name", buffer + q.scale_suffix}};
  if (q.kind == "fp8-channel") return {{"format", "fp8_e4m3"}, {"scale", "channel"}, {"scale_name", buffer + q.scale_suffix}};
  return {{"format", "mxfp8"}, {"scale_name", buffer + q.scale_suffix}};
}

}  // namespace reshard::init
