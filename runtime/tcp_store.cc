#include "runtime/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "runtime/error.h"
#include "runtime/interrupt.h"
#include "runtime/waiting_store.h"

namespace reshard {
namespace {

// A set of PREFIX/abort (a rank that gives up connecting, with why) makes the
// server answer every get and set with the reason, behind this mark.
bool IsAbortKey(const std::string& key) {
  return key.size() >= 6 && key.compare(key.size() - 6, 6, "/abort") == 0;
}
const std::string kAbortMark("\0reshard-abort\0", 15);
std::vector<char> AbortValue(const std::string& why) {
  std::vector<char> v(kAbortMark.begin(), kAbortMark.end());
  v.insert(v.end(), why.begin(), why.end());
  return v;
}

using Clock = std::chrono::steady_clock;

std::string SecondsString(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms.count() / 1000.0);
  return buf;
}

int MsLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// One frame: op (1 byte), key length (u32), key, value length (u64), value.
std::string Frame(char op, const std::string& key, const std::vector<char>& value) {
  std::string f(1, op);
  uint32_t k = static_cast<uint32_t>(key.size());
  uint64_t v = value.size();
  f.append(reinterpret_cast<const char*>(&k), sizeof k);
  f += key;
  f.append(reinterpret_cast<const char*>(&v), sizeof v);
  f.append(value.begin(), value.end());
  return f;
}

// Writes all of `s` within the deadline; false on a closed or stalled socket.
bool SendAll(int fd, const std::string& s, Clock::time_point deadline) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      off += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, MsLeft(deadline)) <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

struct Addr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  int family = AF_INET;
};

Addr Resolve(const HostPort& hp, const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(hp.host.c_str(), std::to_string(hp.port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    throw Error("rendezvous '" + address + "': cannot resolve host '" + hp.host + "': " + gai_strerror(rc));
  }
  Addr a;
  std::memcpy(&a.storage, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  a.family = res->ai_family;
  freeaddrinfo(res);
  return a;
}

}  // namespace

HostPort ParseHostPort(const std::string& s, const std::string& what) {
  HostPort hp;
  std::string port;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      throw Error(what + ": '" + s + "' is not [IPv6]:PORT");
    }
    hp.host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string::npos || colon == 0) throw Error(what + ": '" + s + "' is not HOST:PORT");
    hp.host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) == 0 || std::stoul(port) > 65535) {
    throw Error(what + ": '" + s + "' has no valid port (1-65535)");
  }
  hp.port = static_cast<uint16_t>(std::stoul(port));
  return hp;
}

bool IsHostPort(const std::string& s) {
  if (s.empty() || s.find('/') != std::string::npos) return false;
  size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon + 1 == s.size()) return false;
  return s.find_first_not_of("0123456789", colon + 1) == std::string::npos;
}

// The serving side: a thread answering clients, and the keys.
struct TcpStore::Server {
  struct Client {
    int fd;
    std::string in;
    bool hello = false;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<char>> keys;
  std::set<uint32_t> said_hello;
  std::string aborted;  // why connecting stopped ("" while it goes on): every get and set is answered with it
  uint32_t expected = 0;
  size_t active = 0;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  bool stop = false;
  std::thread thread;
  std::string address;

  void Wake() {
    char c = 0;
    [[maybe_unused]] ssize_t w = ::write(wake[1], &c, 1);
  }

  void Loop() {
    std::vector<Client> clients;
    std::vector<std::pair<int, std::string>> pending;  // fd, key of a deferred get
    auto drop = [&](size_t i) {
      ::close(clients[i].fd);
      pending.erase(std::remove_if(pending.begin(), pending.end(),
                                   [&](const auto& p) { return p.first == clients[i].fd; }),
                    pending.end());
      clients.erase(clients.begin() + static_cast<long>(i));
      std::lock_guard<std::mutex> lock(mu);
      --active;
      cv.notify_all();
    };
    auto reply = [&](int fd, const std::vector<char>& value) {
      std::string r(sizeof(uint64_t), '\0');
      uint64_t n = value.size();
      std::memcpy(r.data(), &n, sizeof n);
      r.append(value.begin(), value.end());
      SendAll(fd, r, Clock::now() + std::chrono::seconds(10));
    };
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stop) break;
        // Answer the gets whose key has arrived (all of them, once connecting was aborted).
        for (size_t p = 0; p < pending.size() && !aborted.empty();) {
          reply(pending[p].first, AbortValue(aborted));
          pending.erase(pending.begin() + static_cast<long>(p));
        }
        for (size_t p = 0; p < pending.size();) {
          auto it = keys.find(pending[p].second);
          if (it == keys.end()) {
            ++p;
            continue;
          }
          reply(pending[p].first, it->second);
          pending.erase(pending.begin() + static_cast<long>(p));
        }
      }
      std::vector<pollfd> fds{{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
      for (const Client& c : clients) fds.push_back({c.fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) break;
      if (fds[1].revents & POLLIN) {
        char buf[64];
        [[maybe_unused]] ssize_t r = ::read(wake[0], buf, sizeof buf);
      }
      // Only the clients polled above have revents; one accepted below waits for the next poll.
      const size_t polled = fds.size() - 2;
      if (fds[0].revents & POLLIN) {
        int fd = ::accept(listen_fd, nullptr, nullptr);
        if (fd >= 0) {
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          clients.push_back({fd, "", false});
          std::lock_guard<std::mutex> lock(mu);
          ++active;
        }
      }
      for (size_t i = polled; i-- > 0;) {
        if (!(fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Client& c = clients[i];
        char buf[65536];
        ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          drop(i);
          continue;
        }
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
        // Complete frames.
        bool bad = false;
        for (;;) {
          if (c.in.size() < 1 + 4) break;
          uint32_t klen;
          std::memcpy(&klen, c.in.data() + 1, 4);
          if (klen > (1u << 20)) {
            bad = true;
            break;
          }
          if (c.in.size() < 1 + 4 + klen + 8) break;
          uint64_t vlen;
          std::memcpy(&vlen, c.in.data() + 5 + klen, 8);
          if (vlen > (uint64_t{1} << 30)) {
            bad = true;
            break;
          }
          const size_t total = 1 + 4 + klen + 8 + vlen;
          if (c.in.size() < total) break;
          const char op = c.in[0];
          std::string key = c.in.substr(5, klen);
          std::vector<char> value(c.in.begin() + 13 + klen, c.in.begin() + static_cast<long>(total));
          c.in.erase(0, total);
          std::lock_guard<std::mutex> lock(mu);
          if (op == 'H') {
            const uint32_t id = static_cast<uint32_t>(std::stoul(key));
            if (!said_hello.insert(id).second && aborted.empty()) {
              aborted = "rank " + std::to_string(id) + " joined the rendezvous at '" + address +
                        "' twice: two processes were started as rank " + std::to_string(id);
            }
            cv.notify_all();
          } else if (!aborted.empty() && (op == 'S' || op == 'G')) {
            reply(c.fd, AbortValue(aborted));
          } else if (op == 'S' && IsAbortKey(key)) {
            aborted = std::string(value.begin(), value.end());
            cv.notify_all();
            reply(c.fd, {});
          } else if (op == 'S') {
            keys[key] = std::move(value);
            cv.notify_all();
            reply(c.fd, {});
          } else if (op == 'G') {
            auto it = keys.find(key);
            if (it != keys.end()) {
              reply(c.fd, it->second);
            } else {
              pending.emplace_back(c.fd, key);
            }
          } else {
            bad = true;
            break;
          }
        }
        if (bad) drop(i);
      }
    }
    for (const Client& c : clients) ::close(c.fd);
  }
};

std::unique_ptr<TcpStore> TcpStore::Serve(const std::string& address, uint32_t clients,
                                          std::chrono::milliseconds timeout) {
  HostPort hp = ParseHostPort(address, "rendezvous");
  Addr a = Resolve(hp, address);
  std::unique_ptr<TcpStore> store(new TcpStore());
  store->address_ = address;
  store->timeout_ = timeout;
  auto server = std::make_unique<Server>();
  server->expected = clients;
  server->address = address;
  int fd = ::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error("rendezvous '" + address + "': socket: " + strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a.storage), a.len) != 0 || ::listen(fd, 1024) != 0) {
    int err = errno;
    ::close(fd);
    throw Error("rendezvous: cannot listen on '" + address + "': " + strerror(err));
  }
  server->listen_fd = fd;
  if (::pipe2(server->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(fd);
    throw Error(std::string("rendezvous: pipe: ") + strerror(errno));
  }
  Server* s = server.get();
  server->thread = std::thread([s] { s->Loop(); });
  store->server_ = std::move(server);
  return store;
}

std::unique_ptr<TcpStore> TcpStore::Connect(const std::string& address, uint32_t id,
                                            std::chrono::milliseconds timeout) {
  HostPort hp = ParseHostPort(address, "rendezvous");
  std::unique_ptr<TcpStore> store(new TcpStore());
  store->address_ = address;
  store->timeout_ = timeout;
  const auto deadline = Clock::now() + timeout;
  std::string last = "no answer";
  for (;;) {
    Addr a;
    try {
      a = Resolve(hp, address);
    } catch (const Error& e) {
      last = e.what();
      if (Clock::now() >= deadline) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    int fd = ::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throw Error("rendezvous '" + address + "': socket: " + strerror(errno));
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a.storage), a.len);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int left = std::min(MsLeft(deadline), 1000);
      if (poll(&p, 1, left) == 1) {
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      } else {
        err = ETIMEDOUT;
      }
    }
    if (err == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      store->fd_ = fd;
      if (!SendAll(fd, Frame('H', std::to_string(id), {}), deadline)) {
        throw Error("rendezvous '" + address + "': connection closed while saying hello");
      }
      return store;
    }
    ::close(fd);
    last = strerror(err);
    InterruptCheck("connecting");  // a rank waiting for the server to start
    if (Clock::now() >= deadline) {
      throw Error("rendezvous: cannot connect to '" + address + "' within " + SecondsString(timeout) + ": " + last);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  if (server_) {
    Server& s = *server_;
    {
      // Keep serving until every client has come and gone: a slower rank may
      // still be reading keys after this rank's mesh is up.
      std::unique_lock<std::mutex> lock(s.mu);
      s.cv.wait_until(lock, Clock::now() + timeout_,
                      [&] { return (s.said_hello.size() >= s.expected || !s.aborted.empty()) && s.active == 0; });
      s.stop = true;
    }
    s.Wake();
    s.thread.join();
    ::close(s.listen_fd);
    ::close(s.wake[0]);
    ::close(s.wake[1]);
  }
}

std::vector<char> TcpStore::Request(char op, const std::string& key, const std::vector<char>& value,
                                    std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  if (server_) {
    Server& s = *server_;
    std::unique_lock<std::mutex> lock(s.mu);
    if (!s.aborted.empty()) throw ConnectAborted(s.aborted);
    if (op == 'S') {
      if (IsAbortKey(key)) {
        s.aborted = std::string(value.begin(), value.end());
      } else {
        s.keys[key] = value;
      }
      s.cv.notify_all();
      lock.unlock();
      s.Wake();
      return {};
    }
    for (;;) {
      const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      if (s.cv.wait_until(lock, slice, [&] { return s.keys.count(key) > 0 || !s.aborted.empty(); })) break;
      lock.unlock();
      InterruptCheck("connecting");
      lock.lock();
      if (Clock::now() >= deadline) {
        // The serving rank knows who never came: the clients that never said hello.
        std::string never;
        size_t count = 0;
        for (uint32_t id = 1; id <= s.expected; ++id) {
          if (s.said_hello.count(id)) continue;
          never += (never.empty() ? "" : ", ") + std::to_string(id);
          ++count;
        }
        throw Error("rendezvous '" + address_ + "': timed out after " + SecondsString(timeout) +
                    " waiting for key '" + key + "' (a rank has not arrived" +
                    (count == 0 ? std::string(")")
                                : std::string(count == 1 ? "; rank " : "; ranks ") + never + " never connected)"));
      }
    }
    if (!s.aborted.empty()) throw ConnectAborted(s.aborted);
    return s.keys[key];
  }
  if (fd_ < 0) throw Error("rendezvous '" + address_ + "': not connected");
  if (!SendAll(fd_, Frame(op, key, value), deadline)) {
    throw Error("rendezvous '" + address_ + "': the server closed the connection");
  }
  // Reply: u64 length, then the value.
  std::string in;
  uint64_t need = UINT64_MAX;
  for (;;) {
    if (in.size() >= 8 && need == UINT64_MAX) {
      std::memcpy(&need, in.data(), 8);
      if (need > (uint64_t{1} << 30)) throw Error("rendezvous '" + address_ + "': bad reply");
    }
    if (need != UINT64_MAX && in.size() >= 8 + need) break;
    pollfd p{fd_, POLLIN, 0};
    int rc = poll(&p, 1, std::min(MsLeft(deadline), 100));
    if ((rc == 0 && Clock::now() < deadline) || (rc < 0 && errno == EINTR)) {
      InterruptCheck("connecting");
      continue;
    }
    if (rc == 0) {
      throw Error("rendezvous '" + address_ + "': timed out after " + SecondsString(timeout) +
                  (op == 'G' ? " waiting for key '" + key + "' (a rank has not arrived)" : " setting key '" + key + "'"));
    }
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      throw Error("rendezvous '" + address_ + "': the server closed the connection");
    }
    in.append(buf, static_cast<size_t>(n));
  }
  std::vector<char> got(in.begin() + 8, in.begin() + 8 + static_cast<long>(need));
  if (got.size() >= kAbortMark.size() && std::equal(kAbortMark.begin(), kAbortMark.end(), got.begin())) {
    throw ConnectAborted(std::string(got.begin() + static_cast<long>(kAbortMark.size()), got.end()));
  }
  return got;
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) { Request('S', key, data, timeout_); }

std::vector<char> TcpStore::get(const std::string& key) { return Request('G', key, {}, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const std::string& k : keys) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    Request('G', k, {}, std::max(left, std::chrono::milliseconds(1)));
  }
}

}  // namespace reshard
