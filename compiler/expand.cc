#include "compiler/expand.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <unordered_map>

#include "compiler/on_threads.h"
#include "runtime/error.h"

namespace reshard {

int64_t BufferDesc::elements() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

StridedRegion Fragment::RegionOf(const Box& sub) const {
  StridedRegion r;
  r.ndim = sub.ndim;
  int64_t buf = buffer;
  int64_t off = static_cast<int64_t>(offset);
  for (int d = 0; d < sub.ndim; ++d) {
    int64_t delta = (sub.lo[d] - box.lo[d]) * stride[d];
    if (buffer_dims >> d & 1) buf += delta, r.buffer_modes |= 1u << d;
    else off += delta;
    r.shape[d] = sub.extent(d);
    r.stride[d] = stride[d];
  }
  r.buffer = static_cast<uint32_t>(buf);
  r.offset = static_cast<uint64_t>(off);
  return r;
}

std::vector<int64_t> MeshCoords(const Mesh& mesh, int64_t rank) {
  std::vector<int64_t> c(mesh.axes.size());
  for (int k = static_cast<int>(mesh.axes.size()) - 1; k >= 0; --k) {
    c[k] = rank % mesh.axes[k].second;
    rank /= mesh.axes[k].second;
  }
  return c;
}

namespace {

// One interval of a rank's share of one dim: global [lo, hi), its offset in the
// rank's share of the whole dim (`pre`, names {x.local}) and in the share
// clipped to the tensor's range (`local`, indexes memory); which contiguous run
// of the share it lies in and its offset there ({x.chunk}, {x.in_chunk}).
struct Piece {
  int64_t lo, hi, pre, local, chunk = 0, in_chunk = 0;
  int64_t size() const { return hi - lo; }
};
using Pieces = std::vector<Piece>;
using Holding = std::vector<Pieces>;  // per logical dim

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// Elements of a rank's holding: the product of its extents per dim.
int64_t Elements(const Holding& h) {
  int64_t n = 1;
  for (const Pieces& p : h) {
    int64_t e = 0;
    for (const Piece& x : p) e += x.size();
    n *= e;
  }
  return n;
}

// Global indices [lo, hi) of one dim of a part, held in buffer memory along
// that dim at position pos + (c - lo) * step for index c.
struct Seg {
  int64_t lo, hi, pos, step = 1;
};
using Segs = std::vector<std::vector<Seg>>;  // per logical dim

int64_t CeilDiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// The parts of `segs` whose memory positions fall in [lo, lo + n), moved to
// start at 0: one rank's share of a buffer sharded as a whole.
std::vector<Seg> CutSegments(const std::vector<Seg>& segs, int64_t lo, int64_t n) {
  std::vector<Seg> out;
  for (const Seg& s : segs) {
    const int64_t first = std::max<int64_t>(0, CeilDiv(lo - s.pos, s.step));
    const int64_t last = std::min(s.hi - s.lo, CeilDiv(lo + n - s.pos, s.step));
    if (first < last) out.push_back({s.lo + first, s.lo + last, s.pos + first * s.step - lo, s.step});
  }
  return out;
}

class Expander {
 public:
  Expander(const ModelSpec& m, const LayoutSpec& l, size_t threads) : model_(m), layout_(l), threads_(threads) {}

  Expansion Run();

 private:
  [[noreturn]] void Fail(const std::string& path, const std::string& msg) const {
    throw Error(layout_.file + ": " + path + ": " + msg);
  }
  std::string DimName(const TensorSpec& t, int d) const {
    int ns = static_cast<int>(t.stack.size());
    return d < ns ? Quote(model_.dims[t.stack[d]].first) : std::to_string(d - ns);
  }
  int LogicalDim(const TensorSpec& t, const AxisSpec& a) const;
  std::vector<Interval> AxisSelection(const TensorSpec& t, int d, const AxisSpec& a, const std::string& axis,
                                      int64_t L, int64_t n, int64_t pos) const;
  std::optional<Holding> Hold(int tensor, int64_t rank, bool keep_empty_shape,
                              const std::vector<int64_t>* lo = nullptr, const std::vector<int64_t>* hi = nullptr);
  std::vector<std::pair<int, int64_t>> RuleAt(const BufferRule& rule, const Mesh& mesh) const;
  void CheckRuleOverlap(int tensor, const std::vector<int>& rules) const;
  void CheckRuleCover(int tensor, const std::vector<int>& rules);
  void CheckMemory() const;
  int ShardAxis(const BufferRule& rule, const std::vector<int>& parts) const;
  void CheckHeads(int tensor, const Segs& segs, int64_t rank, const std::string& path) const;
  // A rule call (one rule, one set of parts) as every rank expands it.
  struct RulePlan {
    const BufferRule* rule;
    std::vector<int> parts;
    int ns, nshape;  // stack dims, shape dims
    std::vector<std::vector<int64_t>> box_lo, box_hi;  // per part, narrowed by "range"
    bool narrowed;
    NameTemplate name_tmpl;
    std::vector<int> name_dim;    // per placeholder: its stack dim
    std::vector<bool> instanced;  // per stack dim: one buffer per index
    std::vector<int> rule_scales;  // per part, its scale tensor (quantized rules)
    std::vector<size_t> block_of;  // interleave: per part, its block, rows per outer and inner group
    std::vector<int64_t> outer_rows, inner_rows;
    std::vector<std::pair<int64_t, int64_t>> blocks;
    int shard_axis;
    const Mesh* part_mesh;
    std::vector<std::pair<int, int64_t>> at;
  };
  // Where a rank's fragments are listed under their tensors: by_tensor
  // itself (ranks in turn), or a thread's own lists, each entry tagged with
  // its rule call, merged in call and rank order afterwards.
  struct Tagged {
    uint32_t call;
    FragmentRef ref;
  };
  struct FragmentSink {
    std::vector<std::vector<FragmentRef>>* by_tensor = nullptr;
    std::vector<std::vector<Tagged>>* tagged = nullptr;
    uint32_t call = 0;
    void Add(int tensor, FragmentRef ref) {
      if (by_tensor) (*by_tensor)[tensor].push_back(ref);
      else (*tagged)[tensor].push_back({call, ref});
    }
  };
  RulePlan PlanRule(const BufferRule& rule, const std::vector<int>& parts);
  void ExpandRank(const RulePlan& plan, int64_t r, FragmentSink& sink);
  void ExpandRule(const BufferRule& rule, const std::vector<int>& parts);
  bool ExpandOnThreads(const std::vector<std::pair<const BufferRule*, std::vector<int>>>& calls);
  void ResetExpansion();

  const ModelSpec& model_;
  const LayoutSpec& layout_;
  size_t threads_;              // asked for (0: the machine's)
  std::vector<int> placement_;  // per tensor
  Expansion e_;
  std::vector<std::unordered_map<std::string, std::string>> names_;  // per rank: buffer name -> rule path
  // Elements of a tensor per rank that rules with "range" or "at" named.
  std::unordered_map<int, std::vector<int64_t>> claimed_;
};

int Expander::LogicalDim(const TensorSpec& t, const AxisSpec& a) const {
  if (a.stack_dim >= 0) {
    auto it = std::find(t.stack.begin(), t.stack.end(), a.stack_dim);
    if (it == t.stack.end())
      Fail(a.path, "tensor " + Quote(t.name) + " has no dim " + Quote(a.dim_name) + " (use \"at\" or replicate)");
    return static_cast<int>(it - t.stack.begin());
  }
  if (a.shape_dim >= static_cast<int>(t.shape.size()))
    Fail(a.path, "tensor " + Quote(t.name) + " has " + std::to_string(t.shape.size()) +
                     " dims in its shape, dim " + std::to_string(a.shape_dim) + " does not exist");
  return static_cast<int>(t.stack.size()) + a.shape_dim;
}

std::vector<Interval> Expander::AxisSelection(const TensorSpec& t, int d, const AxisSpec& a, const std::string& axis,
                                              int64_t L, int64_t n, int64_t pos) const {
  std::string what = "dim " + DimName(t, d) + " of tensor " + Quote(t.name) + " (size " + std::to_string(L) + ")";
  std::vector<Interval> out;
  if (!a.sizes.empty()) {
    int64_t sum = 0, start = 0;
    for (size_t i = 0; i < a.sizes.size(); ++i) {
      if (static_cast<int64_t>(i) == pos) start = sum;
      sum += a.sizes[i];
    }
    if (sum != L) Fail(a.path + "/sizes", "sizes sum to " + std::to_string(sum) + ", " + what + " needs " + std::to_string(L));
    out.push_back({start, start + a.sizes[pos]});
  } else if (a.chunk) {
    // torch.chunk (DTensor Shard._split_tensor, FSDP2 _chunk_with_empty):
    // chunks of ceil(size / n); trailing positions may get a short or empty one.
    const int64_t blocks = a.blocks ? a.blocks : 1;
    if (L % blocks != 0)
      Fail(a.path + "/blocks", what + " is not " + std::to_string(blocks) + " equal blocks");
    const int64_t bs = L / blocks, cs = (bs + n - 1) / n;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t lo = std::min(bs, pos * cs), hi = std::min(bs, (pos + 1) * cs);
      if (lo < hi) out.push_back({b * bs + lo, b * bs + hi});
    }
  } else if (a.blocks) {
    if (L % a.blocks != 0 || (L / a.blocks) % n != 0)
      Fail(a.path + "/blocks", what + " is not " + std::to_string(a.blocks) + " blocks each divisible by " +
                                   std::to_string(n) + " positions of axis " + Quote(axis));
    int64_t bs = L / a.blocks, cs = bs / n;
    for (int64_t b = 0; b < a.blocks; ++b) out.push_back({b * bs + pos * cs, b * bs + (pos + 1) * cs});
  } else if (a.parts) {
    if (L % a.parts != 0)
      Fail(a.path + "/parts", what + " cannot be cut into " + std::to_string(a.parts) + " equal parts");
    int64_t ps = L / a.parts, part = pos / (n / a.parts);
    out.push_back({part * ps, (part + 1) * ps});
  } else if (a.cyclic) {
    for (int64_t j = pos; j * a.cyclic < L; j += n) out.push_back({j * a.cyclic, std::min(L, (j + 1) * a.cyclic)});
  } else if (!a.assign.empty()) {
    for (int64_t idx : a.assign[pos]) {
      if (idx >= L)
        Fail(a.path + "/assign/" + std::to_string(pos), "index " + std::to_string(idx) + " is outside " + what);
      if (!out.empty() && out.back().hi == idx) out.back().hi = idx + 1;
      else out.push_back({idx, idx + 1});
    }
  } else {
    if (L % n != 0)
      Fail(a.path, what + " does not divide evenly over " + std::to_string(n) + " positions of axis " + Quote(axis) +
                       "; give \"sizes\" for an uneven split, or \"split\": \"chunk\" for torch.chunk's");
    out.push_back({pos * (L / n), (pos + 1) * (L / n)});
  }
  return out;
}

// The rank's holding of tensor `ti`, or nothing when it holds none. With
// `keep_empty_shape`, a rank the placement reaches whose share of a shape dim
// is empty (a padded buffer's all-padding rank) holds an empty holding.
// `lo`/`hi` narrow the tensor's box (a buffer rule's "range").
std::optional<Holding> Expander::Hold(int ti, int64_t rank, bool keep_empty_shape, const std::vector<int64_t>* lo,
                                      const std::vector<int64_t>* hi) {
  const TensorSpec& t = model_.tensors[ti];
  const Placement& p = layout_.placements[placement_[ti]];
  const Mesh& mesh = layout_.meshes[p.mesh];
  std::vector<int64_t> coord = MeshCoords(mesh, rank);
  int nd = t.ndim();
  int ns = static_cast<int>(t.stack.size());
  std::vector<std::vector<Interval>> lists(nd);
  for (int d = 0; d < nd; ++d) {
    int64_t full = d < ns ? model_.dims[t.stack[d]].second : t.shape[d - ns];
    lists[d].push_back({0, full});
  }
  // Dims a torch.chunk cut left empty here: the rank holds them with a zero
  // extent (FSDP2's empty shard), not nothing.
  std::vector<bool> chunked_empty(nd, false);
  for (const int k : p.order) {
    const AxisSpec& a = p.axes[k];
    if (a.kind == AxisKind::replicate) continue;
    if (a.kind == AxisKind::at) {
      if (std::find(a.at.begin(), a.at.end(), coord[k]) == a.at.end()) return std::nullopt;
      continue;
    }
    int d = LogicalDim(t, a);
    int64_t L = 0;
    for (auto& iv : lists[d]) L += iv.size();
    std::vector<Interval> sel = AxisSelection(t, d, a, mesh.axes[k].first, L, mesh.axes[k].second, coord[k]);
    // Map local intervals back through the current list.
    std::vector<Interval> next;
    for (const Interval& s : sel) {
      int64_t pos = 0;
      for (const Interval& iv : lists[d]) {
        int64_t a0 = std::max(s.lo, pos), a1 = std::min(s.hi, pos + iv.size());
        if (a0 < a1) {
          Interval g{iv.lo + (a0 - pos), iv.lo + (a1 - pos)};
          if (!next.empty() && next.back().hi == g.lo) next.back().hi = g.hi;
          else next.push_back(g);
        }
        pos += iv.size();
      }
    }
    lists[d] = std::move(next);
    if (lists[d].empty() && a.chunk) chunked_empty[d] = true;
  }
  Holding h(nd);
  for (int d = 0; d < nd; ++d) {
    int64_t pre = 0, local = 0;
    const int64_t box_lo = lo ? (*lo)[d] : t.lo[d], box_hi = hi ? (*hi)[d] : t.hi[d];
    int64_t run = 0;
    for (const Interval& iv : lists[d]) {
      int64_t a = std::max(iv.lo, box_lo), b = std::min(iv.hi, box_hi);
      if (a < b) {
        h[d].push_back({a, b, pre + (a - iv.lo), local, run, a - iv.lo});
        local += b - a;
      }
      pre += iv.size();
      ++run;
    }
    if (h[d].empty() && !chunked_empty[d] && (d < ns || !keep_empty_shape)) return std::nullopt;
  }
  return h;
}

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The mesh axis a rule's `"shard"` cuts the fused buffer over, checked
// against the parts' placements (same mesh, replicated on that axis); -1 if
// the rule is not sharded as a whole.
int Expander::ShardAxis(const BufferRule& rule, const std::vector<int>& parts) const {
  if (rule.shard_axis.empty()) return -1;
  const std::string path = rule.path + "/shard";
  if (rule.quant) Fail(path, "a buffer sharded as a whole cannot be quantized");
  const Placement& p0 = layout_.placements[placement_[parts[0]]];
  const Mesh& mesh = layout_.meshes[p0.mesh];
  int axis = -1;
  for (size_t k = 0; k < mesh.axes.size(); ++k)
    if (mesh.axes[k].first == rule.shard_axis) axis = static_cast<int>(k);
  if (axis < 0)
    Fail(path, Quote(rule.shard_axis) + " is not an axis of mesh " + Quote(mesh.name) + ", where " +
                   Quote(model_.tensors[parts[0]].name) + " is placed (" + p0.path + ")");
  for (int pi : parts) {
    const Placement& p = layout_.placements[placement_[pi]];
    const std::string& t = model_.tensors[pi].name;
    if (p.mesh != p0.mesh)
      Fail(path, "parts " + Quote(model_.tensors[parts[0]].name) + " and " + Quote(t) +
                     " are placed on different meshes; a buffer sharded as a whole needs one");
    if (p.axes[axis].kind != AxisKind::replicate)
      Fail(path, "part " + Quote(t) + " is already cut on axis " + Quote(rule.shard_axis) + " by " + p.axes[axis].path +
                     "; when the buffer is sharded as a whole, its parts replicate that axis (leave it out of the "
                     "placement)");
  }
  return axis;
}

// A rank's share of a tensor with declared heads must hold whole heads.
void Expander::CheckHeads(int ti, const Segs& segs, int64_t rank, const std::string& path) const {
  const TensorSpec& t = model_.tensors[ti];
  if (t.head_dim < 0 || layout_.placements[placement_[ti]].split_heads) return;
  const int d = static_cast<int>(t.stack.size()) + t.head_dim;
  for (const Seg& s : segs[d]) {
    if (s.lo % t.head_size == 0 && (s.hi % t.head_size == 0 || s.hi == t.hi[d])) continue;
    Fail(path, "rank " + std::to_string(rank) + " holds indices " + std::to_string(s.lo) + ":" + std::to_string(s.hi) +
                   " of dim " + std::to_string(t.head_dim) + " of " + Quote(t.name) + ", which cuts a head of " +
                   std::to_string(t.head_size) + " (" + model_.file + ": " + t.path +
                   "/heads); give every rank whole heads (when TP exceeds the KV heads, replicate them with "
                   "\"parts\"), or set \"split_heads\": true on the placement if the cut is intended");
  }
}

// A rule's "at" as (mesh axis index, position) on the mesh of its parts.
std::vector<std::pair<int, int64_t>> Expander::RuleAt(const BufferRule& rule, const Mesh& mesh) const {
  std::vector<std::pair<int, int64_t>> out;
  for (const auto& [axis, pos] : rule.at) {
    const std::string path = rule.path + "/at/" + axis;
    int k = -1;
    for (size_t i = 0; i < mesh.axes.size(); ++i)
      if (mesh.axes[i].first == axis) k = static_cast<int>(i);
    if (k < 0) Fail(path, Quote(axis) + " is not an axis of mesh " + Quote(mesh.name) + ", where the rule's parts are placed");
    const int64_t n = mesh.axes[k].second, p = pos < 0 ? pos + n : pos;
    if (p < 0 || p >= n)
      Fail(path, "position " + std::to_string(pos) + " is outside the axis of size " + std::to_string(n));
    out.emplace_back(k, p);
  }
  return out;
}

// Several rules may name one tensor only where their "range"s or "at"s keep
// them apart: some stack dim both narrow to disjoint ranges, or some mesh axis
// both pin to different positions.
void Expander::CheckRuleOverlap(int ti, const std::vector<int>& rules) const {
  const TensorSpec& t = model_.tensors[ti];
  const Mesh& mesh = layout_.meshes[layout_.placements[placement_[ti]].mesh];
  for (size_t i = 0; i < rules.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const BufferRule& a = layout_.buffers[rules[i]];
      const BufferRule& b = layout_.buffers[rules[j]];
      bool apart = false;
      for (const auto& [da, alo, ahi] : a.range)
        for (const auto& [db, blo, bhi] : b.range)
          if (da == db && std::max(alo, blo) >= std::min(ahi, bhi)) apart = true;
      const auto at_a = RuleAt(a, mesh), at_b = RuleAt(b, mesh);
      for (const auto& [ka, pa] : at_a)
        for (const auto& [kb, pb] : at_b)
          if (ka == kb && pa != pb) apart = true;
      if (!apart)
        Fail(a.path, "tensor " + Quote(t.name) + " is already part of " + b.path +
                         (a.range.empty() && a.at.empty() && b.range.empty() && b.at.empty()
                              ? ""
                              : ", and their \"range\"/\"at\" do not keep them apart") +
                         "; buffer rules overlap");
    }
  }
}

// Rules with "range" or "at" must together name everything each rank holds
// of the tensor.
void Expander::CheckRuleCover(int ti, const std::vector<int>& rules) {
  const TensorSpec& t = model_.tensors[ti];
  std::vector<int64_t>& claimed = claimed_[ti];
  claimed.resize(layout_.ranks, 0);
  for (int64_t r = 0; r < layout_.ranks; ++r) {
    const std::optional<Holding> h = Hold(ti, r, false);
    const int64_t n = h ? Elements(*h) : 0;
    if (claimed[r] == n) continue;
    std::string paths;
    for (size_t i = 0; i < rules.size(); ++i) paths += (i ? ", " : "") + layout_.buffers[rules[i]].path;
    Fail(paths, "rank " + std::to_string(r) + " holds " + std::to_string(n) + " elements of " + Quote(t.name) +
                    " and these rules name " + std::to_string(claimed[r]) +
                    " of them; rules with \"range\" or \"at\" must together name every instance of a tensor on "
                    "every rank that holds it");
  }
}

// Bytes this process may allocate: the address-space limit (ulimit -v) or
// the machine's memory, whichever is smaller.
uint64_t MemoryLimit() {
  uint64_t limit = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) limit = std::min<uint64_t>(limit, rl.rlim_cur);
  return limit;
}

std::string Gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1 << 30));
  return buf;
}

// Before allocating anything per rank: how many (rank, tensor instance)
// holdings the layout makes, each a buffer and a fragment here and steps in
// later passes (somewhat more than 1 KiB each on 10^5-tensor models; counted
// at 1 KiB, an underestimate, so that only layouts that cannot fit are
// refused).
void Expander::CheckMemory() const {
  constexpr double kBytesPerHolding = 1024;
  double total = 0, worst = 0;
  int worst_tensor = 0;
  std::string worst_how;
  for (size_t ti = 0; ti < model_.tensors.size(); ++ti) {
    const TensorSpec& t = model_.tensors[ti];
    const Placement& p = layout_.placements[placement_[ti]];
    const Mesh& mesh = layout_.meshes[p.mesh];
    double ranks = 1;
    std::vector<double> cut(t.stack.size(), 1);
    for (size_t k = 0; k < p.axes.size(); ++k) {
      const AxisSpec& a = p.axes[k];
      ranks *= a.kind == AxisKind::at ? static_cast<double>(a.at.size()) : static_cast<double>(mesh.axes[k].second);
      if (a.kind == AxisKind::shard && a.stack_dim >= 0)
        for (size_t d = 0; d < t.stack.size(); ++d)
          if (t.stack[d] == a.stack_dim) cut[d] *= static_cast<double>(mesh.axes[k].second);
    }
    double per_rank = 1;
    for (size_t d = 0; d < t.stack.size(); ++d)
      per_rank *= std::ceil(static_cast<double>(t.hi[d] - t.lo[d]) / cut[d]);
    const double n = ranks * per_rank;
    total += n;
    if (n > worst) {
      worst = n, worst_tensor = static_cast<int>(ti);
      char buf[160];
      std::snprintf(buf, sizeof buf, "%.0f instance(s) on each of %.0f ranks", per_rank, ranks);
      worst_how = buf;
    }
  }
  const uint64_t limit = MemoryLimit();
  if (total * kBytesPerHolding <= static_cast<double>(limit)) return;
  char count[64];
  std::snprintf(count, sizeof count, "%.3g", total);
  Fail(layout_.placements[placement_[worst_tensor]].path,
       "layout " + Quote(layout_.name) + " makes about " + count + " (rank, tensor) holdings (" +
           Quote(model_.tensors[worst_tensor].name) + " alone: " + worst_how + "), about " +
           Gib(total * kBytesPerHolding) + " to compile at 1 KiB each, more than the " + Gib(static_cast<double>(limit)) +
           " this process may use (the machine's memory or ulimit -v); nothing was allocated for it. Compile on a "
           "larger machine, or check the layout's ranks and placements");
}

// What a rule call makes alike on every rank, checked once (PlanRule); each
// rank's buffers and fragments are then ExpandRank's.
Expander::RulePlan Expander::PlanRule(const BufferRule& rule, const std::vector<int>& parts) {
  const TensorSpec& t0 = model_.tensors[parts[0]];
  int ns = static_cast<int>(t0.stack.size());
  int nshape = static_cast<int>(t0.shape.size());
  for (size_t j = 1; j < parts.size(); ++j) {
    const TensorSpec& tj = model_.tensors[parts[j]];
    if (tj.stack != t0.stack || tj.shape.size() != t0.shape.size())
      Fail(rule.path, "parts " + Quote(t0.name) + " and " + Quote(tj.name) + " have different stack dims or ranks");
    if (tj.dtype != t0.dtype && !rule.dtype && !layout_.dtype)
      Fail(rule.path, "parts " + Quote(t0.name) + " (" + DtypeString(t0.dtype) + ") and " + Quote(tj.name) + " (" +
                          DtypeString(tj.dtype) + ") have different dtypes");
  }
  if (rule.fuse != Fuse::none && rule.fuse_dim >= nshape)
    Fail(rule.path, "fused dim " + std::to_string(rule.fuse_dim) + " is outside the shape of " + Quote(t0.name));
  if (rule.shape && static_cast<int>(rule.shape->size()) != nshape)
    Fail(rule.path + "/shape", "has " + std::to_string(rule.shape->size()) + " dims, tensor " + Quote(t0.name) +
                                   " has " + std::to_string(nshape));
  // "range": each part's box narrowed to the rule's instances.
  std::vector<std::vector<int64_t>> box_lo, box_hi;
  for (int pi : parts) {
    const TensorSpec& t = model_.tensors[pi];
    box_lo.push_back(t.lo);
    box_hi.push_back(t.hi);
    for (const auto& [dim, lo, hi] : rule.range) {
      const int d = static_cast<int>(std::find(t.stack.begin(), t.stack.end(), dim) - t.stack.begin());
      box_lo.back()[d] = std::max(lo, t.lo[d]);
      box_hi.back()[d] = std::min(hi, t.hi[d]);
      if (box_lo.back()[d] >= box_hi.back()[d])
        Fail(rule.path + "/range/" + model_.dims[dim].first,
             "[" + std::to_string(lo) + ", " + std::to_string(hi) + "] holds no instance of " + Quote(t.name) +
                 ", which the model declares for " + Quote(model_.dims[dim].first) + " [" + std::to_string(t.lo[d]) +
                 ", " + std::to_string(t.hi[d]) + "]");
    }
  }
  const bool narrowed = !rule.range.empty() || !rule.at.empty();
  if (narrowed && rule.quant)
    Fail(rule.path + "/quant", "a rule with \"range\" or \"at\" cannot be quantized; quantize the whole tensor in one rule");
  // Which stack dims are named (one buffer per index) and which are kept as leading physical dims.
  const NameTemplate name_tmpl = ParseNameTemplate(rule.name);
  std::vector<int> name_dim;  // per placeholder: its logical (stack) dim
  std::vector<bool> instanced(ns, false);
  for (const std::string& n : name_tmpl.dims) {
    int d = static_cast<int>(std::find(t0.stack.begin(), t0.stack.end(), model_.dim_index(n)) - t0.stack.begin());
    name_dim.push_back(d);
    instanced[d] = true;
  }
  // A quantized rule's parts each get a scale tensor: one element per block.
  std::vector<int> rule_scales;
  if (rule.quant) {
    for (int pi : parts) {
      const TensorSpec& t = model_.tensors[pi];
      if (nshape < 2)
        Fail(rule.quant->path, "tensor " + Quote(t.name) + " has " + std::to_string(nshape) +
                                   " dim in its shape; quantized tensors need at least 2 (rows, cols)");
      ScaleTensor st;
      st.of = pi;
      st.dtype = rule.quant->scale_dtype;
      st.name = t.name + "#scale";
      st.box.ndim = t.ndim();
      for (int d = 0; d < t.ndim(); ++d) {
        const int q = d - (t.ndim() - 2);  // 0: rows, 1: cols
        const int64_t full = t.hi[d] - t.lo[d];
        st.block[d] = q < 0 ? 1 : (rule.quant->block[q] ? std::min(rule.quant->block[q], full) : full);
        st.box.lo[d] = t.lo[d] / st.block[d];
        st.box.hi[d] = (t.hi[d] + st.block[d] - 1) / st.block[d];
      }
      rule_scales.push_back(static_cast<int>(e_.scales.size()));
      e_.scales.push_back(st);
    }
  }
  // The fused dim of an interleave: `rule.groups` outer groups; in each, the
  // blocks of consecutive parts one after another, each block interleaving
  // its parts in its own groups. Per part: its block and its rows per outer
  // group (l) and per inner group (q), from the whole tensor.
  const size_t np = parts.size();
  std::vector<size_t> block_of(np, 0);
  std::vector<int64_t> outer_rows(np, 0), inner_rows(np, 0);
  std::vector<std::pair<int64_t, int64_t>> blocks = rule.blocks;
  if (rule.fuse == Fuse::interleave) {
    if (blocks.empty()) blocks.emplace_back(static_cast<int64_t>(np), 1);
    for (size_t b = 0, j = 0; b < blocks.size(); ++b)
      for (int64_t k = 0; k < blocks[b].first; ++k, ++j) block_of[j] = b;
    for (size_t j = 0; j < np; ++j) {
      const TensorSpec& tj = model_.tensors[parts[j]];
      const int64_t len = tj.shape[rule.fuse_dim], g = blocks[block_of[j]].second;
      if (len % rule.groups != 0)
        Fail(rule.path + "/interleave", "dim " + std::to_string(rule.fuse_dim) + " of " + Quote(tj.name) + " (size " +
                                            std::to_string(len) + ") is not " + std::to_string(rule.groups) +
                                            " equal groups");
      outer_rows[j] = len / rule.groups;
      if (outer_rows[j] % g != 0)
        Fail(rule.path + "/interleave/blocks/" + std::to_string(block_of[j]),
             "a group of " + Quote(tj.name) + " (" + std::to_string(outer_rows[j]) + " rows) is not " +
                 std::to_string(g) + " equal groups");
      inner_rows[j] = outer_rows[j] / g;
    }
  }
  const int shard_axis = ShardAxis(rule, parts);
  const Mesh& part_mesh = layout_.meshes[layout_.placements[placement_[parts[0]]].mesh];
  const std::vector<std::pair<int, int64_t>> at = RuleAt(rule, part_mesh);
  if (narrowed)  // each part's elements per rank that this rule names (ExpandRank adds to them)
    for (int pi : parts) claimed_[pi].resize(layout_.ranks, 0);
  return {&rule, parts, ns, nshape, std::move(box_lo), std::move(box_hi), narrowed, name_tmpl, std::move(name_dim),
          std::move(instanced), std::move(rule_scales), std::move(block_of), std::move(outer_rows),
          std::move(inner_rows), std::move(blocks), shard_axis, &part_mesh, at};
}

// Rank r's buffers and fragments of one rule call. It writes only rank r's
// layout and names (and its elements in claimed_), so ranks may expand on
// threads of their own; its fragments are listed under their tensors by `sink`.
void Expander::ExpandRank(const RulePlan& plan, int64_t r, FragmentSink& sink) {
  const BufferRule& rule = *plan.rule;
  const std::vector<int>& parts = plan.parts;
  const TensorSpec& t0 = model_.tensors[parts[0]];
  const int ns = plan.ns, nshape = plan.nshape;
  const std::vector<std::vector<int64_t>>& box_lo = plan.box_lo;
  const std::vector<std::vector<int64_t>>& box_hi = plan.box_hi;
  const bool narrowed = plan.narrowed;
  const NameTemplate& name_tmpl = plan.name_tmpl;
  const std::vector<int>& name_dim = plan.name_dim;
  const std::vector<bool>& instanced = plan.instanced;
  const std::vector<int>& rule_scales = plan.rule_scales;
  const size_t np = parts.size();
  const std::vector<size_t>& block_of = plan.block_of;
  const std::vector<int64_t>& outer_rows = plan.outer_rows;
  const std::vector<int64_t>& inner_rows = plan.inner_rows;
  const std::vector<std::pair<int64_t, int64_t>>& blocks = plan.blocks;
  const int shard_axis = plan.shard_axis;
  const Mesh& part_mesh = *plan.part_mesh;
  const std::vector<std::pair<int, int64_t>>& at = plan.at;
  if (!at.empty()) {
    const std::vector<int64_t> coord = MeshCoords(part_mesh, r);
    bool here = true;
    for (const auto& [k, pos] : at) here = here && coord[k] == pos;
    if (!here) return;
  }
  std::vector<std::optional<Holding>> hs;
  int held = 0;
  for (size_t j = 0; j < parts.size(); ++j) {
    hs.push_back(Hold(parts[j], r, rule.shape.has_value(), &box_lo[j], &box_hi[j]));
    held += hs.back().has_value();
  }
  if (held == 0) return;
  if (narrowed) {
    for (size_t j = 0; j < parts.size(); ++j) {
      claimed_.find(parts[j])->second[r] += Elements(*hs[j]);  // made by PlanRule
    }
  }
  if (held != static_cast<int>(parts.size())) {
    size_t has = 0, lacks = 0;
    for (size_t j = 0; j < parts.size(); ++j) (hs[j] ? has : lacks) = j;
    Fail(rule.path, "rank " + std::to_string(r) + " holds " + Quote(model_.tensors[parts[has]].name) + " but not " +
                        Quote(model_.tensors[parts[lacks]].name) + "; all parts of a buffer must live on the same ranks");
  }
  const Holding& h0 = *hs[0];
  auto extent = [](const Pieces& p) {
    int64_t n = 0;
    for (auto& x : p) n += x.size();
    return n;
  };
  // Stack dims must agree across parts, shape dims too except the fused one.
  std::vector<int64_t> content(nshape, 0);
  for (size_t j = 0; j < parts.size(); ++j) {
    const Holding& hj = *hs[j];
    for (int d = 0; d < ns; ++d) {
      bool same = hj[d].size() == h0[d].size();
      for (size_t k = 0; same && k < hj[d].size(); ++k) same = hj[d][k].lo == h0[d][k].lo && hj[d][k].hi == h0[d][k].hi;
      if (!same)
        Fail(rule.path, "on rank " + std::to_string(r) + ", parts " + Quote(t0.name) + " and " +
                            Quote(model_.tensors[parts[j]].name) + " hold different " +
                            Quote(model_.dims[t0.stack[d]].first) + " indices");
    }
    for (int s = 0; s < nshape; ++s) {
      int64_t e = extent(hj[ns + s]);
      bool fused = rule.fuse != Fuse::none && s == rule.fuse_dim;
      if (fused) {
        content[s] += e;
      } else if (j == 0) {
        content[s] = e;
      } else if (content[s] != e) {
        Fail(rule.path, "on rank " + std::to_string(r) + ", parts " + Quote(t0.name) + " and " +
                            Quote(model_.tensors[parts[j]].name) + " have local extents " + std::to_string(content[s]) +
                            " and " + std::to_string(e) + " on dim " + std::to_string(s) + ", which is not fused");
      }
    }
  }
  // This rank's interleave: each part's share is whole outer groups, or a
  // piece of one (a TP cut of one group: vLLM's heads); inside, whole inner
  // groups wherever a block has several parts.
  struct Local {
    int64_t outer = 0, inner = 0;  // rows of the part per outer / inner group here
    int64_t pos = 0;               // offset of its first row in an inner group of its block
  };
  std::vector<Local> loc(np);
  std::vector<int64_t> block_off(blocks.size(), 0), block_group(blocks.size(), 0);
  int64_t outer_size = 0;
  if (rule.fuse == Fuse::interleave) {
    int64_t outer_groups = -1;
    std::vector<int64_t> inner_groups(blocks.size(), -1);
    for (size_t j = 0; j < np; ++j) {
      const std::string who = "rank " + std::to_string(r) + " holds ";
      const int64_t e = extent((*hs[j])[ns + rule.fuse_dim]);
      if (e == 0) {  // a zero-size share (an empty chunk): no rows to place
        loc[j] = {0, 1, block_group[block_of[j]]};
        continue;
      }
      const int64_t o = e >= outer_rows[j] ? e / outer_rows[j] : 1;
      if (e >= outer_rows[j] && e % outer_rows[j] != 0)
        Fail(rule.path + "/interleave", who + std::to_string(e) + " rows of " + Quote(model_.tensors[parts[j]].name) +
                                            ", not whole groups of " + std::to_string(outer_rows[j]));
      if (outer_groups >= 0 && o != outer_groups)
        Fail(rule.path + "/interleave", "on rank " + std::to_string(r) + ", parts hold different numbers of groups");
      outer_groups = o;
      loc[j].outer = e / o;
      const size_t b = block_of[j];
      const bool alone = blocks[b].first == 1;  // a block of one part keeps its rows together
      loc[j].inner = alone ? loc[j].outer : inner_rows[j];
      for (const Piece& p : (*hs[j])[ns + rule.fuse_dim])
        if (!alone && (p.lo % loc[j].inner != 0 || p.size() % loc[j].inner != 0))
          Fail(rule.path + "/interleave",
               who + "rows " + std::to_string(p.lo) + ":" + std::to_string(p.hi) + " of " +
                   Quote(model_.tensors[parts[j]].name) + ", not whole groups of " + std::to_string(loc[j].inner));
      if (loc[j].outer % loc[j].inner != 0)
        Fail(rule.path + "/interleave", who + std::to_string(loc[j].outer) + " rows of a group of " +
                                            Quote(model_.tensors[parts[j]].name) + ", not whole groups of " +
                                            std::to_string(loc[j].inner));
      const int64_t g = loc[j].outer / loc[j].inner;
      if (inner_groups[b] >= 0 && g != inner_groups[b])
        Fail(rule.path + "/interleave", "on rank " + std::to_string(r) + ", the parts of block " + std::to_string(b) +
                                            " hold different numbers of groups");
      inner_groups[b] = g;
      loc[j].pos = block_group[b];
      block_group[b] += loc[j].inner;
    }
    for (size_t b = 0; b < blocks.size(); ++b) {
      block_off[b] = outer_size;
      outer_size += block_group[b] * std::max<int64_t>(inner_groups[b], 0);
    }
  }
  // Sharded as a whole: this rank holds rows [cut_lo, cut_lo + content) of
  // the fused buffer the parts make together.
  int64_t cut_lo = 0;
  if (shard_axis >= 0) {
    const int64_t n = part_mesh.axes[shard_axis].second, k = MeshCoords(part_mesh, r)[shard_axis];
    const int64_t whole = content[rule.fuse_dim];
    if (rule.shard_chunk) {
      const int64_t cs = (whole + n - 1) / n;
      cut_lo = std::min(whole, k * cs);
      content[rule.fuse_dim] = std::min(whole, (k + 1) * cs) - cut_lo;
    } else {
      if (whole % n != 0)
        Fail(rule.path + "/shard", "the fused dim " + std::to_string(rule.fuse_dim) + " of the buffer (" +
                                       std::to_string(whole) + " rows of all parts together) does not divide evenly over " +
                                       std::to_string(n) + " positions of axis " + Quote(rule.shard_axis) +
                                       "; {\"axis\": ..., \"split\": \"chunk\"} cuts it as torch.chunk does");
      content[rule.fuse_dim] = whole / n;
      cut_lo = k * content[rule.fuse_dim];
    }
  }
  std::vector<int64_t> trailing = content;
  if (rule.shape) {
    for (int s = 0; s < nshape; ++s)
      if ((*rule.shape)[s] < content[s])
        Fail(rule.path + "/shape", "buffer content on rank " + std::to_string(r) + " is " + ShapeStr(content) +
                                       ", larger than the declared shape " + ShapeStr(*rule.shape));
    trailing = *rule.shape;
  }
  // Physical shape: kept stack dims, then trailing dims; row-major strides.
  std::vector<int64_t> phys;
  std::vector<int> phys_of(ns + nshape, -1);
  for (int d = 0; d < ns; ++d)
    if (!instanced[d]) phys_of[d] = static_cast<int>(phys.size()), phys.push_back(extent(h0[d]));
  for (int s = 0; s < nshape; ++s) phys_of[ns + s] = static_cast<int>(phys.size()), phys.push_back(trailing[s]);
  std::vector<int64_t> pstride(phys.size(), 1);
  for (int k = static_cast<int>(phys.size()) - 2; k >= 0; --k) pstride[k] = pstride[k + 1] * phys[k + 1];
  // Buffer instances: row-major over instanced dims (clipped local indices).
  std::vector<int64_t> count(ns, 1), bstride(ns, 0);
  int64_t ninst = 1;
  for (int d = ns - 1; d >= 0; --d)
    if (instanced[d]) bstride[d] = ninst, count[d] = extent(h0[d]), ninst *= count[d];
  RankLayout& rl = e_.ranks[r];
  uint32_t base = static_cast<uint32_t>(rl.buffers.size());
  Dtype dtype = rule.quant ? Dtype::fp8_e4m3 : rule.dtype ? *rule.dtype : layout_.dtype ? *layout_.dtype : t0.dtype;
  // One buffer per instance, named by `tmpl` (the data's or the scales' name).
  auto add_buffers = [&](const NameTemplate& tmpl, const std::string& path, Dtype dt, const std::vector<int64_t>& shape) {
    std::vector<int64_t> idx(ns, 0);
    for (int64_t i = 0; i < ninst; ++i) {
      int64_t rem = i;
      for (int d = ns - 1; d >= 0; --d)
        if (instanced[d]) idx[d] = rem % count[d], rem /= count[d];
      std::string name = tmpl.text[0];
      for (size_t k = 0; k < name_dim.size(); ++k) {
        int d = name_dim[k];
        for (const Piece& pc : h0[d]) {
          if (idx[d] >= pc.local && idx[d] < pc.local + pc.size()) {
            const int64_t in = idx[d] - pc.local;
            switch (tmpl.kind[k]) {
              case IndexKind::global: name += std::to_string(pc.lo + in); break;
              case IndexKind::local: name += std::to_string(pc.pre + in); break;
              case IndexKind::chunk: name += std::to_string(pc.chunk); break;
              case IndexKind::in_chunk: name += std::to_string(pc.in_chunk + in); break;
            }
            break;
          }
        }
        name += tmpl.text[k + 1];
      }
      auto [it, fresh] = names_[r].emplace(name, rule.path);
      if (!fresh)
        Fail(path, "buffer name " + Quote(name) + " is produced twice on rank " + std::to_string(r) + " (also by " +
                       it->second + "); buffer rules overlap");
      rl.buffers.push_back({name, dt, shape});
    }
  };
  add_buffers(name_tmpl, rule.path + "/name", dtype, phys);
  if (rule.held_transposed) {
    if (phys.size() != 2)
      Fail(rule.path + "/held", "\"held\": \"transposed\" is for 2-D buffers; this rule's buffers have " +
                                    std::to_string(phys.size()) + " dims");
    for (size_t k = base; k < rl.buffers.size(); ++k) rl.buffers[k].held_transposed = true;
  }
  if (rule.offset != 0)
    for (size_t k = base; k < rl.buffers.size(); ++k) rl.buffers[k].offset = rule.offset;
  // Per dim, the list of (global lo, global hi, memory position) segments
  // of one part; one fragment per combination of segments.
  const int nd = ns + nshape;
  auto add_fragments = [&](int tensor, const Segs& segs, int64_t first_buffer,
                           const std::vector<int64_t>& strides) {
    for (int d = 0; d < nd; ++d)
      if (segs[d].empty()) return;  // nothing of this part here (an all-padding rank)
    std::vector<size_t> k(nd, 0);
    while (true) {
      Fragment f;
      f.tensor = tensor;
      f.box.ndim = nd;
      int64_t buf = first_buffer, off = 0;
      for (int d = 0; d < nd; ++d) {
        const Seg& s = segs[d][k[d]];
        f.box.lo[d] = s.lo;
        f.box.hi[d] = s.hi;
        if (d < ns && instanced[d]) {
          buf += s.pos * bstride[d];
          f.stride[d] = bstride[d];
          f.buffer_dims |= 1u << d;
        } else {
          off += s.pos * strides[phys_of[d]];
          f.stride[d] = strides[phys_of[d]] * s.step;
        }
      }
      f.buffer = static_cast<uint32_t>(buf);
      f.offset = static_cast<uint64_t>(off);
      if (tensor < static_cast<int>(e_.by_tensor.size()))
        sink.Add(tensor, {static_cast<int>(r), static_cast<int>(rl.fragments.size())});
      rl.fragments.push_back(f);
      int d = nd - 1;
      while (d >= 0 && ++k[d] == segs[d].size()) k[d--] = 0;
      if (d < 0) break;
    }
  };
  // Fragments: one per combination of pieces (and per interleave group).
  std::vector<std::vector<std::vector<Seg>>> part_segs;
  for (size_t j = 0; j < parts.size(); ++j) {
    const Holding& hj = *hs[j];
    int64_t concat_off = 0;
    if (rule.fuse == Fuse::concat)
      for (size_t i = 0; i < j; ++i) concat_off += extent((*hs[i])[ns + rule.fuse_dim]);
    std::vector<std::vector<Seg>> segs(nd);
    for (int d = 0; d < nd; ++d) {
      const bool il = rule.fuse == Fuse::interleave && d == ns + rule.fuse_dim;
      for (const Piece& p : hj[d]) {
        if (!il) {
          int64_t pos = p.local + ((rule.fuse == Fuse::concat && d == ns + rule.fuse_dim) ? concat_off : 0);
          segs[d].push_back({p.lo, p.hi, pos});
          continue;
        }
        // Row u of the share: outer group u / l, inner group (u % l) / q,
        // row (u % l) % q of it; runs of rows that stay contiguous (or, for
        // groups of one row, evenly strided) make one segment each.
        const Local& lj = loc[j];
        const size_t b = block_of[j];
        const int64_t l = lj.outer, q = lj.inner, step_in = block_group[b];
        for (int64_t c = p.lo; c < p.hi;) {
          const int64_t u = p.local + (c - p.lo), o = u / l, v = u % l, w = v % q;
          const int64_t pos = o * outer_size + block_off[b] + (v / q) * step_in + lj.pos + w;
          int64_t n;
          if (q == 1 && l == 1) {  // one row per outer group (gpt-oss's alternating rows)
            n = p.hi - c;
            segs[d].push_back({c, c + n, pos, outer_size});
          } else if (q == 1) {  // one row per inner group: strided within the outer group
            n = std::min(p.hi - c, l - v);
            segs[d].push_back({c, c + n, pos, step_in});
          } else {
            n = std::min(p.hi - c, q - w);
            segs[d].push_back({c, c + n, pos});
          }
          c += n;
        }
      }
    }
    if (shard_axis >= 0) segs[ns + rule.fuse_dim] = CutSegments(segs[ns + rule.fuse_dim], cut_lo, content[rule.fuse_dim]);
    CheckHeads(parts[j], segs, r,
               shard_axis >= 0 ? rule.path + "/shard" : layout_.placements[placement_[parts[j]]].path);
    add_fragments(parts[j], segs, base, pstride);
    part_segs.push_back(std::move(segs));
  }
  if (!rule.quant) return;
  // Scales: per part, the blocks its content touches, in a buffer of their
  // own beside each data buffer (kept stack dims alike, concatenated parts
  // concatenated alike). A block dim held in several pieces would need
  // scales of blocks in between; layouts do not do that.
  std::vector<std::vector<std::vector<Seg>>> scale_segs(parts.size(), std::vector<std::vector<Seg>>(nd));
  std::vector<int64_t> scale_trailing(nshape, 0);
  for (size_t j = 0; j < parts.size(); ++j) {
    const ScaleTensor& st = e_.scales[rule_scales[j]];
    for (int d = 0; d < nd; ++d) {
      const int64_t b = st.block[d];
      if (b == 1) {
        scale_segs[j][d] = part_segs[j][d];
      } else {
        if (part_segs[j][d].size() != 1)
          Fail(rule.quant->path, "rank " + std::to_string(r) + " holds dim " + DimName(model_.tensors[parts[j]], d) +
                                     " of " + Quote(model_.tensors[parts[j]].name) + " in " +
                                     std::to_string(part_segs[j][d].size()) +
                                     " pieces; a quantized dim must be held in one piece");
        const Seg& x = part_segs[j][d][0];
        scale_segs[j][d].push_back({x.lo / b, (x.hi + b - 1) / b, 0});
      }
      if (d < ns) continue;
      // The part's extent in scales along this dim: its elements (b = 1) or the blocks it touches.
      const int64_t ext = b == 1 ? extent((*hs[j])[d]) : scale_segs[j][d][0].hi - scale_segs[j][d][0].lo;
      if (rule.fuse == Fuse::concat && d - ns == rule.fuse_dim) {
        if (b != 1) scale_segs[j][d][0].pos = scale_trailing[d - ns];
        scale_trailing[d - ns] += ext;
      } else if (j == 0) {
        scale_trailing[d - ns] = ext;
      } else if (scale_trailing[d - ns] != ext) {
        Fail(rule.quant->path, "on rank " + std::to_string(r) + ", the parts' scales cover " +
                                   std::to_string(scale_trailing[d - ns]) + " and " + std::to_string(ext) +
                                   " blocks on dim " + std::to_string(d - ns) + ", which is not fused");
      }
    }
  }
  std::vector<int64_t> sphys;
  for (int d = 0; d < ns; ++d)
    if (!instanced[d]) sphys.push_back(extent(h0[d]));
  for (int64_t x : scale_trailing) sphys.push_back(x);
  std::vector<int64_t> sstride(sphys.size(), 1);
  for (int k = static_cast<int>(sphys.size()) - 2; k >= 0; --k) sstride[k] = sstride[k + 1] * sphys[k + 1];
  const uint32_t sbase = static_cast<uint32_t>(rl.buffers.size());
  add_buffers(ParseNameTemplate(rule.quant->scale_name), rule.quant->path + "/scale_name", rule.quant->scale_dtype,
              sphys);
  for (size_t j = 0; j < parts.size(); ++j)
    add_fragments(static_cast<int>(model_.tensors.size()) + rule_scales[j], scale_segs[j], sbase, sstride);
}

void Expander::ExpandRule(const BufferRule& rule, const std::vector<int>& parts) {
  const RulePlan plan = PlanRule(rule, parts);
  FragmentSink sink{&e_.by_tensor};
  for (int64_t r = 0; r < layout_.ranks; ++r) ExpandRank(plan, r, sink);
}

void Expander::ResetExpansion() {
  e_ = Expansion{};
  e_.ranks.resize(layout_.ranks);
  e_.by_tensor.resize(model_.tensors.size());
  names_.assign(layout_.ranks, {});
  claimed_.clear();
}

// Every rule call expanded with the layout's ranks split over threads (runs
// of up to 8 ranks dealt out in turn), each rank's buffers and fragments by
// the thread that owns it; the rule calls' checks once, before. The
// fragments each thread lists under a tensor are merged in rule call and
// rank order, the order in turn gives them, so the expansion does not
// depend on the thread count. False, with nothing kept, where a check
// fails or the layout is too small to split (under 64 ranks, unless asked).
bool Expander::ExpandOnThreads(const std::vector<std::pair<const BufferRule*, std::vector<int>>>& calls) {
  const size_t threads = threads_ > 0 ? std::min(threads_, static_cast<size_t>(layout_.ranks))
                                      : ThreadsFor(static_cast<size_t>(layout_.ranks / 32));
  if (threads < 2) return false;
  const int64_t run = std::clamp<int64_t>(layout_.ranks / (4 * static_cast<int64_t>(threads)), 1, 8);
  ResetExpansion();
  const size_t nt = e_.by_tensor.size();
  std::vector<std::vector<std::vector<Tagged>>> tagged(threads, std::vector<std::vector<Tagged>>(nt));
  try {
    std::vector<RulePlan> plans;
    plans.reserve(calls.size());
    for (const auto& [rule, parts] : calls) plans.push_back(PlanRule(*rule, parts));
    OnThreads(threads, [&](size_t t) {
      for (uint32_t c = 0; c < plans.size(); ++c) {
        FragmentSink sink{nullptr, &tagged[t], c};
        for (int64_t r = static_cast<int64_t>(t) * run; r < layout_.ranks; r += static_cast<int64_t>(threads) * run)
          for (int64_t q = r; q < std::min(layout_.ranks, r + run); ++q) ExpandRank(plans[c], q, sink);
      }
    });
  } catch (const Error&) {
    return false;
  }
  std::vector<size_t> at(threads);
  for (size_t ti = 0; ti < nt; ++ti) {
    size_t total = 0;
    for (size_t t = 0; t < threads; ++t) total += tagged[t][ti].size();
    std::vector<FragmentRef>& out = e_.by_tensor[ti];
    out.reserve(total);
    std::fill(at.begin(), at.end(), 0);
    while (out.size() < total) {  // the thread whose next (call, rank) comes first gives all of that run
      size_t first = threads;
      for (size_t t = 0; t < threads; ++t) {
        if (at[t] == tagged[t][ti].size()) continue;
        const Tagged& x = tagged[t][ti][at[t]];
        if (first == threads) {
          first = t;
          continue;
        }
        const Tagged& y = tagged[first][ti][at[first]];
        if (x.call < y.call || (x.call == y.call && x.ref.rank < y.ref.rank)) first = t;
      }
      const std::vector<Tagged>& v = tagged[first][ti];
      const uint32_t call = v[at[first]].call;
      const int rank = v[at[first]].ref.rank;
      for (; at[first] < v.size() && v[at[first]].call == call && v[at[first]].ref.rank == rank; ++at[first])
        out.push_back(v[at[first]].ref);
    }
  }
  return true;
}

Expansion Expander::Run() {
  int nt = static_cast<int>(model_.tensors.size());
  ResetExpansion();
  placement_.assign(nt, -1);
  for (int ti = 0; ti < nt; ++ti) {
    for (size_t p = 0; p < layout_.placements.size(); ++p)
      if (GlobMatch(layout_.placements[p].match, model_.tensors[ti].name)) {
        placement_[ti] = static_cast<int>(p);
        break;
      }
    if (placement_[ti] < 0) Fail("/placements", "no placement matches tensor " + Quote(model_.tensors[ti].name));
  }
  CheckMemory();
  // Which rules claim each tensor (several only with "range" or "at").
  // A family whose model "range" lists several intervals is one TensorSpec
  // per interval (its pieces), all of one name: a rule naming it applies to
  // each piece its own "range" reaches.
  std::unordered_map<std::string, std::vector<int>> index;
  for (int i = 0; i < nt; ++i) index[model_.tensors[i].name].push_back(i);
  std::vector<std::vector<int>> owners(nt);
  std::vector<int> owner(nt, -1);
  std::vector<std::vector<std::vector<int>>> rule_parts(layout_.buffers.size());  // per piece: the parts
  for (size_t ri = 0; ri < layout_.buffers.size(); ++ri) {
    const BufferRule& rule = layout_.buffers[ri];
    const std::vector<int>& first = index.at(rule.parts[0]);
    for (size_t k = 1; k < rule.parts.size(); ++k) {
      const std::vector<int>& pk = index.at(rule.parts[k]);
      bool same = pk.size() == first.size();
      for (size_t j = 0; same && j < pk.size(); ++j) {
        const TensorSpec &a = model_.tensors[first[j]], &b = model_.tensors[pk[j]];
        same = a.stack == b.stack && std::equal(a.lo.begin(), a.lo.begin() + a.stack.size(), b.lo.begin()) &&
               std::equal(a.hi.begin(), a.hi.begin() + a.stack.size(), b.hi.begin());
      }
      if (!same)
        Fail(rule.path + "/parts/" + std::to_string(k),
             "parts " + Quote(rule.parts[0]) + " and " + Quote(rule.parts[k]) +
                 " exist for different instances (their model \"range\"s differ); a fused buffer joins tensors of "
                 "the same layers");
    }
    if (first.size() > 1) {  // pieces: the rule must name each instance of the dim they split
      const TensorSpec &a = model_.tensors[first[0]], &b = model_.tensors[first[1]];
      for (size_t d = 0; d < a.stack.size(); ++d) {
        if (a.lo[d] == b.lo[d]) continue;
        const std::string dim = model_.dims[a.stack[d]].first;
        const auto holes = ParseNameTemplate(rule.name).dims;
        if (std::find(holes.begin(), holes.end(), dim) == holes.end())
          Fail(rule.path + "/name", "buffer " + Quote(rule.name) + " stacks the " + Quote(dim) + " instances of " +
                                        Quote(rule.parts[0]) + ", which exists for separate intervals of " +
                                        Quote(dim) + " (its model \"range\"): name each instance ({" + dim +
                                        "} or {" + dim + ".local} in the buffer's name)");
      }
    }
    for (size_t j = 0; j < first.size(); ++j) {
      if (first.size() > 1) {  // a piece this rule's "range" does not reach is not its
        const TensorSpec& t = model_.tensors[first[j]];
        bool reached = true;
        for (const auto& [dim, lo, hi] : rule.range) {
          const size_t d = std::find(t.stack.begin(), t.stack.end(), dim) - t.stack.begin();
          reached = reached && lo < t.hi[d] && t.lo[d] < hi;
        }
        if (!reached) continue;
      }
      std::vector<int> parts;
      for (size_t k = 0; k < rule.parts.size(); ++k) {
        const int ti = index.at(rule.parts[k])[j];
        if (owner[ti] >= 0 && rule.range.empty() && rule.at.empty())
          Fail(rule.path + "/parts/" + std::to_string(k), "tensor " + Quote(rule.parts[k]) + " is already part of " +
                                                              layout_.buffers[owner[ti]].path + "; buffer rules overlap");
        if (owner[ti] < 0) owner[ti] = static_cast<int>(ri);
        owners[ti].push_back(static_cast<int>(ri));
        parts.push_back(ti);
      }
      rule_parts[ri].push_back(std::move(parts));
    }
    if (rule_parts[ri].empty()) {  // "range" reaches no piece
      const auto& [dim, lo, hi] = rule.range.front();
      Fail(rule.path + "/range/" + model_.dims[dim].first,
           "[" + std::to_string(lo) + ", " + std::to_string(hi) + "] holds no instance of " + Quote(rule.parts[0]) +
               ", which the model declares for other " + Quote(model_.dims[dim].first) + "s");
    }
  }
  for (int ti = 0; ti < nt; ++ti)
    if (owners[ti].size() > 1) CheckRuleOverlap(ti, owners[ti]);
  // A layout that names its buffers names all of them: a tensor left out of a
  // rule would otherwise become a buffer no framework holds.
  if (!layout_.buffers.empty() && !layout_.default_buffers) {
    std::vector<std::string> unnamed;
    for (int ti = 0; ti < nt; ++ti)
      if (owner[ti] < 0) unnamed.push_back(Quote(model_.tensors[ti].name));
    if (!unnamed.empty()) {
      std::string list;
      for (size_t i = 0; i < unnamed.size() && i < 3; ++i) list += (i ? ", " : "") + unnamed[i];
      if (unnamed.size() > 3) list += " and " + std::to_string(unnamed.size() - 3) + " more";
      Fail("/buffers", "no buffer rule names " + list +
                           "; a layout with buffer rules must name every tensor it holds, as the framework names "
                           "it (add it to a rule's \"parts\", or a rule {\"name\": ..., \"tensor\": ...}), or set "
                           "\"default_buffers\": true to keep the model's names for tensors no rule names");
    }
  }
  // The rule calls in order: each rule's parts, then a default rule (the
  // model's name) for each tensor no rule names.
  std::vector<BufferRule> defaults;
  std::vector<int> default_of;  // per default rule, its tensor
  for (int ti = 0; ti < nt; ++ti) {
    if (owner[ti] >= 0) continue;
    default_of.push_back(ti);
    BufferRule& def = defaults.emplace_back();
    def.name = model_.tensors[ti].name;
    def.parts = {def.name};
    def.path = "default buffer of " + Quote(def.name);
  }
  std::vector<std::pair<const BufferRule*, std::vector<int>>> calls;
  for (size_t ri = 0; ri < layout_.buffers.size(); ++ri)
    for (const std::vector<int>& parts : rule_parts[ri]) calls.emplace_back(&layout_.buffers[ri], parts);
  const size_t named_calls = calls.size();
  for (size_t k = 0; k < defaults.size(); ++k) calls.emplace_back(&defaults[k], std::vector<int>{default_of[k]});
  // On the machine's threads where the layout has ranks enough; in turn
  // where a thread found a mistake, so that the message is the first in
  // rule and rank order, as on one thread.
  const bool threaded = ExpandOnThreads(calls);
  if (!threaded) {
    ResetExpansion();
    for (size_t c = 0; c < named_calls; ++c) ExpandRule(*calls[c].first, calls[c].second);
  }
  for (int ti = 0; ti < nt; ++ti) {
    bool narrowed = false;
    for (int ri : owners[ti]) narrowed = narrowed || !layout_.buffers[ri].range.empty() || !layout_.buffers[ri].at.empty();
    if (narrowed) CheckRuleCover(ti, owners[ti]);
  }
  if (!threaded)
    for (size_t c = named_calls; c < calls.size(); ++c) ExpandRule(*calls[c].first, calls[c].second);
  // A tensor no rank holds is a layout mistake on either side. (A tensor held
  // only in part is reported by routing, where a destination needs the rest.)
  // (A family of several intervals is one family: held if any piece is.)
  for (int ti = 0; ti < nt; ++ti) {
    bool held = false;
    for (int pi : index.at(model_.tensors[ti].name)) held = held || !e_.by_tensor[pi].empty();
    if (!held)
      Fail(layout_.placements[placement_[ti]].path, "tensor " + Quote(model_.tensors[ti].name) + " lives on no rank");
  }
  return std::move(e_);
}

}  // namespace

Expansion Expand(const ModelSpec& model, const LayoutSpec& layout, size_t threads) {
  return Expander(model, layout, threads).Run();
}

}  // namespace reshard
