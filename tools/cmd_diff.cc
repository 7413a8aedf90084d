// reshard diff: whether two plans make every rank do the same thing, and if not,
// what changed: inputs, bytes per channel, per rank, per peer pair, rounds and
// staging, and which tensors are routed differently.
//
// Two plans are *equivalent* when they have the same ranks (training and
// inference sides), the same tensor table, and every rank's program is the same
// step for step: the same buffers to bind, fragments, staging size, rounds, and
// steps with the same kind, peer, channel, wire dtype, bytes, staging offset,
// dependency and regions (compared by value, not by index into the region
// table). Everything else - compiler version, digest, spec names, strategy,
// staging limit, NVLink domains - describes how the plan was made; differences
// there are listed as notes of an equivalent plan.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/plan.h"
#include "tools/commands.h"
#include "tools/plan_report.h"

namespace reshard::cli {
namespace {

using nlohmann::ordered_json;
using report::Bytes;

std::string Str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

template <class V>
std::vector<uint64_t> Vec(const V* v) {
  std::vector<uint64_t> out;
  if (v)
    for (auto x : *v) out.push_back(x);
  return out;
}

bool SameRegion(const fb::Region& a, const fb::Region& b) {
  if (a.offset() != b.offset() || a.buffer() != b.buffer() || a.ndim() != b.ndim() ||
      a.buffer_modes() != b.buffer_modes())
    return false;
  for (int k = 0; k < std::min<int>(a.ndim(), 4); ++k)
    if (a.shape()->Get(k) != b.shape()->Get(k) || a.stride()->Get(k) != b.stride()->Get(k)) return false;
  return true;
}

bool SameRegionRef(const fb::Program& pa, uint32_t a, const fb::Program& pb, uint32_t b) {
  if (a == kNone || b == kNone) return a == b;
  return SameRegion(*pa.regions()->Get(a), *pb.regions()->Get(b));
}

// The first way in which two rank programs differ, in words; "" when they are the same.
std::string ProgramDifference(const fb::Program& a, const fb::Program& b) {
  if (a.src_rank() != b.src_rank() || a.dst_rank() != b.dst_rank())
    return "side " + report::Side(a) + " -> " + report::Side(b);
  uint32_t na = a.buffers() ? a.buffers()->size() : 0, nb = b.buffers() ? b.buffers()->size() : 0;
  if (na != nb) return "binds " + std::to_string(na) + " -> " + std::to_string(nb) + " buffers";
  for (uint32_t i = 0; i < na; ++i) {
    const fb::Buffer *x = a.buffers()->Get(i), *y = b.buffers()->Get(i);
    if (Str(x->name()) != Str(y->name()) || x->dtype() != y->dtype() || Vec(x->shape()) != Vec(y->shape()))
      return "buffer " + std::to_string(i) + " '" + Str(x->name()) + "' -> '" + Str(y->name()) + "' (name, dtype or shape)";
  }
  uint32_t fa = a.fragments() ? a.fragments()->size() : 0, fbn = b.fragments() ? b.fragments()->size() : 0;
  if (fa != fbn) return "holds " + std::to_string(fa) + " -> " + std::to_string(fbn) + " fragments";
  if (fa && std::memcmp(a.fragments()->Data(), b.fragments()->Data(), fa * sizeof(fb::Fragment)) != 0)
    return "fragments (what its buffers hold) differ";
  if (a.staging_bytes() != b.staging_bytes())
    return "staging " + Bytes(a.staging_bytes()) + " -> " + Bytes(b.staging_bytes());
  if (Vec(a.round_begin()) != Vec(b.round_begin())) {
    uint32_t ra = a.round_begin() ? a.round_begin()->size() : 0, rb = b.round_begin() ? b.round_begin()->size() : 0;
    return "rounds " + std::to_string(ra ? ra - 1 : 0) + " -> " + std::to_string(rb ? rb - 1 : 0) +
           " (or their step boundaries)";
  }
  uint32_t sa = a.steps() ? a.steps()->size() : 0, sb = b.steps() ? b.steps()->size() : 0;
  for (uint32_t i = 0; i < std::min(sa, sb); ++i) {
    const fb::Step *x = a.steps()->Get(i), *y = b.steps()->Get(i);
    if (x->kind() != y->kind() || x->peer() != y->peer() || x->channel() != y->channel() || x->wire() != y->wire() ||
        x->bytes() != y->bytes() || x->staging() != y->staging() || x->dep() != y->dep() ||
        x->flags() != y->flags() || !SameRegionRef(a, x->src(), b, y->src()) ||
        !SameRegionRef(a, x->dst(), b, y->dst()))
      return "step " + std::to_string(i) + ": " + report::StepText(a, *x) + "  ->  " + report::StepText(b, *y);
  }
  if (sa != sb) return "steps " + std::to_string(sa) + " -> " + std::to_string(sb);
  // The block-scaled conversions of the steps.
  uint32_t qa = a.quant_ops() ? a.quant_ops()->size() : 0, qb = b.quant_ops() ? b.quant_ops()->size() : 0;
  for (uint32_t i = 0; i < std::min(qa, qb); ++i) {
    const fb::QuantOp *x = a.quant_ops()->Get(i), *y = b.quant_ops()->Get(i);
    if (x->step() != y->step() || x->kind() != y->kind() || x->scale_dtype() != y->scale_dtype() ||
        x->block()->Get(0) != y->block()->Get(0) || x->block()->Get(1) != y->block()->Get(1) ||
        x->origin()->Get(0) != y->origin()->Get(0) || x->origin()->Get(1) != y->origin()->Get(1) ||
        !SameRegionRef(a, x->scale(), b, y->scale()))
      return "quant op of step " + std::to_string(x->step()) + ": " + QuantKindName(x->kind()) + " -> step " +
             std::to_string(y->step()) + ": " + QuantKindName(y->kind()) + " (kind, blocks, origin or scales)";
  }
  if (qa != qb) return "quant ops " + std::to_string(qa) + " -> " + std::to_string(qb);
  return "";
}

struct Delta {
  uint64_t a = 0, b = 0;
  int64_t d() const { return static_cast<int64_t>(b) - static_cast<int64_t>(a); }
  uint64_t mag() const { return a > b ? a - b : b - a; }
};

ordered_json AB(uint64_t a, uint64_t b) { return {{"a", a}, {"b", b}, {"delta", static_cast<int64_t>(b - a)}}; }

std::vector<uint32_t> Keys(const std::map<uint32_t, uint64_t>& m) {
  std::vector<uint32_t> k;
  for (auto& [r, v] : m) k.push_back(r);
  return k;
}

// Ranks whose bytes differ between two per-rank maps (a rank absent from one counts).
size_t OtherAmounts(const std::map<uint32_t, uint64_t>& a, const std::map<uint32_t, uint64_t>& b) {
  size_t n = 0;
  for (auto& [r, v] : a) {
    auto it = b.find(r);
    n += it == b.end() || it->second != v;
  }
  for (auto& [r, v] : b) n += !a.count(r);
  return n;
}

}  // namespace

void AddDiffCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "diff",
      "Compare two plans. They are equivalent when every rank runs the same program step for step\n"
      "(same buffers, fragments, staging size, rounds, and steps with the same peers, channels, bytes\n"
      "and regions); a plan differing only in compiler version, digest or spec names is equivalent,\n"
      "and the differences are noted. Otherwise the report says what changed: inputs, bytes per\n"
      "channel, per rank and per peer pair (largest changes first), rounds and staging, and which\n"
      "tensors are read from or written to different ranks. Regions print in CuTe (shape):(stride).\n"
      "Exit status, like diff(1): 0 equivalent, 1 different, 2 error (unreadable file, not a plan).\n"
      "Example:\n"
      "  reshard diff tp4.rsplan tp2.rsplan --top 5\n"
      "  reshard diff a.rsplan b.rsplan --json | jq .totals");
  struct Opts {
    std::string a, b;
    size_t top = 10;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("a", o->a, "the first plan (.rsplan)")->required();
  cmd->add_option("b", o->b, "the second plan (.rsplan)")->required();
  cmd->add_option("--top", o->top, "ranks, peer pairs, rounds and tensors to list (largest changes first)");
  cmd->add_flag("--json", o->json, "print the comparison as JSON");
  cmd->callback([o, &exit_code] {
    Plan pa = Plan::open(o->a), pb = Plan::open(o->b);
    const fb::Plan &ra = pa.root(), &rb = pb.root();
    ordered_json j;
    j["a"] = o->a;
    j["b"] = o->b;

    // Inputs and metadata.
    // References into an ordered_json die when a key is added, so the sections
    // are built apart and put together at the end.
    ordered_json inputs = ordered_json::array();
    auto field = [&](const char* name, const std::string& x, const std::string& y) {
      if (x != y) inputs.push_back({{"field", name}, {"a", x}, {"b", y}});
    };
    field("compiler_version", Str(ra.compiler_version()), Str(rb.compiler_version()));
    field("schema_version", std::to_string(ra.schema_version()), std::to_string(rb.schema_version()));
    field("digest", Str(ra.digest()), Str(rb.digest()));
    field("strategy", report::StrategyName(ra.strategy()), report::StrategyName(rb.strategy()));
    field("model", Str(ra.model()), Str(rb.model()));
    field("source_layout", Str(ra.source_layout()), Str(rb.source_layout()));
    field("dest_layout", Str(ra.dest_layout()), Str(rb.dest_layout()));
    field("cluster", Str(ra.cluster()), Str(rb.cluster()));
    auto limit = [](uint64_t b) { return std::to_string(b) + " (" + Bytes(b) + ")"; };
    field("staging_limit", limit(ra.staging_limit()), limit(rb.staging_limit()));
    if (Vec(ra.domain()) != Vec(rb.domain())) {
      auto domains = [](const fb::Plan& p) {
        std::vector<uint64_t> d = Vec(p.domain());
        uint64_t n = d.empty() ? 0 : *std::max_element(d.begin(), d.end()) + 1;
        return std::to_string(n) + (n == 1 ? " NVLink domain" : " NVLink domains");
      };
      std::string x = domains(ra), y = domains(rb);
      if (x == y) x += " (ranks placed differently)";
      inputs.push_back({{"field", "domains"}, {"a", x}, {"b", y}});
    }

    // Equivalence: same ranks, tensors and programs.
    std::vector<std::string> why;
    uint32_t na = pa.num_ranks(), nb = pb.num_ranks();
    if (na != nb) why.push_back("global ranks " + std::to_string(na) + " -> " + std::to_string(nb));
    if (Vec(ra.src_global()) != Vec(rb.src_global()) || Vec(ra.dst_global()) != Vec(rb.dst_global()))
      why.push_back("training or inference ranks sit at other global ranks (" +
                    std::to_string(ra.src_global() ? ra.src_global()->size() : 0) + "+" +
                    std::to_string(ra.dst_global() ? ra.dst_global()->size() : 0) + " -> " +
                    std::to_string(rb.src_global() ? rb.src_global()->size() : 0) + "+" +
                    std::to_string(rb.dst_global() ? rb.dst_global()->size() : 0) + ")");
    uint32_t ta = ra.tensors() ? ra.tensors()->size() : 0, tb = rb.tensors() ? rb.tensors()->size() : 0;
    bool same_tensors = ta == tb;
    for (uint32_t t = 0; same_tensors && t < ta; ++t) {
      const fb::Tensor *x = ra.tensors()->Get(t), *y = rb.tensors()->Get(t);
      same_tensors = Str(x->name()) == Str(y->name()) && x->dtype() == y->dtype() && Vec(x->lo()) == Vec(y->lo()) &&
                     Vec(x->hi()) == Vec(y->hi());
    }
    if (!same_tensors) why.push_back("tensor tables differ (" + std::to_string(ta) + " -> " + std::to_string(tb) + ")");
    ordered_json progs = ordered_json::object();
    uint32_t common = std::min(na, nb), differing = 0;
    ordered_json first = ordered_json::array();
    for (uint32_t r = 0; r < common; ++r) {
      std::string d = ProgramDifference(pa.program(r), pb.program(r));
      if (d.empty()) continue;
      if (differing++ < o->top) first.push_back({{"rank", r}, {"difference", d}});
    }
    progs["compared"] = common;
    progs["differing"] = differing;
    progs["differences"] = first;
    if (differing) why.push_back(std::to_string(differing) + " of " + std::to_string(common) + " ranks run different programs");
    const bool equivalent = why.empty();
    j["equivalent"] = equivalent;
    j["why"] = why;
    j["inputs"] = inputs;
    j["programs"] = progs;

    // Figures.
    const report::PlanStats sa = report::Collect(pa, true), sb = report::Collect(pb, true);
    j["totals"] = {{"net", {{"bytes", AB(sa.bytes[0], sb.bytes[0])}, {"messages", AB(sa.messages[0], sb.messages[0])}}},
                   {"nvlink", {{"bytes", AB(sa.bytes[1], sb.bytes[1])}, {"messages", AB(sa.messages[1], sb.messages[1])}}}};
    j["rounds"] = AB(ra.num_rounds(), rb.num_rounds());
    j["staging"] = {{"limit", AB(ra.staging_limit(), rb.staging_limit())},
                    {"max_per_rank", AB(sa.max_staging, sb.max_staging)}};

    // Per rank: the four channel directions; largest total change first.
    struct RankRow {
      uint32_t rank;
      Delta f[4];  // net out, net in, nvlink out, nvlink in
      uint64_t change = 0;
    };
    std::vector<RankRow> rows;
    for (uint32_t r = 0; r < std::max(na, nb); ++r) {
      RankRow row{r, {}, 0};
      auto fill = [&](const report::PlanStats& s, bool is_b) {
        if (r >= s.ranks) return;
        const report::RankStats& t = s.rank[r];
        uint64_t v[4] = {t.sent[0], t.received[0], t.sent[1], t.received[1]};
        for (int k = 0; k < 4; ++k) (is_b ? row.f[k].b : row.f[k].a) = v[k];
      };
      fill(sa, false);
      fill(sb, true);
      for (auto& d : row.f) row.change += d.mag();
      if (row.change) rows.push_back(row);
    }
    std::stable_sort(rows.begin(), rows.end(), [](const RankRow& x, const RankRow& y) { return x.change > y.change; });
    ordered_json jr = ordered_json::array();
    for (size_t i = 0; i < rows.size() && i < o->top; ++i) {
      const RankRow& w = rows[i];
      std::string side_a = w.rank < na ? report::Side(pa.program(w.rank)) : "absent";
      std::string side_b = w.rank < nb ? report::Side(pb.program(w.rank)) : "absent";
      jr.push_back({{"rank", w.rank}, {"side_a", side_a}, {"side_b", side_b},
                    {"net_sent", AB(w.f[0].a, w.f[0].b)}, {"net_received", AB(w.f[1].a, w.f[1].b)},
                    {"nvlink_sent", AB(w.f[2].a, w.f[2].b)}, {"nvlink_received", AB(w.f[3].a, w.f[3].b)}});
    }
    j["per_rank"] = jr;
    j["ranks_changed"] = rows.size();

    // Per peer pair and channel.
    std::vector<std::pair<uint64_t, Delta>> pairs;
    for (auto& [k, v] : sa.flows) {
      auto it = sb.flows.find(k);
      Delta d{v, it == sb.flows.end() ? 0 : it->second};
      if (d.mag()) pairs.push_back({k, d});
    }
    for (auto& [k, v] : sb.flows)
      if (!sa.flows.count(k)) pairs.push_back({k, Delta{0, v}});
    std::sort(pairs.begin(), pairs.end(), [](const auto& x, const auto& y) {
      return x.second.mag() != y.second.mag() ? x.second.mag() > y.second.mag() : x.first < y.first;
    });
    ordered_json jp = ordered_json::array();
    for (size_t i = 0; i < pairs.size() && i < o->top; ++i) {
      auto [k, d] = pairs[i];
      jp.push_back({{"from", report::FlowFrom(k)}, {"to", report::FlowTo(k)},
                    {"channel", report::FlowChannel(k) ? "nvlink" : "net"}, {"bytes", AB(d.a, d.b)}});
    }
    j["per_pair"] = jp;
    j["pairs_changed"] = pairs.size();

    // Per round.
    ordered_json jrd = ordered_json::array();
    size_t rounds_changed = 0;
    for (size_t rd = 0; rd < std::max(sa.rounds.size(), sb.rounds.size()); ++rd) {
      std::array<uint64_t, 3> x{0, 0, 0}, y{0, 0, 0};
      if (rd < sa.rounds.size()) x = sa.rounds[rd];
      if (rd < sb.rounds.size()) y = sb.rounds[rd];
      if (x == y) continue;
      if (rounds_changed++ < o->top)
        jrd.push_back({{"round", rd}, {"net", AB(x[0], y[0])}, {"nvlink", AB(x[1], y[1])}, {"messages", AB(x[2], y[2])}});
    }
    j["per_round"] = jrd;
    j["rounds_changed"] = rounds_changed;

    // Tensors, matched by name: routed differently when other ranks (or other
    // amounts per rank) read them out of source buffers or write them into
    // destination buffers, or a different share goes without staging.
    struct TensorRow {
      std::string name, layout;
      const report::TensorStats *a = nullptr, *b = nullptr;
      uint64_t change = 0;
    };
    std::map<std::string, TensorRow> by_name;
    static const report::TensorStats kEmpty;
    // A family that exists for separate intervals of a layer dim is one plan
    // tensor per interval, all of one name: those rows also say the interval.
    std::map<std::string, int> count_a, count_b;
    for (uint32_t t = 0; t < ta; ++t) ++count_a[Str(ra.tensors()->Get(t)->name())];
    for (uint32_t t = 0; t < tb; ++t) ++count_b[Str(rb.tensors()->Get(t)->name())];
    auto key = [&](const fb::Tensor* x) {
      std::string k = Str(x->name());
      if (count_a[k] <= 1 && count_b[k] <= 1) return k;
      const uint32_t ns = x->stack_dims() ? x->stack_dims()->size() : 0;
      for (uint32_t d = 0; d < ns; ++d)
        k += " " + Str(x->stack_dims()->Get(d)) + " [" + std::to_string(x->lo()->Get(d)) + ", " +
             std::to_string(x->hi()->Get(d)) + ")";
      return k;
    };
    for (uint32_t t = 0; t < ta; ++t) {
      TensorRow& row = by_name[key(ra.tensors()->Get(t))];
      row.layout = report::TensorLayout(*ra.tensors()->Get(t));
      row.a = &sa.tensors[t];
    }
    for (uint32_t t = 0; t < tb; ++t) {
      TensorRow& row = by_name[key(rb.tensors()->Get(t))];
      if (row.layout.empty()) row.layout = report::TensorLayout(*rb.tensors()->Get(t));
      row.b = &sb.tensors[t];
    }
    std::vector<TensorRow> trows;
    for (auto& [name, row] : by_name) {
      row.name = name;
      const report::TensorStats& x = row.a ? *row.a : kEmpty;
      const report::TensorStats& y = row.b ? *row.b : kEmpty;
      if (row.a && row.b && x.read == y.read && x.written == y.written && x.direct_bytes == y.direct_bytes) continue;
      row.change = Delta{x.read_bytes, y.read_bytes}.mag() + Delta{x.written_bytes, y.written_bytes}.mag() +
                   Delta{x.direct_bytes, y.direct_bytes}.mag();
      if (row.change == 0) row.change = 1;  // same totals, other ranks
      trows.push_back(row);
    }
    std::stable_sort(trows.begin(), trows.end(),
                     [](const TensorRow& x, const TensorRow& y) { return x.change > y.change; });
    ordered_json jt = ordered_json::array();
    for (size_t i = 0; i < trows.size() && i < o->top; ++i) {
      const TensorRow& w = trows[i];
      const report::TensorStats& x = w.a ? *w.a : kEmpty;
      const report::TensorStats& y = w.b ? *w.b : kEmpty;
      std::string status = !w.a ? "only in b" : !w.b ? "only in a" : "routed differently";
      jt.push_back({{"name", w.name},
                    {"layout", w.layout},
                    {"status", status},
                    {"read", AB(x.read_bytes, y.read_bytes)},
                    {"written", AB(x.written_bytes, y.written_bytes)},
                    {"direct", AB(x.direct_bytes, y.direct_bytes)},
                    {"ranks_reading_other_amounts", OtherAmounts(x.read, y.read)},
                    {"ranks_writing_other_amounts", OtherAmounts(x.written, y.written)},
                    {"sources", {{"a", report::RankRanges(Keys(x.read))}, {"b", report::RankRanges(Keys(y.read))}}},
                    {"destinations",
                     {{"a", report::RankRanges(Keys(x.written))}, {"b", report::RankRanges(Keys(y.written))}}}});
    }
    j["tensors"] = jt;
    j["tensors_changed"] = trows.size();
    j["unattributed_bytes"] = AB(sa.unattributed_bytes, sb.unattributed_bytes);
    exit_code = equivalent ? 0 : 1;
    if (o->json) {
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }

    // Text.
    std::printf("a: %s\nb: %s\n", o->a.c_str(), o->b.c_str());
    if (equivalent) {
      std::printf("equivalent: all %u ranks run the same programs step for step\n", common);
      for (auto& in : inputs)
        std::printf("  note: %s differs: %s -> %s\n", in["field"].get<std::string>().c_str(),
                    in["a"].get<std::string>().c_str(), in["b"].get<std::string>().c_str());
      return;
    }
    std::printf("different: %s\n", why.front().c_str());
    for (size_t i = 1; i < why.size(); ++i) std::printf("           %s\n", why[i].c_str());
    for (auto& d : first)
      std::printf("  rank %u: %s\n", d["rank"].get<uint32_t>(), d["difference"].get<std::string>().c_str());
    if (!inputs.empty()) std::printf("inputs:\n");
    for (auto& in : inputs)
      std::printf("  %-16s %s -> %s\n", in["field"].get<std::string>().c_str(), in["a"].get<std::string>().c_str(),
                  in["b"].get<std::string>().c_str());
    std::printf("totals:\n");
    for (int ch = 0; ch < 2; ++ch)
      std::printf("  %-7s %12s -> %-12s %12s (%s), messages %llu -> %llu\n", ch ? "nvlink" : "net",
                  Bytes(sa.bytes[ch]).c_str(), Bytes(sb.bytes[ch]).c_str(),
                  report::SignedBytes(static_cast<int64_t>(sb.bytes[ch] - sa.bytes[ch])).c_str(),
                  report::Percent(sa.bytes[ch], sb.bytes[ch]).c_str(),
                  static_cast<unsigned long long>(sa.messages[ch]), static_cast<unsigned long long>(sb.messages[ch]));
    std::printf("rounds %u -> %u; staging per rank at most %s -> %s (limit %s -> %s)\n", ra.num_rounds(),
                rb.num_rounds(), Bytes(sa.max_staging).c_str(), Bytes(sb.max_staging).c_str(),
                Bytes(ra.staging_limit()).c_str(), Bytes(rb.staging_limit()).c_str());
    if (!rows.empty()) {
      std::printf("per rank (%zu changed, largest first):\n  %6s %-16s %-16s %12s %12s %12s %12s\n", rows.size(),
                  "rank", "side a", "side b", "net out", "net in", "nvlink out", "nvlink in");
      for (size_t i = 0; i < rows.size() && i < o->top; ++i) {
        const RankRow& w = rows[i];
        std::printf("  %6u %-16s %-16s", w.rank, jr[i]["side_a"].get<std::string>().c_str(),
                    jr[i]["side_b"].get<std::string>().c_str());
        for (const Delta& d : w.f) std::printf(" %12s", report::SignedBytes(d.d()).c_str());
        std::printf("\n");
      }
    }
    if (!pairs.empty()) {
      std::printf("per peer pair (%zu changed, largest first):\n", pairs.size());
      for (size_t i = 0; i < pairs.size() && i < o->top; ++i) {
        auto [k, d] = pairs[i];
        std::printf("  %6u -> %-6u %-6s %12s -> %-12s %12s\n", report::FlowFrom(k), report::FlowTo(k),
                    report::FlowChannel(k) ? "nvlink" : "net", Bytes(d.a).c_str(), Bytes(d.b).c_str(),
                    report::SignedBytes(d.d()).c_str());
      }
    }
    if (rounds_changed) {
      std::printf("per round (%zu changed):\n", rounds_changed);
      for (auto& x : jrd)
        std::printf("  %6llu net %s -> %s, nvlink %s -> %s\n", x["round"].get<unsigned long long>(),
                    Bytes(x["net"]["a"]).c_str(), Bytes(x["net"]["b"]).c_str(), Bytes(x["nvlink"]["a"]).c_str(),
                    Bytes(x["nvlink"]["b"]).c_str());
    }
    if (trows.empty())
      std::printf("tensors: all %zu read from and written to the same ranks, in the same amounts\n", by_name.size());
    if (!trows.empty()) {
      std::printf("tensors (%zu of %zu routed differently; read from sources / written to destinations):\n",
                  trows.size(), by_name.size());
      for (auto& x : jt)
        std::printf("  %s %s: %s\n    read %s -> %s from ranks [%s] -> [%s], %zu ranks read other amounts\n"
                    "    written %s -> %s to ranks [%s] -> [%s], %zu ranks write other amounts\n",
                    x["name"].get<std::string>().c_str(), x["layout"].get<std::string>().c_str(),
                    x["status"].get<std::string>().c_str(), Bytes(x["read"]["a"]).c_str(),
                    Bytes(x["read"]["b"]).c_str(), x["sources"]["a"].get<std::string>().c_str(),
                    x["sources"]["b"].get<std::string>().c_str(), x["ranks_reading_other_amounts"].get<size_t>(),
                    Bytes(x["written"]["a"]).c_str(), Bytes(x["written"]["b"]).c_str(),
                    x["destinations"]["a"].get<std::string>().c_str(),
                    x["destinations"]["b"].get<std::string>().c_str(), x["ranks_writing_other_amounts"].get<size_t>());
    }
  });
}

}  // namespace reshard::cli
