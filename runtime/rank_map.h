// Plans whose idle ranks have no process. A transport connects either every
// plan rank (transport rank = plan rank) or only the active ones (transport
// rank i = Plan::active_ranks()[i]); programs name peers by plan rank, so in
// the second case the session talks through RankMappedTransport.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/plan.h"
#include "runtime/transport.h"

namespace reshard {

/// The plan rank transport rank `t` plays on a transport of `size` ranks:
/// t itself (every plan rank has a process) or active_ranks()[t] (only the
/// active ones); -1 when `size` is neither.
int64_t PlanRankOf(const Plan& plan, uint32_t size, uint32_t t);

/// Why `transport` cannot carry plan rank `plan_rank` ("" when it can), as
/// a user reads it: the counts and the mapping expected.
std::string RankMismatch(const Plan& plan, uint32_t plan_rank, const Transport& transport);

/// Presents a transport over the active ranks as one over every plan rank.
class RankMappedTransport : public Transport {
 public:
  RankMappedTransport(const Plan& plan, Transport& inner);
  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  size_t post_send(uint32_t peer, uint64_t seq, const void* data, size_t bytes) override;
  size_t post_recv(uint32_t peer, uint64_t seq, void* data, size_t bytes) override;
  size_t post(bool send, int channel, uint32_t peer, uint64_t seq, void* data, size_t bytes) override;
  void start() override { inner_.start(); }
  void wait(size_t handle, Clock::time_point deadline) override { inner_.wait(handle, deadline); }
  void reset() override { inner_.reset(); }
  void abandon() override { inner_.abandon(); }
  Kernels& kernels() override { return inner_.kernels(); }

 private:
  uint32_t Peer(uint32_t plan_rank) const;

  Transport& inner_;
  std::vector<int64_t> process_;  // plan rank -> transport rank, -1 idle
  uint32_t rank_, size_;
};

}  // namespace reshard
