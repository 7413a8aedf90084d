// What the executor needs from a transport: post point-to-point messages, wait
// for them with a deadline. GlooTransport (CPU, TCP) implements it, and so
// does NcclTransport (runtime/cuda/nccl_transport.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace reshard {

class Kernels;
Kernels& CpuKernels();

class Transport {
 public:
  using Clock = std::chrono::steady_clock;

  virtual ~Transport() = default;

  /// This process's global rank and the number of global ranks.
  virtual uint32_t rank() const = 0;
  virtual uint32_t size() const = 0;
  /// How long a round's messages may take before run() gives up.
  virtual std::chrono::milliseconds timeout() const = 0;

  /// Starts sending `bytes` bytes at `data` to `peer`. `seq` numbers the
  /// messages from this rank to `peer` (0, 1, ...); the receiver posts the same
  /// number. Returns a handle for wait(). The memory must stay valid until then.
  virtual size_t post_send(uint32_t peer, uint64_t seq, const void* data, size_t bytes) = 0;
  /// Starts receiving message `seq` of `peer` -> this rank into `data`.
  virtual size_t post_recv(uint32_t peer, uint64_t seq, void* data, size_t bytes) = 0;
  /// post_send (send) or post_recv for a message of channel `channel`
  /// (fb::Channel: 0 net, 1 nvlink). Transports with one path for both keep
  /// this default, which ignores the channel.
  virtual size_t post(bool send, int channel, uint32_t peer, uint64_t seq, void* data, size_t bytes) {
    return send ? post_send(peer, seq, data, bytes) : post_recv(peer, seq, data, bytes);
  }
  /// Starts everything posted since the last reset(): NCCL posts one round's
  /// messages as one group here. The default does nothing (Gloo starts each
  /// message as it is posted). Throws like wait().
  virtual void start() {}
  /// Waits for one posted message. Throws reshard::Error saying why it did not
  /// complete ("timed out after 2.0 s", "connection closed by peer", ...)
  /// without naming the step: the executor adds that.
  virtual void wait(size_t handle, Clock::time_point deadline) = 0;
  /// Forgets all posted messages (all waited for, or abandoned after a
  /// failure); handles restart at 0.
  virtual void reset() = 0;
  /// Gives up on the transport after an interrupted call: closes what lets
  /// the peers see at once that this rank left (Gloo closes its connections).
  /// The transport must not be used after it. The default does nothing.
  virtual void abandon() {}

  /// Ends the transport's use after a failure of this rank's run (`why`: one
  /// line naming the rank and what went wrong): the transport is marked failed
  /// (every later session or run on it says so, naming `why`), tells its
  /// peers where it can (Gloo: publishes `why` in the rendezvous store, which
  /// every waiting peer polls, then closes its connections) and abandons. The
  /// first reason stays; later calls only abandon again.
  void Fail(const std::string& why);
  /// Why the transport failed ("" while it is usable).
  std::string failure() const;
  /// Throws reshard::Error saying the transport failed and why (naming the
  /// run it failed in), unless it is usable. `who` starts the message ("rank 3: ").
  void CheckUsable(const std::string& who) const;
  /// CheckUsable, then counts a run on this transport (the number a failure names).
  void BeginRun(const std::string& who);

  /// One session at a time: Claim() is false while another session holds
  /// the transport (a second session would take the first one's messages).
  bool Claim();
  void Release();
  /// Gathers `bytes` bytes from every rank into `all` (rank r's at
  /// all + r * bytes): the session's hello at connect (runtime/hello.h),
  /// host memory on both sides. Every rank calls it once per session, before
  /// any message of a run. Returns false where the transport cannot (a test
  /// loopback presenting one process as a rank of many): the caller then
  /// proves nothing. Throws reshard::Error naming the peer not heard from by
  /// `deadline`, or the failure. The default sends to and receives from every
  /// peer with post/wait (message number kHelloSeq); NCCL uses ncclAllGather.
  virtual bool allgather(const void* mine, size_t bytes, void* all, Clock::time_point deadline);
  static constexpr uint64_t kHelloSeq = 0x00FFFFFFFFFF0000ull;

  /// The kernels of the memory this transport moves: the CPU's by default,
  /// a device's for NCCL (buffers and staging then live on that device).
  virtual Kernels& kernels() { return CpuKernels(); }

 protected:
  /// Fail()'s transport-specific part: tell the peers `why` (called once,
  /// before abandon()). The default tells nobody: the peers learn of the
  /// failure from their own waits.
  virtual void Publish(const std::string& /*why*/) {}

  /// allgather's default, over the given message calls (a transport whose
  /// post/wait are wrapped passes its own, unwrapped ones).
  struct MessageCalls {
    std::function<size_t(bool send, uint32_t peer, void* data, size_t bytes)> post;
    std::function<void()> start;
    std::function<void(size_t handle, Clock::time_point deadline)> wait;
    std::function<void()> reset;
  };
  bool GatherByMessages(const MessageCalls& calls, const void* mine, size_t bytes, void* all,
                        Clock::time_point deadline);

 private:
  void ThrowIfFailed(const std::string& who) const;  // failure_mu_ held

  mutable std::mutex failure_mu_;
  std::string failure_;
  uint64_t runs_ = 0;
  uint64_t failed_in_run_ = 0;
  bool claimed_ = false;
};

}  // namespace reshard
