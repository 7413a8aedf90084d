#include "compiler/state_dict_check.h"

#include <algorithm>
#include <map>
#include <set>

#include "frameworks/torch_wrappers.h"
#include "runtime/error.h"

namespace reshard {

using nlohmann::json;

std::optional<Dtype> TorchDtype(const std::string& name) {
  std::string n = name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
  static const std::map<std::string, Dtype> kNames = {
      {"bfloat16", Dtype::bf16},     {"bf16", Dtype::bf16},           {"float16", Dtype::fp16},
      {"half", Dtype::fp16},         {"fp16", Dtype::fp16},           {"float32", Dtype::fp32},
      {"float", Dtype::fp32},        {"fp32", Dtype::fp32},           {"float8_e4m3fn", Dtype::fp8_e4m3},
      {"fp8_e4m3", Dtype::fp8_e4m3}, {"float8_e8m0fnu", Dtype::e8m0}, {"e8m0", Dtype::e8m0}};
  auto it = kNames.find(n);
  if (it == kNames.end()) return std::nullopt;
  return it->second;
}

const char* DiffKindString(DiffKind k) {
  switch (k) {
    case DiffKind::missing:
      return "missing";
    case DiffKind::extra:
      return "extra";
    case DiffKind::wrong_shape:
      return "wrong shape";
    case DiffKind::wrong_dtype:
      return "wrong dtype";
    case DiffKind::undeclared_view:
      return "undeclared view";
  }
  return "?";
}

std::string DescribeBuffer(const std::string& dtype, const std::vector<int64_t>& shape) {
  std::string s = dtype + "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

[[noreturn]] void Fail(const std::string& file, const std::string& path, const std::string& msg) {
  throw Error(file + ": " + (path.empty() ? "/" : path) + ": " + msg);
}

std::string Kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number with a fraction";
    default:
      return "a number";
  }
}

const json& Field(const json& obj, const std::string& file, const std::string& path, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) Fail(file, path, std::string("missing required field '") + key + "'");
  return *it;
}

RankDump ParseRank(const json& j, const std::string& file, const std::string& path) {
  if (!j.is_object()) Fail(file, path, "expected an object {\"rank\": R, \"params\": [...]}, got " + Kind(j));
  RankDump d;
  d.file = file;
  d.path = path;
  const json& rank = Field(j, file, path, "rank");
  if (!rank.is_number_integer() || rank.get<int64_t>() < 0)
    Fail(file, path + "/rank",
         "expected an integer >= 0, got " + (rank.is_number_integer() ? rank.dump() : Kind(rank)));
  d.rank = rank.get<int64_t>();
  if (auto fw = j.find("framework"); fw != j.end()) {
    if (!fw->is_string()) Fail(file, path + "/framework", "expected a string such as \"vLLM 0.33.0\", got " + Kind(*fw));
    d.framework = fw->get<std::string>();
  }
  const json& params = Field(j, file, path, "params");
  if (!params.is_array()) Fail(file, path + "/params", "expected an array, got " + Kind(params));
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    std::string pp = path + "/params/" + std::to_string(i);
    const json& p = params[i];
    if (!p.is_object()) Fail(file, pp, "expected an object {\"name\", \"dtype\", \"shape\"}, got " + Kind(p));
    DumpParam dp;
    const json& name = Field(p, file, pp, "name");
    if (!name.is_string() || name.get<std::string>().empty())
      Fail(file, pp + "/name", "expected a non-empty string, got " + (name.is_string() ? "\"\"" : Kind(name)));
    // Wrapper segments (activation checkpointing, torch.compile, FSDP1) are
    // not part of the weights' names (frameworks/torch_wrappers.h).
    dp.name = WithoutWrapperSegments(name.get<std::string>());
    const json& dtype = Field(p, file, pp, "dtype");
    if (!dtype.is_string())
      Fail(file, pp + "/dtype", "expected a string such as \"torch.bfloat16\", got " + Kind(dtype));
    dp.dtype_name = dtype.get<std::string>();
    dp.dtype = TorchDtype(dp.dtype_name);
    const json& shape = Field(p, file, pp, "shape");
    if (!shape.is_array()) Fail(file, pp + "/shape", "expected an array of sizes, got " + Kind(shape));
    for (size_t k = 0; k < shape.size(); ++k) {
      if (!shape[k].is_number_integer() || shape[k].get<int64_t>() < 0)
        Fail(file, pp + "/shape/" + std::to_string(k),
             "expected an integer >= 0, got " + (shape[k].is_number_integer() ? shape[k].dump() : Kind(shape[k])));
      dp.shape.push_back(shape[k].get<int64_t>());
    }
    if (p.contains("stride")) {
      const json& stride = p["stride"];
      if (!stride.is_array() || stride.size() != dp.shape.size())
        Fail(file, pp + "/stride", "expected " + std::to_string(dp.shape.size()) +
                                       " strides (one per shape dim), got " + (stride.is_array() ? stride.dump() : Kind(stride)));
      for (size_t k = 0; k < stride.size(); ++k) {
        if (!stride[k].is_number_integer() || stride[k].get<int64_t>() < 0)
          Fail(file, pp + "/stride/" + std::to_string(k),
               "expected an integer >= 0, got " + (stride[k].is_number_integer() ? stride[k].dump() : Kind(stride[k])));
        dp.stride.push_back(stride[k].get<int64_t>());
      }
    }
    auto [it, fresh] = seen.emplace(dp.name, i);
    if (!fresh)
      Fail(file, pp + "/name",
           "parameter '" + dp.name + "' is listed twice (also at " + path + "/params/" + std::to_string(it->second) +
               ")");
    d.params.push_back(std::move(dp));
  }
  return d;
}

// The shape of the row-major memory behind a parameter whose strides are a
// permutation of a contiguous layout's (dims in decreasing stride order);
// nullopt when it has no strides or they are not such a permutation.
std::optional<std::vector<int64_t>> StorageShape(const DumpParam& p) {
  if (p.stride.empty()) return std::nullopt;
  std::vector<size_t> order(p.shape.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p.stride[a] > p.stride[b]; });
  std::vector<int64_t> storage;
  int64_t expect = 1;
  for (size_t i = order.size(); i-- > 0;) {
    if (p.shape[order[i]] != 1 && p.stride[order[i]] != expect) return std::nullopt;
    expect *= p.shape[order[i]];
  }
  for (size_t k : order) storage.push_back(p.shape[k]);
  return storage;
}

// Strides in decreasing order: the parameter is its own memory, not a view.
bool StorageIsInOrder(const DumpParam& p) {
  for (size_t k = 1; k < p.stride.size(); ++k)
    if (p.shape[k - 1] != 1 && p.shape[k] != 1 && p.stride[k - 1] < p.stride[k]) return false;
  return true;
}

std::string Ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// "fp32 (torch.float32)", or the dump's own name when reshard has no such dtype.
std::string DumpDtype(const DumpParam& p) {
  if (!p.dtype || p.dtype_name == DtypeString(*p.dtype)) return p.dtype_name;
  return std::string(DtypeString(*p.dtype)) + " (" + p.dtype_name + ")";
}

}  // namespace

std::vector<RankDump> ParseStateDictDump(const json& j, const std::string& file) {
  std::vector<RankDump> out;
  if (j.is_array()) {
    if (j.empty()) Fail(file, "", "the dump lists no ranks");
    for (size_t i = 0; i < j.size(); ++i) out.push_back(ParseRank(j[i], file, "/" + std::to_string(i)));
  } else if (j.is_object()) {
    out.push_back(ParseRank(j, file, ""));
  } else {
    Fail(file, "", "expected a rank's object {\"rank\": R, \"params\": [...]} or a list of them, got " + Kind(j));
  }
  return out;
}

std::vector<RankDump> LoadStateDictDumps(const std::vector<std::string>& files) {
  std::vector<RankDump> out;
  std::map<int64_t, std::string> where;
  for (const auto& f : files) {
    for (RankDump& d : ParseStateDictDump(LoadJson(f), f)) {
      auto [it, fresh] = where.emplace(d.rank, d.where());
      if (!fresh)
        throw Error(d.file + ": " + d.path + "/rank: rank " + std::to_string(d.rank) + " is dumped twice (also " +
                    it->second + ")");
      out.push_back(std::move(d));
    }
  }
  return out;
}

StateDictReport CheckStateDict(const LayoutSpec& layout, const Expansion& expansion, const std::vector<RankDump>& dumps,
                               std::optional<int64_t> rank) {
  StateDictReport rep;
  std::vector<const RankDump*> todo;
  for (const RankDump& d : dumps) {
    if (d.rank >= static_cast<int64_t>(expansion.ranks.size()))
      throw Error(d.file + ": " + d.path + "/rank: rank " + std::to_string(d.rank) + " is not a rank of layout '" +
                  layout.name + "' (" + layout.file + " has " + std::to_string(expansion.ranks.size()) + " ranks)");
    if (!rank || d.rank == *rank) todo.push_back(&d);
  }
  if (rank && todo.empty()) {
    std::string have;
    for (const RankDump& d : dumps) have += (have.empty() ? "" : ", ") + std::to_string(d.rank);
    throw Error("--rank " + std::to_string(*rank) + ": the dump has no rank " + std::to_string(*rank) + " (it has " +
                have + ")");
  }
  std::sort(todo.begin(), todo.end(), [](const RankDump* a, const RankDump* b) { return a->rank < b->rank; });
  for (const RankDump* d : todo) {
    rep.ranks.push_back(d->rank);
    const RankLayout& rl = expansion.ranks[d->rank];
    rep.layout_buffers += static_cast<int64_t>(rl.buffers.size());
    rep.dump_params += static_cast<int64_t>(d->params.size());
    std::map<std::string, const DumpParam*> by_name;
    for (const DumpParam& p : d->params) by_name.emplace(p.name, &p);
    std::set<std::string> claimed;
    std::string head = "rank " + std::to_string(d->rank) + ": ";
    for (const BufferDesc& b : rl.buffers) {
      claimed.insert(b.name);
      std::string mine = DescribeBuffer(DtypeString(b.dtype), b.shape);
      auto it = by_name.find(b.name);
      if (it == by_name.end()) {
        rep.diffs.push_back(
            {d->rank, DiffKind::missing, b.name, mine, "",
             head + "missing: " + b.name + " " + mine + ": the layout binds it, the dump does not have it"});
        continue;
      }
      const DumpParam& p = *it->second;
      std::string theirs = DescribeBuffer(p.dtype ? DtypeString(*p.dtype) : p.dtype_name, p.shape);
      const std::optional<std::vector<int64_t>> storage = StorageShape(p);
      // A permuted view of the layout's memory, square ones included: the
      // memory is what a refit writes, and the Python binding binds it in
      // place only where the layout declares the buffer held transposed.
      const bool view = storage && *storage == b.shape && !(p.shape == b.shape && StorageIsInOrder(p));
      const bool transposed = view && p.shape.size() == 2 && p.shape[0] == b.shape[1] && p.shape[1] == b.shape[0];
      if (view && transposed && b.held_transposed)
        rep.views.push_back(head + "view: " + b.name + ": the dump has " + theirs + " with strides " + Ints(p.stride) +
                            ", the transposed view of the layout's row-major " + mine +
                            " the layout declares (\"held\": \"transposed\"): binding it binds the memory");
      else if (view)
        rep.diffs.push_back(
            {d->rank, DiffKind::undeclared_view, b.name, mine, theirs,
             head + "undeclared view: " + b.name + ": the dump has " + theirs + " with strides " + Ints(p.stride) +
                 ", a permuted view of the layout's row-major " + mine + "; " +
                 (transposed ? "declare it in the layout (\"held\": \"transposed\" in its buffer rule), or the "
                               "binding copies through the view"
                             : "only 2-D transposed views can be declared held")});
      else if (p.shape != b.shape)
        rep.diffs.push_back(
            {d->rank, DiffKind::wrong_shape, b.name, mine, theirs,
             head + "wrong shape: " + b.name + ": the layout says " + mine + ", the dump has " + theirs});
      if (p.dtype != b.dtype)
        rep.diffs.push_back({d->rank, DiffKind::wrong_dtype, b.name, mine, theirs,
                             head + "wrong dtype: " + b.name + ": the layout says " + DtypeString(b.dtype) +
                                 ", the dump has " + DumpDtype(p)});
    }
    for (const DumpParam& p : d->params) {
      if (claimed.count(p.name)) continue;
      std::string theirs = DescribeBuffer(p.dtype ? DtypeString(*p.dtype) : p.dtype_name, p.shape);
      if (std::optional<EngineTensor> e = FindEngineTensor(d->framework, p.name)) {
        std::string msg = head + "engine: " + p.name + " " + theirs + ": " + EngineTensorKindString(e->kind) + " of " +
                          e->framework + (e->from.empty() ? "" : ", from " + e->from) + ": " + e->reason;
        rep.engine.push_back({d->rank, p.name, theirs, *e, std::move(msg)});
        continue;
      }
      rep.diffs.push_back(
          {d->rank, DiffKind::extra, p.name, "", theirs,
           head + "extra: " + p.name + " " + theirs + ": the dump has it, the layout does not bind it"});
    }
  }
  return rep;
}

}  // namespace reshard
