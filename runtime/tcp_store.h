// A gloo::rendezvous::Store over TCP, for meshes whose ranks share no
// directory: one process serves the keys (TcpStore::Serve), every rank talks
// to it (the serving process through the same object, without a socket).
// Each client says who it is (rank, world size, pid, host, time, job), and
// the roster barrier (WaitForRoster) lets no rank publish its address before
// every rank has come exactly once: a rank started twice, or a second job on
// the same address, is named to every rank instead of meeting Gloo's pair
// connect. Debian's libgloo ships FileStore, HashStore and RedisStore only.
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

/// "rank 3", "ranks 2-11, 14": sorted ranks as messages name them, runs of
/// three or more as "a-b".
std::string RankList(const std::vector<uint32_t>& ranks);

/// One object per rank; it takes one request at a time (no two threads may
/// wait on one store at once).
class TcpStore : public gloo::rendezvous::Store {
 public:
  /// Serves on `address` and clients it: `clients` other processes are
  /// expected, as ranks 1..clients (rank 0 is this process). Serving began
  /// at the call, and the store's deadline is the call plus `timeout`: if
  /// some rank has not said hello by then, every request still waiting, and
  /// every later one, is answered with the roster timeout (see
  /// WaitForRoster). The destructor keeps serving until each client has said
  /// hello and closed (or settled: see Settle), so that a slower rank still finds its keys: at most
  /// until that deadline while the roster is incomplete, at most `timeout`
  /// once it completed; StopServing ends it at once. `job` (optional) names
  /// the job, as Connect's does. Throws reshard::Error when the address
  /// cannot be bound.
  static std::unique_ptr<TcpStore> Serve(const std::string& address, uint32_t clients,
                                         std::chrono::milliseconds timeout, const std::string& job = "");
  /// Connects to the server at `address`, retrying until `timeout` (the server
  /// may start later), and says hello: `id` is this client's rank, and the
  /// hello also carries `world_size` (0: not given), `job`, this process's id,
  /// host name and the time, which the server names when two processes say
  /// hello as one rank. The store's deadline is the call plus `timeout`.
  static std::unique_ptr<TcpStore> Connect(const std::string& address, uint32_t id,
                                           std::chrono::milliseconds timeout, uint32_t world_size = 0,
                                           const std::string& job = "");
  ~TcpStore() override;

  /// The roster barrier: returns once every expected rank (1..clients of
  /// Serve) has said hello exactly once, on the serving store as on a
  /// client. Call it before any rank publishes its address, so that a
  /// process that must not join never learns one.
  ///
  /// Throws ConnectAborted (runtime/waiting_store.h) with the reason when a
  /// rank said hello twice, a process of another job said hello, or a rank
  /// gave up (its PREFIX/abort key, the reason as it set it). Until the
  /// roster is complete a conflicting hello ends the rendezvous for every
  /// rank, half a second after the first (to gather the rest of another
  /// job's ranks); once it is complete only the latecomer is refused, at its
  /// first request, and the others go on. The reasons:
  ///   rank 1 joined the rendezvous at 'HOST:PORT' twice: two processes were
  ///   started as rank 1 (pid 123 on host-a at 12:00:01, pid 456 on host-b
  ///   at 12:03:10)
  ///   rendezvous 'HOST:PORT' is serving another job: rank 1 joined twice
  ///   (first pid 123 on host-a, 8 ranks, at 12:00:01; then pid 456 on
  ///   host-b, 4 ranks, at 12:03:10): use another port per job
  /// (several ranks: "ranks 1, 2 joined twice (rank 1: first ...; then ...;
  /// rank 2: first ...; then ...)"; a rank out of range or of another world
  /// size or job than rank 0's: "rank 9 (pid ..., at ...) joined rank 0
  /// (pid ..., 8 ranks, at ...)"; an older client's bare hello: "a process of
  /// an older reshard" in place of "pid ... at ...").
  ///
  /// Throws reshard::Error when the roster is not complete at the store's
  /// deadline, with the same text on every rank: "rendezvous 'HOST:PORT':
  /// timed out after 2.0 s waiting for every rank to connect (ranks 2, 3
  /// never connected)". The first rank whose deadline passes ends the roster
  /// for all (a client asks the server, which may answer that the roster
  /// completed after all; a client gives it half a second beyond its deadline).
  void WaitForRoster();
  /// For a serving rank whose connecting failed: answers the requests still
  /// waiting with `why` (as an abort, when not empty and no other reason was
  /// given before), stops serving and closes every connection; the
  /// destructor then returns at once. Does nothing on a client.
  void StopServing(const std::string& why = "");

  void set(const std::string& key, const std::vector<char>& data) override;
  /// set, waiting at most `timeout` for the server's answer (not the store's).
  void set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds timeout);
  /// Waits (the store's timeout) for the key, then returns its value. A
  /// timeout names the ranks that have not said hello, on a client as on the
  /// server: "rendezvous 'HOST:PORT': timed out after 2.0 s waiting for key
  /// 'K' (a rank has not arrived; rank 3 never connected)".
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  /// Whether `key` is set, without waiting for it: its value in `*value`
  /// when it is. Throws reshard::Error when the server does not answer
  /// within `timeout` or has closed the connection, ConnectAborted when the
  /// rendezvous was given up.
  bool Check(const std::string& key, std::vector<char>* value, std::chrono::milliseconds timeout);
  /// On a client: tells the server that this rank reads no more keys of
  /// its connecting; it keeps the connection (for set and Check), but the
  /// serving rank's destructor no longer waits for it to close. Does
  /// nothing on the serving store.
  void Settle();

  struct Server;

 private:
  TcpStore() = default;
  std::vector<char> Request(char op, const std::string& key, const std::vector<char>& value,
                            std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout);
  // Reads one reply into `value` before `deadline`: 1 read, 0 at the
  // deadline or on a signal, -1 the server closed the connection.
  int ReadReply(std::chrono::steady_clock::time_point deadline, std::vector<char>* value);
  // The ranks the server says have not said hello; false when it did not answer.
  bool AskMissing(std::vector<uint32_t>* missing);
  std::string TimeoutMessage(char op, const std::string& key, std::chrono::milliseconds timeout);

  std::string address_;
  std::chrono::milliseconds timeout_{60000};
  std::chrono::steady_clock::time_point deadline_;  // creation plus timeout_
  int fd_ = -1;                     // client side
  std::string in_;                  // client side: reply bytes read but not yet taken
  std::unique_ptr<Server> server_;  // server side
};

}  // namespace reshard
