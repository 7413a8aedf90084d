// A gloo::rendezvous::Store over TCP, for meshes whose ranks share no
// directory: one process serves the keys (TcpStore::Serve), every rank talks
// to it (the serving process through the same object, without a socket).
// Debian's libgloo ships FileStore, HashStore and RedisStore only.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace reshard {

/// "HOST:PORT" or "[IPv6]:PORT" split; throws reshard::Error naming `what`.
struct HostPort {
  std::string host;
  uint16_t port = 0;
};
HostPort ParseHostPort(const std::string& s, const std::string& what);

/// True for "HOST:PORT" (a rendezvous address), false for a directory path.
bool IsHostPort(const std::string& s);

class TcpStore : public gloo::rendezvous::Store {
 public:
  /// Serves on `address` and clients it: `clients` other processes are
  /// expected; the destructor waits (at most `timeout`) until each of them
  /// has said hello and closed, so that a slower rank still finds its keys.
  /// Throws reshard::Error when the address cannot be bound.
  static std::unique_ptr<TcpStore> Serve(const std::string& address, uint32_t clients,
                                         std::chrono::milliseconds timeout);
  /// Connects to the server at `address`, retrying until `timeout` (the server
  /// may start later). `id` is this client's name for the server (its rank).
  static std::unique_ptr<TcpStore> Connect(const std::string& address, uint32_t id,
                                           std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  /// Waits (the store's timeout) for the key, then returns its value.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  struct Server;

 private:
  TcpStore() = default;
  std::vector<char> Request(char op, const std::string& key, const std::vector<char>& value,
                            std::chrono::milliseconds timeout);

  std::string address_;
  std::chrono::milliseconds timeout_{60000};
  int fd_ = -1;                     // client side
  std::unique_ptr<Server> server_;  // server side
};

}  // namespace reshard
