// Transport over Gloo's TCP pairs: the CPU transport of tests and `reshard run`.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/transport.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace reshard {

struct GlooOptions {
  /// Where the ranks meet: a directory every rank shares (a
  /// gloo::rendezvous::FileStore, must exist) or "HOST:PORT" (a TcpStore,
  /// runtime/tcp_store.h: rank 0 serves on that address, the others connect).
  /// Empty: `store_dir`.
  std::string rendezvous;
  /// Directory of the FileStore (the older name of a directory `rendezvous`).
  std::string store_dir;
  /// Key prefix within the store, so that several meshes can share one directory.
  std::string prefix = "reshard";
  /// Address to listen on.
  std::string hostname = "127.0.0.1";
  /// Address to listen on for messages of the nvlink channel (a second mesh,
  /// e.g. over another interface); empty: they share the net mesh.
  std::string nvlink_hostname;
  /// Limit for connecting and for each round's messages.
  std::chrono::milliseconds timeout{60000};
  /// Messages larger than this go out as parts of at most this many bytes,
  /// all posted at once on the message's slot (Gloo keeps their order); 0
  /// sends every message whole. Both ends of a message must agree, so every
  /// rank of a run uses the same value. The environment variable
  /// RESHARD_GLOO_CHUNK_BYTES, where set, overrides it. Over loopback TCP on
  /// a 2-core host, 1 MiB parts moved a plan of 32 MiB messages 1.4-1.6x
  /// faster than whole messages (tools/bench/runtime_bench.sh, README).
  size_t chunk_bytes = size_t{1} << 20;
};

/// `options.chunk_bytes`, or RESHARD_GLOO_CHUNK_BYTES where it is set (a
/// byte count; 0 for whole messages). Throws reshard::Error for anything else.
size_t GlooChunkBytes(const GlooOptions& options);

class GlooTransport : public Transport {
 public:
  /// Connects a full mesh of `size` ranks. Throws reshard::Error when a rank
  /// does not show up within the timeout, when another process has already
  /// joined this rendezvous as `rank` (a directory: the claim file
  /// PREFIX.rank.N.claim, created exclusively; HOST:PORT: the server sees the
  /// rank twice), or when a peer gave up connecting (the store's abort key:
  /// a duplicate, an interrupt); Interrupted on SIGINT/SIGTERM/SIGHUP within
  /// an InterruptScope. Ignores SIGPIPE in the process (a peer that dies must
  /// fail a send, not kill the sender), unless a handler is set.
  GlooTransport(uint32_t rank, uint32_t size, const GlooOptions& options);
  ~GlooTransport() override;

  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  size_t post_send(uint32_t peer, uint64_t seq, const void* data, size_t bytes) override;
  size_t post_recv(uint32_t peer, uint64_t seq, void* data, size_t bytes) override;
  size_t post(bool send, int channel, uint32_t peer, uint64_t seq, void* data, size_t bytes) override;
  void wait(size_t handle, Clock::time_point deadline) override;
  void reset() override;
  /// The hello's gather, by messages on the net mesh (not through overridden
  /// post/wait: test wrappers count only a run's messages).
  bool allgather(const void* mine, size_t bytes, void* all, Clock::time_point deadline) override;
  /// Closes every connection: the peers' waits on this rank fail at once.
  void abandon() override;
  /// Whether a peer's failure reaches this rank through the rendezvous store
  /// (a directory: always; HOST:PORT: while rank 0's store serves), besides
  /// the connections its failing peers close.
  bool watches_failures() const { return static_cast<bool>(probe_failure_); }
  /// Waits until every rank has called barrier() (within the timeout). Call
  /// it before destroying the transport once a run is over: a rank that
  /// closes its connections while a peer is still receiving what it sent can
  /// lose the data still in flight (the kernel resets a socket closed with
  /// unread input). Throws reshard::Error naming what went wrong.
  void barrier();

 protected:
  /// Publishes `why` under the rendezvous's failure key (PREFIX/failed),
  /// which every rank's watcher polls while it waits.
  void Publish(const std::string& why) override;

 private:
  struct Op {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;  // null for an empty message
    bool send;
    uint32_t peer;
    size_t bytes;
    size_t parts;  // the message's parts (chunk_bytes_), each waited for
  };

  uint32_t rank_, size_;
  std::chrono::milliseconds timeout_;
  size_t chunk_bytes_;
  size_t Post(gloo::Context& context, bool send, uint32_t peer, uint64_t seq, void* data, size_t bytes);

  // The message wait() is blocked on, for the interrupt aborter (runtime/interrupt.h).
  std::mutex wait_mu_;
  gloo::transport::UnboundBuffer* waiting_ = nullptr;
  bool waiting_send_ = false;
  std::atomic<bool> interrupted_{false};
  int aborter_ = -1;

  // Failures of the peers, through the rendezvous store kept for the
  // transport's life: a watcher thread polls the failure key every 100 ms
  // while a wait is in progress and ends that wait with the peer's reason.
  void Watch();
  // Ends the wait in progress, if any (wait_mu_ held).
  void AbortWaitLocked();
  // A Gloo error while `doing`, with the failure a peer published first, if any.
  std::string Explain(const std::string& msg, const std::string& doing);
  // A failure published by a peer within `grace` ("" if none).
  std::string PeerFailure(std::chrono::milliseconds grace);
  std::unique_ptr<gloo::rendezvous::Store> store_;
  std::function<std::string()> probe_failure_;  // "" while no rank has published a failure
  std::function<void(const std::string&)> publish_failure_;
  std::atomic<bool> peer_failed_{false};
  std::string peer_failure_;  // guarded by wait_mu_
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stop_watch_ = false;
  std::thread watcher_;

  std::shared_ptr<gloo::Context> context_;
  std::shared_ptr<gloo::Context> nvlink_context_;  // null: nvlink shares context_
  std::vector<Op> ops_;
};

}  // namespace reshard
