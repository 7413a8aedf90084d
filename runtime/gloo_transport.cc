#include "runtime/gloo_transport.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <exception>
#include <thread>

#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "runtime/error.h"
#include "runtime/interrupt.h"
#include "runtime/tcp_store.h"
#include "runtime/waiting_store.h"

namespace reshard {
namespace {

// Gloo's FileStore, with its protected check() open: whether a key is there
// now, without waiting (who never joined, once connecting timed out).
class ProbingFileStore : public gloo::rendezvous::FileStore {
 public:
  using gloo::rendezvous::FileStore::FileStore;
  bool Has(const std::string& key) { return check({key}); }
};

// Gloo prefixes messages with "[file:line] "; a person wants the rest.
std::string Clean(const std::string& what) {
  std::string s = what;
  if (!s.empty() && s[0] == '[') {
    size_t end = s.find("] ");
    if (end != std::string::npos) s = s.substr(end + 2);
  }
  return s;
}

// The ranks whose keys a Gloo store timeout names ("Wait timeout for key(s):
// PREFIX/3, PREFIX/5": a rank's key is its number under the mesh's prefix);
// empty when the message is something else.
std::vector<uint32_t> WaitedRanks(const std::string& what, const std::string& prefix) {
  const std::string mark = "Wait timeout for key(s): ";
  const size_t at = what.find(mark);
  if (at == std::string::npos) return {};
  std::vector<uint32_t> ranks;
  const std::string keys = what.substr(at + mark.size());
  for (size_t pos = 0; pos < keys.size();) {
    size_t end = keys.find_first_of(", ", pos);
    if (end == std::string::npos) end = keys.size();
    const std::string key = keys.substr(pos, end - pos);
    pos = end + 1;
    if (key.empty()) continue;
    // A rank's keys: PREFIX/N (its addresses) and PREFIX/rank_N (its host name).
    size_t digits = prefix.size() + 1;
    if (key.compare(digits, 5, "rank_") == 0) digits += 5;
    if (key.rfind(prefix + "/", 0) != 0 || key.size() == digits ||
        key.find_first_not_of("0123456789", digits) != std::string::npos || key.size() > digits + 9)
      return {};  // not a rank's key
    ranks.push_back(static_cast<uint32_t>(std::stoul(key.substr(digits))));
  }
  return ranks;
}

// "ranks 2-11, 14 never joined the rendezvous (...)": runs of consecutive ranks as "a-b".
std::string NeverJoined(const std::vector<uint32_t>& ranks) {
  return RankList(ranks) +
         " never joined the rendezvous (no process published its address: not started, or started with another "
         "rendezvous, prefix or rank count)";
}

std::string SecondsString(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms.count() / 1000.0);
  return buf;
}

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

// The key a rank that gives up connecting sets, with why, so that every peer
// still waiting stops with that reason instead of at the timeout.
std::string AbortKey(const std::string& prefix) { return prefix + "/abort"; }

// The key a rank whose run failed sets, with why: every peer's watcher polls
// it, so that ranks that do not talk to the failed one stop too.
std::string FailedKey(const std::string& prefix) { return prefix + "/failed"; }
// How long a watcher waits for rank 0's store to answer whether a failure is published.
constexpr std::chrono::milliseconds kProbeAnswer(500);

// The published reason, cut to what a message can carry.
std::string Reason(const std::string& why) {
  constexpr size_t kMax = 2000;
  return why.size() <= kMax ? why : why.substr(0, kMax) + " ...";
}

// Claims `rank` in the rendezvous directory: creates DIR/PREFIX.rank.N.claim
// exclusively, holding "pid host time". Another process's claim is a second
// process started as that rank, or an earlier run's rendezvous in the same
// directory (Gloo's FileStore cannot overwrite keys, so such a directory
// cannot be used again). Returns "" or why the rank cannot be claimed.
std::string ClaimRank(const std::string& dir, const std::string& prefix, uint32_t rank) {
  std::string name = prefix;
  std::replace(name.begin(), name.end(), '/', '_');
  const std::string path = dir + "/" + name + ".rank." + std::to_string(rank) + ".claim";
  const std::string host = HostName();
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", std::localtime(&now));
  const std::string mine = std::to_string(getpid()) + " " + host + " " + when;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    [[maybe_unused]] ssize_t n = ::write(fd, mine.data(), mine.size());
    ::close(fd);
    return "";
  }
  if (errno != EEXIST) return "";  // a directory we cannot write claims in: Gloo's own error follows
  char buf[512] = {};
  fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    [[maybe_unused]] ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
  }
  long pid = 0;
  char theirs_host[256] = {}, theirs_when[64] = {};
  std::sscanf(buf, "%ld %255s %63s", &pid, theirs_host, theirs_when);
  const std::string r = std::to_string(rank);
  if (theirs_host == host && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
    return "an earlier run (pid " + std::to_string(pid) + " on this host, exited) joined this rendezvous as rank " + r +
           " at " + theirs_when + ": use a fresh directory per run (Gloo cannot overwrite its keys)";
  }
  return "rank " + r + " has already joined the rendezvous in '" + dir + "' (pid " + std::to_string(pid) + " on " +
         theirs_host + " at " + theirs_when + "; this is pid " + std::to_string(getpid()) + " on " + host +
         "): two processes were started as rank " + r +
         ", or the directory holds an earlier job's rendezvous (use a fresh directory per job)";
}

// What connecting a mesh makes, shared by the constructor and the thread
// that connects: the constructor stops waiting at the deadline even where
// Gloo does not (its first pair connect waits up to five times the timeout
// for a peer that died while the mesh was being connected), and the thread,
// left behind then, keeps what it uses alive.
struct Connecting {
  uint32_t rank = 0, size = 0;
  GlooOptions options;
  std::string where;
  size_t chunk_bytes = 0;
  std::unique_ptr<gloo::rendezvous::Store> base;
  ProbingFileStore* files = nullptr;  // the directory's store, to tell who never joined
  TcpStore* tcp = nullptr;            // or HOST:PORT's
  std::shared_ptr<gloo::Context> context, nvlink;
  std::string mismatch;  // of the part sizes, found once connected
  std::exception_ptr error;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

void ConnectMesh(Connecting& c) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = c.options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    if (IsHostPort(c.where)) {
      std::unique_ptr<TcpStore> tcp = c.rank == 0 ? TcpStore::Serve(c.where, c.size - 1, c.options.timeout)
                                                  : TcpStore::Connect(c.where, c.rank, c.options.timeout, c.size);
      c.tcp = tcp.get();
      c.base = std::move(tcp);
      // Every rank present, each once, before any publishes its address: a
      // rank started twice (or another job's) never enters Gloo's connect.
      c.tcp->WaitForRoster();
    } else {
      auto file_store = std::make_unique<ProbingFileStore>(c.where);
      c.files = file_store.get();
      const std::string abort_key = AbortKey(c.options.prefix);
      if (std::string taken = ClaimRank(c.where, c.options.prefix, c.rank); !taken.empty()) {
        // Tell the ranks waiting for this rank's address why it will not come.
        try {
          c.files->set(abort_key, std::vector<char>(taken.begin(), taken.end()));
        } catch (const std::exception&) {  // a peer has set it already
        }
        throw ConnectAborted(taken);
      }
      auto has = [files = c.files](const std::vector<std::string>& keys) {
        for (const std::string& k : keys)
          if (!files->Has(k)) return false;
        return true;
      };
      c.base = std::make_unique<WaitingStore>(std::move(file_store), c.options.timeout, has,
                                              [files = c.files, abort_key] {
                                                if (!files->Has(abort_key)) return std::string();
                                                const std::vector<char> why = files->get(abort_key);
                                                return std::string(why.begin(), why.end());
                                              });
    }
    gloo::rendezvous::PrefixStore store(c.options.prefix, *c.base);
    auto context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(c.rank), static_cast<int>(c.size));
    context->setTimeout(c.options.timeout);
    context->connectFullMesh(store, device);
    c.context = std::move(context);
    // A receive completes on the first part that arrives, however short: ranks
    // that cut messages differently would take parts for whole messages. Each
    // rank checks that it cuts them as rank 0 does.
    const std::string mine = std::to_string(c.chunk_bytes);
    if (c.rank == 0) {
      store.set("gloo_chunk_bytes", std::vector<char>(mine.begin(), mine.end()));
    } else {
      const std::vector<char> v = store.get("gloo_chunk_bytes");
      const std::string theirs(v.begin(), v.end());
      if (theirs != mine) {
        c.mismatch = "rank " + std::to_string(c.rank) + " cuts messages into parts of " + mine +
                     " bytes but rank 0 into parts of " + theirs +
                     " (0: whole messages); every rank must use the same RESHARD_GLOO_CHUNK_BYTES";
      }
    }
    if (!c.options.nvlink_hostname.empty()) {
      gloo::transport::tcp::attr nv_attr;
      nv_attr.hostname = c.options.nvlink_hostname;
      auto nv_device = gloo::transport::tcp::CreateDevice(nv_attr);
      gloo::rendezvous::PrefixStore nv_store(c.options.prefix + "/nvlink", *c.base);
      auto nv = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(c.rank), static_cast<int>(c.size));
      nv->setTimeout(c.options.timeout);
      nv->connectFullMesh(nv_store, nv_device);
      c.nvlink = std::move(nv);
    }
  } catch (const ConnectAborted& e) {
    if (c.tcp != nullptr) c.tcp->StopServing(e.what());  // the serving rank: the others hear why at once
    throw Error("rank " + std::to_string(c.rank) + ": gloo: cannot connect " + std::to_string(c.size) +
                " ranks through '" + c.where + "': " + e.what());
  } catch (const Interrupted& e) {
    const std::string why = "rank " + std::to_string(c.rank) + " left: " + e.what();
    try {
      if (c.tcp != nullptr && c.rank == 0) {
        c.tcp->StopServing(why);
      } else if (c.base) {
        c.base->set(AbortKey(c.options.prefix), std::vector<char>(why.begin(), why.end()));
      }
    } catch (const std::exception&) {
    }
    throw Interrupted(e.signal(), "rank " + std::to_string(c.rank) + ": " + e.what());
  } catch (const std::exception& e) {
    if (c.tcp != nullptr) c.tcp->StopServing();
    std::string why = Clean(e.what());
    std::vector<uint32_t> missing = WaitedRanks(why, c.options.prefix);
    if (!missing.empty() && c.files != nullptr) {
      // Every rank that has not published its address by now, not only the one waited for.
      missing.clear();
      for (uint32_t r = 0; r < c.size; ++r)
        if (r != c.rank && !c.files->Has(c.options.prefix + "/" + std::to_string(r))) missing.push_back(r);
    }
    if (!missing.empty()) why = NeverJoined(missing);
    throw Error("rank " + std::to_string(c.rank) + ": gloo: cannot connect " + std::to_string(c.size) +
                " ranks through '" + c.where + "' within " + SecondsString(c.options.timeout) + ": " + why);
  }
}

}  // namespace

size_t GlooChunkBytes(const GlooOptions& options) {
  const char* v = std::getenv("RESHARD_GLOO_CHUNK_BYTES");
  if (v == nullptr) return options.chunk_bytes;
  const std::string s = v;
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos) {
    throw Error("RESHARD_GLOO_CHUNK_BYTES must be a byte count (0 sends messages whole), not '" + s + "'");
  }
  return static_cast<size_t>(std::stoull(s));
}

GlooTransport::GlooTransport(uint32_t rank, uint32_t size, const GlooOptions& options)
    : rank_(rank), size_(size), timeout_(options.timeout), chunk_bytes_(GlooChunkBytes(options)) {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  if (rank >= size) throw Error("gloo: rank " + std::to_string(rank) + " out of range for " + std::to_string(size) + " ranks");
  const std::string where = options.rendezvous.empty() ? options.store_dir : options.rendezvous;
  if (where.empty()) throw Error("gloo: no rendezvous given (a shared directory or HOST:PORT)");
  auto c = std::make_shared<Connecting>();
  c->rank = rank;
  c->size = size;
  c->options = options;
  c->where = where;
  c->chunk_bytes = chunk_bytes_;
  std::thread worker([c] {
    try {
      ConnectMesh(*c);
    } catch (...) {
      c->error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(c->mu);
    c->done = true;
    c->cv.notify_all();
  });
  {
    // The stores' waits end at the timeout; a second more lets the thread say why.
    const auto deadline = Clock::now() + options.timeout + std::chrono::seconds(1);
    std::unique_lock<std::mutex> lock(c->mu);
    while (!c->done && Clock::now() < deadline && InterruptSignal() == 0) {
      c->cv.wait_for(lock, std::chrono::milliseconds(100));
    }
    // Interrupted: the stores' waits see it within their 100 ms poll, tell
    // the peers (the abort key) and end the thread; give them that long.
    if (!c->done && InterruptSignal() != 0) c->cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return c->done; });
    if (!c->done) {
      lock.unlock();
      worker.detach();  // it holds `c`: what it uses stays alive until it returns
      const std::string head = "rank " + std::to_string(rank) + ": gloo: cannot connect " + std::to_string(size) +
                               " ranks through '" + where + "'";
      if (int sig = InterruptSignal()) throw Interrupted(sig, head + ": interrupted (" + SignalName(sig) + ")");
      throw Error(head + " within " + SecondsString(options.timeout) +
                  ": the connections to the peers did not complete (a peer died or stopped while the mesh was being "
                  "connected)");
    }
  }
  worker.join();
  if (c->error) std::rethrow_exception(c->error);
  const std::string& mismatch = c->mismatch;
  ProbingFileStore* files = c->files;
  context_ = c->context;
  nvlink_context_ = c->nvlink;
  if (!mismatch.empty()) throw Error(mismatch);
  if (files != nullptr) {
    // The directory stays: a failed rank publishes why there, and every
    // waiting rank finds it within the watcher's poll.
    const std::string key = FailedKey(options.prefix);
    probe_failure_ = [files, key] {
      if (!files->Has(key)) return std::string();
      const std::vector<char> why = files->get(key);
      return std::string(why.begin(), why.end());
    };
    publish_failure_ = [files, key](const std::string& why) {
      files->set(key, std::vector<char>(why.begin(), why.end()));
    };
    store_ = std::move(c->base);
    watcher_ = std::thread([this] { Watch(); });
  } else if (c->tcp != nullptr) {
    // Rank 0 keeps serving while the transport lives, and every rank keeps
    // its connection to it: a failed rank publishes why there, and every
    // waiting rank asks within the watcher's poll (a 'C' request, which
    // does not wait for the key). A process that comes late as a rank of
    // this job (a duplicate, another job on this address) hears why at once.
    // One request at a time per store: the watcher and a failing wait share
    // it under a lock. A store that did not answer in time may be out of
    // step with its replies, so it is not asked again.
    TcpStore* tcp = c->tcp;
    const std::string key = FailedKey(options.prefix);
    auto mu = std::make_shared<std::mutex>();
    auto gone = std::make_shared<bool>(false);
    probe_failure_ = [tcp, key, mu, gone] {
      std::lock_guard<std::mutex> lock(*mu);
      if (*gone) return std::string();
      std::vector<char> why;
      try {
        if (!tcp->Check(key, &why, kProbeAnswer)) return std::string();
      } catch (...) {
        *gone = true;  // rank 0 has finished (or died): the connections tell the rest
        throw;
      }
      return std::string(why.begin(), why.end());
    };
    publish_failure_ = [tcp, key, mu, gone](const std::string& why) {
      std::lock_guard<std::mutex> lock(*mu);
      if (*gone) return;
      try {
        tcp->set(key, std::vector<char>(why.begin(), why.end()), kProbeAnswer);
      } catch (...) {
        *gone = true;
        throw;
      }
    };
    store_ = std::move(c->base);
    // Rank 0's store need not outlive this rank's connecting for it any more.
    if (rank != 0) {
      try {
        tcp->Settle();
      } catch (const std::exception&) {
        *gone = true;
      }
    }
    watcher_ = std::thread([this] { Watch(); });
  }
  aborter_ = RegisterAborter([this] {
    std::lock_guard<std::mutex> lock(wait_mu_);
    interrupted_ = true;
    AbortWaitLocked();
  });
}

GlooTransport::~GlooTransport() {
  if (aborter_ >= 0) UnregisterAborter(aborter_);
  if (watcher_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      stop_watch_ = true;
    }
    watch_cv_.notify_all();
    watcher_.join();
  }
  ops_.clear();
  // A destructor must not throw: Gloo enforces on pairs whose peer has gone
  // already, and an escaping exception here would abort the process.
  try {
    if (nvlink_context_) nvlink_context_->closeConnections();
    if (context_) context_->closeConnections();
  } catch (const std::exception&) {
  }
}

size_t GlooTransport::Post(gloo::Context& context, bool send, uint32_t peer, uint64_t seq, void* data,
                           size_t bytes) {
  Op op{nullptr, send, peer, bytes, 0};
  // Both sides skip empty messages alike (they agree on the byte count), and
  // Gloo needs a non-empty buffer. Both cut a message into the same parts,
  // on one slot: Gloo matches a slot's sends and receives in order.
  if (bytes > 0) {
    try {
      op.buffer = context.createUnboundBuffer(data, bytes);
      const size_t part = chunk_bytes_ == 0 ? bytes : chunk_bytes_;
      for (size_t offset = 0; offset < bytes; offset += part, ++op.parts) {
        const size_t n = std::min(part, bytes - offset);
        if (send) {
          op.buffer->send(static_cast<int>(peer), seq, offset, n);
        } else {
          op.buffer->recv(static_cast<int>(peer), seq, offset, n);
        }
      }
    } catch (const gloo::Exception& e) {
      throw Error(Explain(Clean(e.what()), (send ? "sending " : "receiving ") + std::to_string(bytes) + " bytes"));
    }
  }
  ops_.push_back(std::move(op));
  return ops_.size() - 1;
}

size_t GlooTransport::post_send(uint32_t peer, uint64_t seq, const void* data, size_t bytes) {
  return Post(*context_, true, peer, seq, const_cast<void*>(data), bytes);
}

size_t GlooTransport::post_recv(uint32_t peer, uint64_t seq, void* data, size_t bytes) {
  return Post(*context_, false, peer, seq, data, bytes);
}

size_t GlooTransport::post(bool send, int channel, uint32_t peer, uint64_t seq, void* data, size_t bytes) {
  if (channel == 1 && nvlink_context_) return Post(*nvlink_context_, send, peer, seq, data, bytes);
  return send ? post_send(peer, seq, data, bytes) : post_recv(peer, seq, data, bytes);
}

void GlooTransport::wait(size_t handle, Clock::time_point deadline) {
  Op& op = ops_.at(handle);
  if (!op.buffer) return;
  // Words for the messages of a failed wait, made only then (a run waits for thousands of messages).
  auto doing = [&op] { return (op.send ? "sending " : "receiving ") + std::to_string(op.bytes) + " bytes"; };
  auto stopped = [&] {
    std::lock_guard<std::mutex> lock(wait_mu_);
    return Error("stopped " + doing() + ": another rank failed first: " + peer_failure_);
  };
  if (peer_failed_) throw stopped();
  try {
    bool ok = true;
    {
      std::lock_guard<std::mutex> lock(wait_mu_);
      waiting_ = op.buffer.get();
      waiting_send_ = op.send;
    }
    struct Done {
      GlooTransport* t;
      ~Done() {
        std::lock_guard<std::mutex> lock(t->wait_mu_);
        t->waiting_ = nullptr;
      }
    } done{this};
    for (size_t k = 0; k < op.parts && ok && !interrupted_ && !peer_failed_; ++k) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      // Gloo reads a zero timeout as "wait forever".
      if (left < std::chrono::milliseconds(1)) left = std::chrono::milliseconds(1);
      ok = op.send ? op.buffer->waitSend(nullptr, left) : op.buffer->waitRecv(nullptr, left);
    }
    if (interrupted_ || peer_failed_ || !ok) {
      if (int sig = InterruptSignal()) throw Interrupted(sig, "interrupted (" + SignalName(sig) + ") while " + doing());
      if (peer_failed_) throw stopped();
      throw Error("aborted while " + doing());
    }
  } catch (const gloo::IoException& e) {
    std::string msg = Clean(e.what());
    if (msg.find("Timed out") != std::string::npos || msg.find("timed out") != std::string::npos) {
      throw Error("timed out after " + SecondsString(timeout_) + " " + doing());
    }
    throw Error(Explain(msg, doing()));
  } catch (const gloo::Exception& e) {
    throw Error(Explain(Clean(e.what()), doing()));
  }
}

std::string GlooTransport::Explain(const std::string& msg, const std::string& doing) {
  // A peer that failed publishes why before it closes its connections.
  if (std::string first = PeerFailure(std::chrono::milliseconds(300)); !first.empty()) {
    return msg + " (" + doing + "): another rank failed first: " + first;
  }
  if (!probe_failure_) return msg + " (" + doing + ")";
  return msg + " (" + doing + "; the peer closed its connections without saying why: it was killed, crashed or "
         "exited during the run)";
}

std::string GlooTransport::PeerFailure(std::chrono::milliseconds grace) {
  if (!probe_failure_) return "";
  const auto until = Clock::now() + grace;
  for (;;) {
    try {
      if (std::string why = probe_failure_(); !why.empty()) return why;
    } catch (const std::exception&) {
      return "";
    }
    if (Clock::now() >= until) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void GlooTransport::Publish(const std::string& why) {
  if (publish_failure_ && PeerFailure(std::chrono::milliseconds(0)).empty()) publish_failure_(Reason(why));
}

void GlooTransport::AbortWaitLocked() {
  if (waiting_ == nullptr) return;
  if (waiting_send_) {
    waiting_->abortWaitSend();
  } else {
    waiting_->abortWaitRecv();
  }
}

void GlooTransport::Watch() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!stop_watch_) {
    watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stop_watch_ || peer_failed_) continue;
    {
      std::lock_guard<std::mutex> wl(wait_mu_);
      if (waiting_ == nullptr) continue;  // polled only while a wait may be stuck on a failed peer
    }
    lock.unlock();
    std::string why;
    try {
      why = probe_failure_();
    } catch (const std::exception&) {
    }
    lock.lock();
    if (why.empty() || !failure().empty()) continue;  // nothing published, or this rank failed itself
    std::lock_guard<std::mutex> wl(wait_mu_);
    peer_failure_ = why;
    peer_failed_ = true;
    AbortWaitLocked();
  }
}

void GlooTransport::reset() { ops_.clear(); }

void GlooTransport::abandon() {
  ops_.clear();
  try {
    if (nvlink_context_) nvlink_context_->closeConnections();
    if (context_) context_->closeConnections();
  } catch (const std::exception&) {
  }
}

bool GlooTransport::allgather(const void* mine, size_t bytes, void* all, Clock::time_point deadline) {
  MessageCalls calls;
  calls.post = [this](bool send, uint32_t peer, void* data, size_t n) {
    return Post(*context_, send, peer, kHelloSeq, data, n);
  };
  calls.start = [] {};
  calls.wait = [this](size_t h, Clock::time_point d) { GlooTransport::wait(h, d); };
  calls.reset = [this] { ops_.clear(); };
  return GatherByMessages(calls, mine, bytes, all, deadline);
}

void GlooTransport::barrier() {
  try {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  } catch (const gloo::Exception& e) {
    throw Error("rank " + std::to_string(rank_) + ": barrier: " + Clean(e.what()));
  }
}

}  // namespace reshard
