#include "sim/workload.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "runtime/error.h"
#include "runtime/pipeline.h"

namespace reshard::sim {

LinkModel LinkModel::Of(const ClusterSpec& c) {
  LinkModel m;
  m.nic_Bps = c.nic_gbps * 1e9 / 8;
  m.nvlink_Bps = c.nvlink_GBps * 1e9;
  m.hbm_Bps = c.hbm_GBps * 1e9;
  m.nic_latency_s = c.nic_latency_us * 1e-6;
  m.nvlink_latency_s = c.nvlink_latency_us * 1e-6;
  return m;
}

namespace {

// One merged message as its sender or its receiver sees it.
struct Endpoint {
  uint32_t src, dst, round;
  uint8_t path;
  uint64_t bytes;
  auto key() const { return std::tie(src, dst, path, round, bytes); }
  bool operator<(const Endpoint& o) const { return key() < o.key(); }
  bool operator==(const Endpoint& o) const { return key() == o.key(); }
};

// Adds `bytes` to the message with `peer` in `list`, keeping first-seen order.
void Merge(std::vector<Message>& list, uint32_t peer, uint64_t bytes, bool send, bool forward) {
  const uint64_t forwarded = forward ? bytes : 0;
  for (Message& m : list) {
    if (m.peer == peer && m.send == send) {
      m.bytes += bytes;
      m.forwarded += forwarded;
      return;
    }
  }
  list.push_back({peer, bytes, send, forwarded});
}

// The bytes a step moves through HBM, counted as its read and write halves
// (local steps cost 2 x bytes / HBM: every byte read once and written once).
// A plain step reads and writes its `bytes`; a block-scaled conversion reads
// and writes different amounts - a quantize reads a whole block cover in
// BF16 and writes FP8 of part of it plus scales, an amax pack reads a part
// and writes a grid of a few bytes per block - so it counts the average of
// its regions' bytes (src read, dst and any computed scales written).
uint64_t HbmBytes(const fb::Program& prog, const fb::Step& s, const fb::QuantOp* op) {
  if (op == nullptr) return s.bytes();
  auto bytes_of = [&](uint32_t region, fb::Dtype staging_dtype) -> uint64_t {
    if (region == kNone) return 0;
    const fb::Region& r = *prog.regions()->Get(region);
    const fb::Dtype d = r.buffer() == kNone ? staging_dtype : prog.buffers()->Get(r.buffer())->dtype();
    return RegionElements(r) * DtypeSize(d);
  };
  const bool from_amax = op->kind() == fb::QuantKind::scale_from_amax;
  uint64_t read = bytes_of(s.src(), s.wire()), written = bytes_of(s.dst(), from_amax ? op->scale_dtype() : s.wire());
  if (op->kind() == fb::QuantKind::quantize) written += bytes_of(op->scale(), op->scale_dtype());
  else read += bytes_of(op->scale(), op->scale_dtype());
  return (read + written + 1) / 2;
}

}  // namespace

Workload BuildWorkload(const Plan& plan, const ClusterSpec& cluster) {
  const fb::Plan& root = plan.root();
  Workload w;
  w.num_ranks = plan.num_ranks();
  w.num_rounds = root.num_rounds();
  const uint32_t gpd = static_cast<uint32_t>(std::max<int64_t>(1, cluster.gpus_per_domain));
  w.domain.resize(w.num_ranks);
  for (uint32_t g = 0; g < w.num_ranks; ++g) w.domain[g] = g / gpd;
  if (const auto* d = root.domain(); d && d->size() == w.num_ranks) {
    for (uint32_t g = 0; g < w.num_ranks; ++g) {
      if (d->Get(g) != w.domain[g]) {
        w.warnings.push_back("the plan was compiled for other NVLink domains (cluster '" +
                             std::string(root.cluster() ? root.cluster()->str() : "") + "'; global rank " +
                             std::to_string(g) + " in domain " + std::to_string(d->Get(g)) + ", here " +
                             std::to_string(w.domain[g]) + " of '" + cluster.name +
                             "'): transfers follow this cluster's links");
        break;
      }
    }
  }
  for (int p = 0; p < 2; ++p) w.sent[p].assign(w.num_ranks, 0), w.received[p].assign(w.num_ranks, 0);
  w.ranks.resize(w.num_ranks);
  std::vector<Endpoint> sends, recvs;
  uint64_t mislabeled = 0;
  for (uint32_t g = 0; g < w.num_ranks; ++g) {
    const fb::Program& prog = plan.program(g);
    const auto* steps = prog.steps();
    const auto* rb = prog.round_begin();
    if (!steps || !rb || rb->size() < 1) continue;
    w.steps += steps->size();
    std::vector<const fb::QuantOp*> quant(steps->size(), nullptr);
    if (prog.quant_ops() != nullptr)
      for (const fb::QuantOp* op : *prog.quant_ops())
        if (op->step() < quant.size()) quant[op->step()] = op;
    const PipelineSchedule schedule = SchedulePipeline(prog, PipelineEnabled());
    for (uint32_t r = 0; r + 1 < rb->size(); ++r) {
      RankRound rr;
      rr.round = r;
      rr.early_pack = schedule.early_pack[r];
      rr.late_unpack = schedule.late_unpack[r];
      for (uint32_t i = rb->Get(r); i < rb->Get(r + 1); ++i) {
        const fb::Step* s = steps->Get(i);
        const uint64_t bytes = s->bytes();
        switch (s->kind()) {
          case fb::StepKind::pack:
          case fb::StepKind::copy:
            rr.local_bytes += HbmBytes(prog, *s, quant[i]);
            break;
          case fb::StepKind::unpack:
            rr.unpack_bytes += HbmBytes(prog, *s, quant[i]);
            break;
          case fb::StepKind::send:
          case fb::StepKind::forward:
          case fb::StepKind::recv: {
            const uint32_t peer = s->peer();
            const bool send = s->kind() != fb::StepKind::recv;
            if (peer == g) {  // to itself: a copy through HBM
              rr.local_bytes += send ? bytes : 0;
              w.self_bytes += send ? bytes : 0;
              break;
            }
            const Path path = w.domain[peer] == w.domain[g] ? Path::nvlink : Path::net;
            if ((path == Path::nvlink) != (s->channel() == fb::Channel::nvlink)) ++mislabeled;
            Merge(path == Path::net ? rr.net : rr.nvlink, peer, bytes, send, s->kind() == fb::StepKind::forward);
            break;
          }
        }
      }
      for (int p = 0; p < 2; ++p) {
        for (const Message& m : p == 0 ? rr.net : rr.nvlink) {
          Endpoint e{m.send ? g : m.peer, m.send ? m.peer : g, r, static_cast<uint8_t>(p), m.bytes};
          (m.send ? sends : recvs).push_back(e);
          (m.send ? w.sent[p][g] : w.received[p][g]) += m.bytes;
          if (m.send) {
            (p == 0 ? w.net_bytes : w.nvlink_bytes) += m.bytes;
            ++w.messages;
          }
        }
      }
      w.local_bytes += rr.local_bytes;
      w.unpack_bytes += rr.unpack_bytes;
      if (rr.local_bytes || rr.unpack_bytes || !rr.net.empty() || !rr.nvlink.empty()) w.ranks[g].push_back(std::move(rr));
    }
  }
  if (mislabeled) {
    w.warnings.push_back(std::to_string(mislabeled) +
                         " transfer steps name a channel that is not the link between their ranks on cluster '" +
                         cluster.name + "': simulated over the physical link");
  }
  std::sort(sends.begin(), sends.end());
  std::sort(recvs.begin(), recvs.end());
  if (sends != recvs) {
    auto [a, b] = std::mismatch(sends.begin(), sends.end(), recvs.begin(), recvs.end());
    const Endpoint& e = a != sends.end() && (b == recvs.end() || *a < *b) ? *a : *b;
    const bool unmatched_send = a != sends.end() && (b == recvs.end() || *a < *b);
    throw Error(plan.path() + ": round " + std::to_string(e.round) + ": " + std::to_string(e.bytes) + " bytes " +
                (unmatched_send ? "sent" : "received") + " from rank " + std::to_string(e.src) + " to rank " +
                std::to_string(e.dst) + " have no matching " + (unmatched_send ? "receive" : "send") +
                " in the same round; the plan would hang (run `reshard validate` on it)");
  }
  return w;
}

}  // namespace reshard::sim
