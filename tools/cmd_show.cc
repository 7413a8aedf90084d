// reshard show: what a plan moves, per channel, per rank, per round.
#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>

#include "runtime/error.h"
#include "runtime/plan.h"
#include "tools/commands.h"
#include "tools/plan_report.h"

namespace reshard::cli {
namespace {

using report::Bytes;

bool IsComm(fb::StepKind k) { return k == fb::StepKind::send || k == fb::StepKind::recv || k == fb::StepKind::forward; }

unsigned long long U(uint64_t v) { return static_cast<unsigned long long>(v); }

}  // namespace

// "process 0-3: plan ranks 0-3 (train 0-3); process 4-7: plan ranks 8-11 (infer 0-3)": runs of
// consecutive processes whose plan ranks and side ranks are consecutive too.
std::string ProcessMap(const Plan& plan) {
  const std::vector<uint32_t>& active = plan.active_ranks();
  std::string out;
  for (size_t i = 0; i < active.size();) {
    const fb::Program* a = plan.root().programs()->Get(active[i]);
    const bool train = a->src_rank() >= 0, infer = a->dst_rank() >= 0;
    auto side_rank = [&](const fb::Program* p) { return train ? p->src_rank() : infer ? p->dst_rank() : -1; };
    size_t j = i;
    while (j + 1 < active.size() && active[j + 1] == active[j] + 1) {
      const fb::Program* b = plan.root().programs()->Get(active[j + 1]);
      if ((b->src_rank() >= 0) != train || (b->dst_rank() >= 0) != infer) break;
      if (side_rank(b) != side_rank(plan.root().programs()->Get(active[j])) + 1 && side_rank(b) >= 0) break;
      ++j;
    }
    auto range = [](int64_t x, int64_t y) { return x == y ? std::to_string(x) : std::to_string(x) + "-" + std::to_string(y); };
    const fb::Program* last = plan.root().programs()->Get(active[j]);
    std::string side = train && infer ? "train and infer" : train ? "train " + range(a->src_rank(), last->src_rank())
                                                        : infer   ? "infer " + range(a->dst_rank(), last->dst_rank())
                                                                  : "no side";
    out += std::string(out.empty() ? "" : "; ") + (i == j ? "process " : "processes ") + range(i, j) + ": plan rank" +
           (i == j ? " " : "s ") + range(active[i], active[j]) + " (" + side + ")";
    i = j + 1;
  }
  return out;
}

void AddShowCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "show",
      "Summarize a plan: inputs, bytes per channel, per rank and per round; with --rank, that rank's\n"
      "buffers and steps, regions in CuTe (shape):(stride) notation with the buffer they address.\n"
      "Example:\n"
      "  reshard show qwen3.rsplan --top 8\n"
      "  reshard show qwen3.rsplan --rank 130      # 'w13_weight' @0 (4,16):(16,1) ...");
  struct Opts {
    std::string plan;
    int64_t rank = -1;
    bool json = false;
    size_t top = 16;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("plan", o->plan, "plan file (.rsplan)")->required();
  cmd->add_option("--rank", o->rank, "show this global rank's program step by step");
  cmd->add_option("--top", o->top, "ranks and rounds to list in the text summary (busiest first)");
  cmd->add_flag("--json", o->json, "print everything as JSON");
  cmd->callback([o, &exit_code] {
    Plan plan = Plan::open(o->plan);
    const fb::Plan& root = plan.root();
    uint32_t n = plan.num_ranks();
    if (o->rank >= static_cast<int64_t>(n))
      throw Error("--rank " + std::to_string(o->rank) + ": the plan has ranks 0.." + std::to_string(n - 1));
    const report::PlanStats st = report::Collect(plan, false);
    auto str = [](const flatbuffers::String* s) { return s ? s->str() : std::string(); };
    if (o->json) {
      nlohmann::ordered_json j;
      j["plan"] = o->plan;
      j["schema_version"] = root.schema_version();
      j["compiler_version"] = str(root.compiler_version());
      j["digest"] = str(root.digest());
      j["content_digest"] = plan.content_digest().hex();
      j["strategy"] = report::StrategyName(root.strategy());
      j["model"] = str(root.model());
      j["source_layout"] = str(root.source_layout());
      j["dest_layout"] = str(root.dest_layout());
      j["cluster"] = str(root.cluster());
      j["ranks"] = n;
      j["active_ranks"] = plan.active_ranks();
      j["processes"] = plan.active_ranks().size();
      j["rounds"] = root.num_rounds();
      j["staging_limit"] = root.staging_limit();
      if (const fb::RoundFill* f = root.round_fill()) {  // how the rounds were filled (compile --fill-of reads it)
        j["round_fill"] = {{"round_fill", f->proportional() ? "proportional" : "greedy"},
                           {"min_share", f->min_share()},
                           {"split_share", f->split_share()},
                           {"nic_reserve", f->nic_reserve()},
                           {"staging_fill", f->staging_fill()},
                           {"stripe_mib", f->stripe_mib()}};
      }
      j["net"] = {{"bytes", st.bytes[0]}, {"messages", st.messages[0]}};
      j["nvlink"] = {{"bytes", st.bytes[1]}, {"messages", st.messages[1]}};
      auto& jr = j["per_rank"] = nlohmann::ordered_json::array();
      for (uint32_t r = 0; r < n; ++r) {
        if (o->rank >= 0 && r != o->rank) continue;
        const report::RankStats& t = st.rank[r];
        const fb::Program& p = plan.program(r);
        nlohmann::ordered_json x = {{"rank", r},
                                    {"side", report::Side(p)},
                                    {"process", plan.process_of(r) >= 0 ? nlohmann::ordered_json(plan.process_of(r))
                                                                         : nlohmann::ordered_json(nullptr)},
                                    {"domain", report::DomainOf(root, r)},
                                    {"net_sent", t.sent[0]},
                                    {"nvlink_sent", t.sent[1]},
                                    {"net_received", t.received[0]},
                                    {"nvlink_received", t.received[1]},
                                    {"packs", t.packs},
                                    {"unpacks", t.unpacks},
                                    {"copies", t.copies},
                                    {"staging_bytes", t.staging},
                                    {"steps", t.steps}};
        if (o->rank >= 0) {
          auto& steps = x["program"] = nlohmann::ordered_json::array();
          std::map<uint32_t, const fb::QuantOp*> quant;  // by step
          if (p.quant_ops() != nullptr)
            for (const fb::QuantOp* op : *p.quant_ops()) quant[op->step()] = op;
          for (uint32_t rd = 0; rd + 1 < p.round_begin()->size(); ++rd)
            for (uint32_t i = p.round_begin()->Get(rd); i < p.round_begin()->Get(rd + 1); ++i) {
              const fb::Step* s = p.steps()->Get(i);
              nlohmann::ordered_json js = {{"round", rd}, {"kind", StepKindName(s->kind())}, {"bytes", s->bytes()}};
              if (IsComm(s->kind())) js["peer"] = s->peer(), js["channel"] = report::ChannelName(s->channel());
              if (s->src() != kNone) js["src"] = report::RegionText(p, *p.regions()->Get(s->src()));
              if (s->dst() != kNone) js["dst"] = report::RegionText(p, *p.regions()->Get(s->dst()));
              js["staging"] = s->staging();
              if (auto q = quant.find(i); q != quant.end()) {
                const fb::QuantOp& op = *q->second;
                js["quant"] = {{"kind", QuantKindName(op.kind())},
                               {"block", {op.block()->Get(0), op.block()->Get(1)}},
                               {"origin", {op.origin()->Get(0), op.origin()->Get(1)}},
                               {"scale_dtype", DtypeName(op.scale_dtype())}};
                if (op.scale() != kNone) js["quant"]["scale"] = report::RegionText(p, *p.regions()->Get(op.scale()));
              }
              steps.push_back(js);
            }
        }
        jr.push_back(x);
      }
      auto& jrd = j["per_round"] = nlohmann::ordered_json::array();
      for (size_t rd = 0; rd < st.rounds.size(); ++rd)
        jrd.push_back({{"round", rd}, {"net", st.rounds[rd][0]}, {"nvlink", st.rounds[rd][1]},
                       {"messages", st.rounds[rd][2]}});
      std::printf("%s\n", j.dump(2).c_str());
      exit_code = 0;
      return;
    }
    std::printf("plan %s: %s strategy, model '%s', '%s' -> '%s', cluster '%s'\n", o->plan.c_str(),
                report::StrategyName(root.strategy()), str(root.model()).c_str(), str(root.source_layout()).c_str(),
                str(root.dest_layout()).c_str(), str(root.cluster()).c_str());
    std::printf("  %u global ranks (%u train, %u infer), %u rounds, staging limit %s per rank, schema %u, compiler %s, "
                "inputs digest %s\n",
                n, root.src_global() ? root.src_global()->size() : 0, root.dst_global() ? root.dst_global()->size() : 0,
                root.num_rounds(), Bytes(root.staging_limit()).c_str(), root.schema_version(),
                root.compiler_version() ? root.compiler_version()->c_str() : "?",
                root.digest() ? root.digest()->c_str() : "?");
    {
      const size_t active = plan.active_ranks().size();
      if (active == n) {
        std::printf("  processes: %zu, process i plays plan rank i\n", active);
      } else {
        std::printf("  processes: %zu for the %zu active ranks (%zu idle ranks need none); a transport over the active "
                    "ranks: process i plays plan rank Plan.active_ranks[i]: %s\n",
                    active, active, n - active, ProcessMap(plan).c_str());
      }
    }
    if (const fb::RoundFill* f = root.round_fill()) {
      std::printf("  %s (compile --fill-of this plan fills a recompile so)\n",
                  report::RoundFillText(f->proportional(), f->min_share(), f->staging_fill(), f->split_share(),
                                        f->nic_reserve(), f->stripe_mib()).c_str());
    }
    std::printf("  content digest %s%s (every rank's plan must have it: compared at connect)\n",
                plan.content_digest().hex().c_str(), plan.carries_content_digest() ? "" : ", computed: an older plan file");
    std::printf("totals: net %s in %llu messages, nvlink %s in %llu messages\n", Bytes(st.bytes[0]).c_str(),
                U(st.messages[0]), Bytes(st.bytes[1]).c_str(), U(st.messages[1]));
    if (o->rank >= 0) {
      uint32_t r = static_cast<uint32_t>(o->rank);
      const fb::Program& p = plan.program(r);
      std::printf("rank %u (%s, NVLink domain %u): %u buffers, staging %s, %u steps\n", r, report::Side(p).c_str(),
                  report::DomainOf(root, r), p.buffers() ? p.buffers()->size() : 0, Bytes(p.staging_bytes()).c_str(),
                  p.steps() ? p.steps()->size() : 0);
      if (p.buffers())
        for (uint32_t b = 0; b < p.buffers()->size(); ++b) {
          const fb::Buffer* buf = p.buffers()->Get(b);
          std::string shape;
          for (uint32_t k = 0; buf->shape() && k < buf->shape()->size(); ++k) {
            if (k) shape += ",";
            shape += std::to_string(buf->shape()->Get(k));
          }
          // A buffer holding the model's values plus a constant says so (layout "transform").
          char offset[48] = "";
          if (buf->offset() != 0) std::snprintf(offset, sizeof offset, " offset %g", static_cast<double>(buf->offset()));
          std::printf("  buffer %u: %s %s[%s]%s\n", b, buf->name()->c_str(), DtypeName(buf->dtype()), shape.c_str(),
                      offset);
        }
      for (uint32_t rd = 0; rd + 1 < p.round_begin()->size(); ++rd) {
        std::printf("  round %u\n", rd);
        for (uint32_t i = p.round_begin()->Get(rd); i < p.round_begin()->Get(rd + 1); ++i) {
          const fb::Step* s = p.steps()->Get(i);
          std::printf("    %u %s\n", i, report::StepText(p, *s).c_str());
        }
      }
      exit_code = 0;
      return;
    }
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return st.rank[a].Load() > st.rank[b].Load(); });
    size_t top = std::min<size_t>(o->top, n);
    std::printf("per rank (busiest %zu of %u):\n  %6s %-18s %12s %12s %12s %12s %8s %8s %12s\n", top, n, "rank", "side",
                "net out", "net in", "nvlink out", "nvlink in", "packs", "unpacks", "staging");
    for (size_t i = 0; i < top; ++i) {
      uint32_t r = order[i];
      const report::RankStats& t = st.rank[r];
      std::printf("  %6u %-18s %12s %12s %12s %12s %8llu %8llu %12s\n", r, report::Side(plan.program(r)).c_str(),
                  Bytes(t.sent[0]).c_str(), Bytes(t.received[0]).c_str(), Bytes(t.sent[1]).c_str(),
                  Bytes(t.received[1]).c_str(), U(t.packs), U(t.unpacks), Bytes(t.staging).c_str());
    }
    std::printf("per round (first %zu of %zu):\n  %6s %12s %12s %10s\n", std::min<size_t>(o->top, st.rounds.size()),
                st.rounds.size(), "round", "net", "nvlink", "messages");
    for (size_t rd = 0; rd < st.rounds.size() && rd < o->top; ++rd)
      std::printf("  %6zu %12s %12s %10llu\n", rd, Bytes(st.rounds[rd][0]).c_str(), Bytes(st.rounds[rd][1]).c_str(),
                  U(st.rounds[rd][2]));
    exit_code = 0;
  });
}

}  // namespace reshard::cli
