#include "runtime/rank_map.h"

#include "runtime/error.h"

namespace reshard {

int64_t PlanRankOf(const Plan& plan, uint32_t size, uint32_t t) {
  if (size == plan.num_ranks()) return t < size ? t : -1;
  const std::vector<uint32_t>& active = plan.active_ranks();
  if (size == active.size()) return t < size ? active[t] : -1;
  return -1;
}

std::string RankMismatch(const Plan& plan, uint32_t plan_rank, const Transport& transport) {
  const uint32_t n = plan.num_ranks(), size = transport.size();
  const size_t active = plan.active_ranks().size();
  const std::string counts = std::to_string(n) + " ranks" +
                             (active == n ? std::string() : ", " + std::to_string(active) + " of them active");
  if (size != n && size != active) {
    return "the transport connects " + std::to_string(size) + " ranks, the plan has " + counts +
           " (a transport connects every plan rank, or only the active ones: Plan.active_ranks)";
  }
  const int64_t want = PlanRankOf(plan, size, transport.rank());
  if (want == static_cast<int64_t>(plan_rank)) return "";
  if (size == n) return "the transport is rank " + std::to_string(transport.rank()) + "'s";
  const int64_t process = plan.process_of(plan_rank);
  if (process < 0) {
    return "plan rank " + std::to_string(plan_rank) +
           " is idle (no side, buffers or steps): it needs no process; the transport's " + std::to_string(size) +
           " ranks are the plan's active ranks, and transport rank " + std::to_string(transport.rank()) +
           " plays plan rank " + std::to_string(want);
  }
  return "on a transport over the plan's " + std::to_string(active) + " active ranks, plan rank " +
         std::to_string(plan_rank) + " is transport rank " + std::to_string(process) + " and transport rank " +
         std::to_string(transport.rank()) + " plays plan rank " + std::to_string(want) +
         " (process i plays Plan.active_ranks[i])";
}

RankMappedTransport::RankMappedTransport(const Plan& plan, Transport& inner)
    : inner_(inner), rank_(0), size_(plan.num_ranks()) {
  const std::vector<uint32_t>& active = plan.active_ranks();
  process_.assign(size_, -1);
  for (size_t i = 0; i < active.size(); ++i) process_[active[i]] = static_cast<int64_t>(i);
  rank_ = active.at(inner.rank());
}

uint32_t RankMappedTransport::Peer(uint32_t plan_rank) const {
  const int64_t t = plan_rank < process_.size() ? process_[plan_rank] : -1;
  if (t < 0) throw Error("plan rank " + std::to_string(plan_rank) + " is idle: it has no process to message");
  return static_cast<uint32_t>(t);
}

size_t RankMappedTransport::post_send(uint32_t peer, uint64_t seq, const void* data, size_t bytes) {
  return inner_.post_send(Peer(peer), seq, data, bytes);
}

size_t RankMappedTransport::post_recv(uint32_t peer, uint64_t seq, void* data, size_t bytes) {
  return inner_.post_recv(Peer(peer), seq, data, bytes);
}

size_t RankMappedTransport::post(bool send, int channel, uint32_t peer, uint64_t seq, void* data, size_t bytes) {
  return inner_.post(send, channel, Peer(peer), seq, data, bytes);
}

}  // namespace reshard
