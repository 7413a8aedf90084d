// reshard show: what a plan moves, per channel, per rank, per round.
#include <cstdio>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/plan.h"
#include "tools/commands.h"

namespace reshard::cli {
namespace {

std::string Bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  else if (b >= (1ull << 10)) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

struct RankTotals {
  uint64_t sent[2] = {0, 0}, recvd[2] = {0, 0}, msgs_out = 0, msgs_in = 0, packs = 0, unpacks = 0, copies = 0;
  uint64_t staging = 0, steps = 0, rounds = 0;
};

}  // namespace

void AddShowCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("show",
                                 "Summarize a plan: inputs, bytes per channel, per rank and per round;\n"
                                 "with --rank, that rank's buffers and steps (regions in CuTe shape:stride notation).");
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
    std::vector<RankTotals> ranks(n);
    std::map<uint32_t, std::array<uint64_t, 3>> rounds;  // round -> net, nvlink, messages
    uint64_t tot[2] = {0, 0}, msgs[2] = {0, 0};
    for (uint32_t r = 0; r < n; ++r) {
      const fb::Program& p = plan.program(r);
      RankTotals& t = ranks[r];
      t.staging = p.staging_bytes();
      t.steps = p.steps() ? p.steps()->size() : 0;
      t.rounds = p.round_begin() ? p.round_begin()->size() - 1 : 0;
      for (uint32_t rd = 0; rd + 1 < (p.round_begin() ? p.round_begin()->size() : 0); ++rd) {
        for (uint32_t i = p.round_begin()->Get(rd); i < p.round_begin()->Get(rd + 1); ++i) {
          const fb::Step* s = p.steps()->Get(i);
          int ch = s->channel() == fb::Channel::nvlink ? 1 : 0;
          switch (s->kind()) {
            case fb::StepKind::send:
            case fb::StepKind::forward:
              t.sent[ch] += s->bytes(), ++t.msgs_out, tot[ch] += s->bytes(), ++msgs[ch];
              rounds[rd][ch] += s->bytes();
              ++rounds[rd][2];
              break;
            case fb::StepKind::recv: t.recvd[ch] += s->bytes(), ++t.msgs_in; break;
            case fb::StepKind::pack: ++t.packs; break;
            case fb::StepKind::unpack: ++t.unpacks; break;
            case fb::StepKind::copy: ++t.copies; break;
          }
        }
      }
    }
    auto side = [&](uint32_t r, const fb::Program& p) {
      std::string s;
      if (p.src_rank() >= 0) s += "train " + std::to_string(p.src_rank());
      if (p.dst_rank() >= 0) s += std::string(s.empty() ? "" : " + ") + "infer " + std::to_string(p.dst_rank());
      return s;
    };
    if (o->json) {
      nlohmann::ordered_json j;
      j["plan"] = o->plan;
      j["schema_version"] = root.schema_version();
      j["compiler_version"] = root.compiler_version() ? root.compiler_version()->str() : "";
      j["digest"] = root.digest() ? root.digest()->str() : "";
      j["strategy"] = root.strategy() == fb::Strategy::gather ? "gather" : "direct";
      j["model"] = root.model() ? root.model()->str() : "";
      j["source_layout"] = root.source_layout() ? root.source_layout()->str() : "";
      j["dest_layout"] = root.dest_layout() ? root.dest_layout()->str() : "";
      j["cluster"] = root.cluster() ? root.cluster()->str() : "";
      j["ranks"] = n;
      j["rounds"] = root.num_rounds();
      j["staging_limit"] = root.staging_limit();
      j["net"] = {{"bytes", tot[0]}, {"messages", msgs[0]}};
      j["nvlink"] = {{"bytes", tot[1]}, {"messages", msgs[1]}};
      auto& jr = j["per_rank"] = nlohmann::ordered_json::array();
      for (uint32_t r = 0; r < n; ++r) {
        if (o->rank >= 0 && r != o->rank) continue;
        const RankTotals& t = ranks[r];
        nlohmann::ordered_json x = {{"rank", r},
                                    {"side", side(r, plan.program(r))},
                                    {"net_sent", t.sent[0]},
                                    {"nvlink_sent", t.sent[1]},
                                    {"net_received", t.recvd[0]},
                                    {"nvlink_received", t.recvd[1]},
                                    {"packs", t.packs},
                                    {"unpacks", t.unpacks},
                                    {"copies", t.copies},
                                    {"staging_bytes", t.staging},
                                    {"steps", t.steps}};
        if (o->rank >= 0) {
          const fb::Program& p = plan.program(r);
          auto& steps = x["program"] = nlohmann::ordered_json::array();
          for (uint32_t rd = 0; rd + 1 < p.round_begin()->size(); ++rd)
            for (uint32_t i = p.round_begin()->Get(rd); i < p.round_begin()->Get(rd + 1); ++i) {
              const fb::Step* s = p.steps()->Get(i);
              nlohmann::ordered_json js = {{"round", rd}, {"kind", StepKindName(s->kind())}, {"bytes", s->bytes()}};
              if (s->kind() == fb::StepKind::send || s->kind() == fb::StepKind::recv || s->kind() == fb::StepKind::forward)
                js["peer"] = s->peer(), js["channel"] = s->channel() == fb::Channel::nvlink ? "nvlink" : "net";
              if (s->src() != kNone) js["src"] = FormatRegion(*p.regions()->Get(s->src()));
              if (s->dst() != kNone) js["dst"] = FormatRegion(*p.regions()->Get(s->dst()));
              js["staging"] = s->staging();
              steps.push_back(js);
            }
        }
        jr.push_back(x);
      }
      auto& jrd = j["per_round"] = nlohmann::ordered_json::array();
      for (auto& [rd, v] : rounds) jrd.push_back({{"round", rd}, {"net", v[0]}, {"nvlink", v[1]}, {"messages", v[2]}});
      std::printf("%s\n", j.dump(2).c_str());
      exit_code = 0;
      return;
    }
    std::printf("plan %s: %s strategy, model '%s', '%s' -> '%s', cluster '%s'\n", o->plan.c_str(),
                root.strategy() == fb::Strategy::gather ? "gather" : "direct",
                root.model() ? root.model()->c_str() : "", root.source_layout() ? root.source_layout()->c_str() : "",
                root.dest_layout() ? root.dest_layout()->c_str() : "", root.cluster() ? root.cluster()->c_str() : "");
    std::printf("  %u global ranks (%u train, %u infer), %u rounds, staging limit %s per rank, schema %u, compiler %s, "
                "digest %s\n",
                n, root.src_global() ? root.src_global()->size() : 0, root.dst_global() ? root.dst_global()->size() : 0,
                root.num_rounds(), Bytes(root.staging_limit()).c_str(), root.schema_version(),
                root.compiler_version() ? root.compiler_version()->c_str() : "?",
                root.digest() ? root.digest()->c_str() : "?");
    std::printf("totals: net %s in %llu messages, nvlink %s in %llu messages\n", Bytes(tot[0]).c_str(),
                static_cast<unsigned long long>(msgs[0]), Bytes(tot[1]).c_str(),
                static_cast<unsigned long long>(msgs[1]));
    if (o->rank >= 0) {
      uint32_t r = static_cast<uint32_t>(o->rank);
      const fb::Program& p = plan.program(r);
      std::printf("rank %u (%s): %u buffers, staging %s, %u steps\n", r, side(r, p).c_str(),
                  p.buffers() ? p.buffers()->size() : 0, Bytes(p.staging_bytes()).c_str(),
                  p.steps() ? p.steps()->size() : 0);
      if (p.buffers())
        for (uint32_t b = 0; b < p.buffers()->size(); ++b) {
          const fb::Buffer* buf = p.buffers()->Get(b);
          std::string shape;
          for (uint32_t k = 0; buf->shape() && k < buf->shape()->size(); ++k)
            shape += (k ? "," : "") + std::to_string(buf->shape()->Get(k));
          std::printf("  buffer %u: %s %s[%s]\n", b, buf->name()->c_str(), DtypeName(buf->dtype()), shape.c_str());
        }
      for (uint32_t rd = 0; rd + 1 < p.round_begin()->size(); ++rd) {
        std::printf("  round %u\n", rd);
        for (uint32_t i = p.round_begin()->Get(rd); i < p.round_begin()->Get(rd + 1); ++i) {
          const fb::Step* s = p.steps()->Get(i);
          std::string line = "    " + std::to_string(i) + " " + StepKindName(s->kind());
          if (s->kind() == fb::StepKind::send || s->kind() == fb::StepKind::recv || s->kind() == fb::StepKind::forward)
            line += (s->kind() == fb::StepKind::recv ? " from " : " to ") + std::to_string(s->peer()) + " over " +
                    (s->channel() == fb::Channel::nvlink ? "nvlink" : "net");
          line += " " + Bytes(s->bytes()) + " " + DtypeName(s->wire());
          auto reg = [&](uint32_t idx) {
            const fb::Region* rg = p.regions()->Get(idx);
            return (rg->buffer() == kNone ? std::string("staging") : "buffer " + std::to_string(rg->buffer())) + " @" +
                   std::to_string(rg->offset()) + " " + FormatRegion(*rg);
          };
          if (s->src() != kNone) line += " from " + reg(s->src());
          else if (s->kind() != fb::StepKind::recv) line += " from staging @" + std::to_string(s->staging());
          if (s->dst() != kNone) line += " into " + reg(s->dst());
          else if (s->kind() != fb::StepKind::send && s->kind() != fb::StepKind::forward) line += " into staging @" + std::to_string(s->staging());
          std::printf("%s\n", line.c_str());
        }
      }
      exit_code = 0;
      return;
    }
    std::vector<uint32_t> order(n);
    for (uint32_t r = 0; r < n; ++r) order[r] = r;
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      auto load = [&](uint32_t x) { return ranks[x].sent[0] + ranks[x].recvd[0] + ranks[x].sent[1] + ranks[x].recvd[1]; };
      return load(a) > load(b);
    });
    std::printf("per rank (busiest %zu of %u):\n  %6s %-18s %12s %12s %12s %12s %8s %8s %12s\n", std::min<size_t>(o->top, n),
                n, "rank", "side", "net out", "net in", "nvlink out", "nvlink in", "packs", "unpacks", "staging");
    for (size_t i = 0; i < std::min<size_t>(o->top, n); ++i) {
      uint32_t r = order[i];
      const RankTotals& t = ranks[r];
      std::printf("  %6u %-18s %12s %12s %12s %12s %8llu %8llu %12s\n", r, side(r, plan.program(r)).c_str(),
                  Bytes(t.sent[0]).c_str(), Bytes(t.recvd[0]).c_str(), Bytes(t.sent[1]).c_str(),
                  Bytes(t.recvd[1]).c_str(), static_cast<unsigned long long>(t.packs),
                  static_cast<unsigned long long>(t.unpacks), Bytes(t.staging).c_str());
    }
    std::printf("per round (first %zu of %zu):\n  %6s %12s %12s %10s\n", std::min<size_t>(o->top, rounds.size()),
                rounds.size(), "round", "net", "nvlink", "messages");
    size_t k = 0;
    for (auto& [rd, v] : rounds) {
      if (k++ >= o->top) break;
      std::printf("  %6u %12s %12s %10llu\n", rd, Bytes(v[0]).c_str(), Bytes(v[1]).c_str(),
                  static_cast<unsigned long long>(v[2]));
    }
    exit_code = 0;
  });
}

}  // namespace reshard::cli
