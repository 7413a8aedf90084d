// Transport over Gloo's TCP pairs: the CPU transport of tests and `reshard run`.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime/transport.h"

namespace gloo {
class Context;
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
};

class GlooTransport : public Transport {
 public:
  /// Connects a full mesh of `size` ranks. Throws reshard::Error when a rank
  /// does not show up within the timeout. Ignores SIGPIPE in the process (a
  /// peer that dies must fail a send, not kill the sender), unless a handler is set.
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

 private:
  struct Op {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;  // null for an empty message
    bool send;
    uint32_t peer;
    size_t bytes;
  };

  uint32_t rank_, size_;
  std::chrono::milliseconds timeout_;
  size_t Post(gloo::Context& context, bool send, uint32_t peer, uint64_t seq, void* data, size_t bytes);

  std::shared_ptr<gloo::Context> context_;
  std::shared_ptr<gloo::Context> nvlink_context_;  // null: nvlink shares context_
  std::vector<Op> ops_;
};

}  // namespace reshard
