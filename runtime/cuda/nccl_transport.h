// Transport over NCCL point-to-point on CUDA devices. Buffers and staging are
// device memory; pack, copy and unpack run as CUDA kernels on the caller's
// stream (DeviceKernels). Each round's sends and receives go out as one NCCL
// group: net messages on one stream and communicator, nvlink messages on a
// second pair, so that the two channels overlap; an event orders them after
// the round's packs, and the executor enqueues the round's unpacks once wait()
// has seen them done, so that kernels of neighbouring rounds overlap them.
// NCCL matches messages per peer and direction in posting order and lets the
// calls of one group progress independently (only calls to the same peer run
// in order, per NCCL's point-to-point guide), so unlike Gloo the order of
// receives and sends inside the group does not serialize the two directions;
// the executor posts receives first anyway.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/device_kernels.h"
#include "runtime/transport.h"

namespace reshard {

struct NcclOptions {
  /// The communicator of the net channel, over all plan ranks (rank = plan
  /// rank). Required. Non-blocking communicators (ncclConfig_t.blocking = 0)
  /// let a stalled peer be detected even while NCCL sets up connections;
  /// blocking ones work, but a peer missing at connection setup blocks there.
  /// Blocking ones are faster: each round's group is posted when
  /// ncclGroupEnd returns, where a non-blocking one is waited for (what that
  /// costs a round: docs/benchmarks.md, On a GPU).
  ncclComm_t net = nullptr;
  /// The nvlink channel's communicator (same ranks); null: nvlink messages
  /// share net's communicator and stream (no overlap).
  ncclComm_t nvlink = nullptr;
  /// The caller's stream: kernels run on it, and run() leaves it synchronized.
  /// Null: the transport creates one.
  cudaStream_t stream = nullptr;
  /// How long a round's messages may take. Past it the transport aborts the
  /// communicators (ncclCommAbort) and run() reports the step and peer.
  std::chrono::milliseconds timeout{60000};
  /// Whether the transport destroys the communicators when it is destroyed.
  bool owns_comms = false;
  /// Test hook: with one-rank communicators, present the transport as plan
  /// rank `loopback_rank` of `loopback_size` and send every message to this
  /// rank itself (NCCL send-to-self); allgather() then returns false (no
  /// hello: nothing to prove). 0: off.
  uint32_t loopback_size = 0;
  uint32_t loopback_rank = 0;
};

class NcclTransport : public Transport {
 public:
  /// Checks the communicators before any NCCL call on them: each can be an
  /// ncclComm_t of this process (not null, mapped, aligned:
  /// runtime/cuda/comm_check.h; a mapped pointer to something else NCCL
  /// itself refuses), and both have the same rank, size and device. Throws
  /// reshard::Error naming the communicator and what was found, or the failed
  /// CUDA or NCCL call.
  explicit NcclTransport(const NcclOptions& options);
  /// New one-rank communicators on `device` (one per channel), owned, in
  /// loopback as rank `rank` of `size`: for tests and benchmarks.
  /// Non-blocking unless `blocking`.
  static std::unique_ptr<NcclTransport> Loopback(int device, uint32_t rank, uint32_t size,
                                                 std::chrono::milliseconds timeout, bool blocking = false);
  /// Never throws. After a failure the communicators are aborted (and must
  /// not be destroyed by their owner).
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  size_t post_send(uint32_t peer, uint64_t seq, const void* data, size_t bytes) override;
  size_t post_recv(uint32_t peer, uint64_t seq, void* data, size_t bytes) override;
  size_t post(bool send, int channel, uint32_t peer, uint64_t seq, void* data, size_t bytes) override;
  /// Posts the round: the channel streams wait for the caller's stream, one
  /// ncclGroupStart/End holds every send and receive, the caller's stream
  /// then waits for the channel streams.
  void start() override;
  /// Polls the message's channel until its event completes, checking
  /// ncclCommGetAsyncError; at the deadline aborts the communicators.
  void wait(size_t handle, Clock::time_point deadline) override;
  void reset() override;
  /// One ncclAllGather on the net communicator, not the default's message to
  /// every peer (which would make NCCL connect every pair of ranks, 130,816
  /// pairs for the hello of a 512-rank job). `mine` goes through a
  /// device buffer on the net channel's stream; the wait polls like wait():
  /// an asynchronous error, or `deadline` passing ("no hello from every rank
  /// within 60.0 s: the all-gather of the plan digests ... did not
  /// complete"), aborts the communicators and throws. NCCL cannot say which
  /// rank is missing. In loopback (NcclOptions::loopback_size != 0) returns
  /// false and does nothing: the other ranks are this process.
  bool allgather(const void* mine, size_t bytes, void* all, Clock::time_point deadline) override;
  Kernels& kernels() override { return kernels_; }

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  bool aborted() const { return aborted_; }

 private:
  struct Op {
    bool send;
    int lane;  // 0: net stream and communicator, 1: nvlink's
    int peer;  // communicator rank
    void* data;
    size_t bytes;
  };

  void Abort() noexcept;
  // Polls the communicators until no call is in progress; throws (after
  // aborting) on an asynchronous error or at `deadline` (the message
  // `timed_out` if given, else "timed out after ... `doing`").
  void Settle(Clock::time_point deadline, const std::string& doing, const std::string& timed_out = "");
  void CheckAsync(const std::string& doing);

  ncclComm_t comm_[2] = {nullptr, nullptr};
  int lanes_ = 1;
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = false;
  bool owns_comms_ = false;
  cudaStream_t lane_stream_[2] = {nullptr, nullptr};
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_[2] = {nullptr, nullptr};
  int device_ = 0;
  uint32_t rank_ = 0, size_ = 0;
  bool loopback_ = false;
  std::chrono::milliseconds timeout_;
  std::vector<Op> ops_;
  bool started_ = false;
  bool lane_done_[2] = {false, false};
  bool aborted_ = false;
  std::string abort_reason_;
  cuda::DeviceKernels kernels_{0, nullptr};
};

}  // namespace reshard
