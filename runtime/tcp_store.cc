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
#include <ctime>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/error.h"
#include "runtime/interrupt.h"
#include "runtime/waiting_store.h"

namespace reshard {
namespace {

using Clock = std::chrono::steady_clock;

// A set of PREFIX/abort (a rank that gives up connecting, with why) makes the
// server answer every get and set with the reason.
bool IsAbortKey(const std::string& key) {
  return key.size() >= 6 && key.compare(key.size() - 6, 6, "/abort") == 0;
}

// Replies that are not a key's value carry a mark: why connecting stopped
// (ConnectAborted at the client), the roster's timeout (reshard::Error, with
// the text every rank reports), and the ranks that never said hello (the
// answer to 'M').
const std::string kAbortMark("\0reshard-abort\0", 15);
const std::string kTimeoutMark("\0reshard-timeout\0", 17);
const std::string kMissingMark("\0reshard-missing\0", 17);
// The answers to 'C' (is the key set? without waiting): the value after
// kFoundMark, or kAbsentMark alone.
const std::string kFoundMark("\0reshard-found\0", 15);
const std::string kAbsentMark("\0reshard-absent\0", 17);
std::vector<char> Marked(const std::string& mark, const std::string& text) {
  std::vector<char> v(mark.begin(), mark.end());
  v.insert(v.end(), text.begin(), text.end());
  return v;
}
bool HasMark(const std::vector<char>& v, const std::string& mark) {
  return v.size() >= mark.size() && std::equal(mark.begin(), mark.end(), v.begin());
}
std::string AfterMark(const std::vector<char>& v, const std::string& mark) {
  return std::string(v.begin() + static_cast<long>(mark.size()), v.end());
}

// After the first conflicting hello the server waits this long for more
// before it ends the roster: the ranks of a second job arrive one after
// another, and only several of them together tell another job from one rank
// started twice.
constexpr std::chrono::milliseconds kConflictGrace(500);
// How long a client whose wait timed out gives the server to say who never
// came (or, for the roster, to decide whether it completed after all).
constexpr std::chrono::milliseconds kAskServer(500);

std::string SecondsString(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms.count() / 1000.0);
  return buf;
}

int MsLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

std::string RosterTimeout(const std::string& address, std::chrono::milliseconds timeout,
                          const std::vector<uint32_t>& missing) {
  return "rendezvous '" + address + "': timed out after " + SecondsString(timeout) +
         " waiting for every rank to connect" +
         (missing.empty() ? std::string() : " (" + RankList(missing) + " never connected)");
}

std::string KeyTimeout(const std::string& address, std::chrono::milliseconds timeout, const std::string& key,
                       const std::vector<uint32_t>& missing) {
  return "rendezvous '" + address + "': timed out after " + SecondsString(timeout) + " waiting for key '" + key +
         "' (a rank has not arrived" + (missing.empty() ? std::string() : "; " + RankList(missing) + " never connected") +
         ")";
}

// The ranks in a 'M' answer: "2,3,7".
std::string JoinRanks(const std::vector<uint32_t>& ranks) {
  std::string s;
  for (uint32_t r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}
std::vector<uint32_t> SplitRanks(const std::string& s) {
  std::vector<uint32_t> ranks;
  for (size_t pos = 0; pos < s.size();) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    const std::string r = s.substr(pos, end - pos);
    if (!r.empty() && r.size() <= 9 && r.find_first_not_of("0123456789") == std::string::npos) {
      ranks.push_back(static_cast<uint32_t>(std::stoul(r)));
    }
    pos = end + 1;
  }
  return ranks;
}

// A rank number as a hello's key writes it; false for anything else.
bool ParseRank(const std::string& s, uint32_t* rank) {
  if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  const uint64_t v = std::stoull(s);
  if (v > UINT32_MAX) return false;
  *rank = static_cast<uint32_t>(v);
  return true;
}

// Who said hello. An older client sends its bare rank number (known false).
struct Hello {
  bool known = false;
  uint32_t world_size = 0;  // 0: not given
  long pid = 0;
  std::string host;
  std::string time;  // local HH:MM:SS on its host
  std::string job;
};

// The hello's value: "reshard-hello/1", world size, pid, host and time on a
// line each, then the job tag (which may hold anything).
const std::string kHelloFormat = "reshard-hello/";

Hello ThisProcess(uint32_t world_size, const std::string& job) {
  Hello h;
  h.known = true;
  h.world_size = world_size;
  h.pid = static_cast<long>(getpid());
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  h.host = host;
  char when[16] = {};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%H:%M:%S", &tm);
  h.time = when;
  h.job = job;
  return h;
}

std::vector<char> EncodeHello(const Hello& h) {
  const std::string s = kHelloFormat + "1\n" + std::to_string(h.world_size) + "\n" + std::to_string(h.pid) + "\n" +
                        h.host + "\n" + h.time + "\n" + h.job;
  return std::vector<char>(s.begin(), s.end());
}

// Later versions add lines after the job's place at the front, never before it.
Hello DecodeHello(const std::vector<char>& v) {
  const std::string s(v.begin(), v.end());
  if (s.compare(0, kHelloFormat.size(), kHelloFormat) != 0) return {};
  std::vector<std::string> lines;
  size_t pos = 0;
  for (int i = 0; i < 5; ++i) {
    const size_t nl = s.find('\n', pos);
    if (nl == std::string::npos) return {};
    lines.push_back(s.substr(pos, nl - pos));
    pos = nl + 1;
  }
  auto number = [](const std::string& n) {
    return !n.empty() && n.size() <= 10 && n.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!number(lines[1]) || !number(lines[2]) || std::stoull(lines[1]) > UINT32_MAX) return {};
  Hello h;
  h.known = true;
  h.world_size = static_cast<uint32_t>(std::stoull(lines[1]));
  h.pid = static_cast<long>(std::stoull(lines[2]));
  h.host = lines[3];
  h.time = lines[4];
  h.job = s.substr(pos);
  return h;
}

// "pid 123 on host-a at 12:00:01"
std::string Briefly(const Hello& h) {
  if (!h.known) return "a process of an older reshard";
  return "pid " + std::to_string(h.pid) + " on " + h.host + " at " + h.time;
}

// "pid 123 on host-a, 8 ranks, job 'a', at 12:00:01": what tells two jobs apart.
std::string Fully(const Hello& h) {
  if (!h.known) return "a process of an older reshard";
  std::string s = "pid " + std::to_string(h.pid) + " on " + h.host;
  if (h.world_size != 0) s += ", " + std::to_string(h.world_size) + (h.world_size == 1 ? " rank" : " ranks");
  if (!h.job.empty()) s += ", job '" + h.job + "'";
  return s + ", at " + h.time;
}

// Two hellos of different jobs: their world sizes or job tags differ.
bool OtherJob(const Hello& a, const Hello& b) {
  if (!a.known || !b.known) return false;
  return (a.world_size != 0 && b.world_size != 0 && a.world_size != b.world_size) || a.job != b.job;
}

// A hello the roster cannot take: a second hello of `rank` (first is the
// earlier one), or one of another job (`foreign`: first is rank 0's).
struct Conflict {
  uint32_t rank = 0;
  Hello first;
  Hello second;
  bool foreign = false;
};

// Why the rendezvous cannot go on, naming every conflict: one rank started
// twice, or, when the hellos disagree on the job or several ranks came twice,
// another job on the same address.
std::string ConflictReason(const std::string& address, const std::vector<Conflict>& conflicts) {
  std::map<uint32_t, std::vector<const Conflict*>> twice;
  const Conflict* foreign = nullptr;
  bool other_job = false;
  for (const Conflict& c : conflicts) {
    if (c.foreign) {
      if (foreign == nullptr) foreign = &c;
      other_job = true;
      continue;
    }
    twice[c.rank].push_back(&c);
    other_job = other_job || OtherJob(c.first, c.second);
  }
  other_job = other_job || twice.size() > 1;
  if (!other_job) {
    const auto& [rank, list] = *twice.begin();
    const std::string r = std::to_string(rank);
    std::string who = Briefly(list[0]->first);
    for (const Conflict* c : list) who += ", " + Briefly(c->second);
    const size_t n = list.size() + 1;
    return "rank " + r + " joined the rendezvous at '" + address + "' " +
           (n == 2 ? std::string("twice") : std::to_string(n) + " times") + ": " +
           (n == 2 ? std::string("two") : std::to_string(n)) + " processes were started as rank " + r + " (" + who +
           ")";
  }
  const std::string head = "rendezvous '" + address + "' is serving another job: ";
  const std::string tail = ": use another port per job";
  if (twice.empty()) {
    return head + "rank " + std::to_string(foreign->rank) + " (" + Fully(foreign->second) + ") joined rank 0 (" +
           Fully(foreign->first) + ")" + tail;
  }
  std::vector<uint32_t> ranks;
  std::string detail;
  bool more = false;
  for (const auto& [rank, list] : twice) {
    ranks.push_back(rank);
    std::string one = "first " + Fully(list[0]->first);
    for (const Conflict* c : list) one += "; then " + Fully(c->second);
    detail += (detail.empty() ? "" : "; ") + (twice.size() > 1 ? "rank " + std::to_string(rank) + ": " : "") + one;
    more = more || list.size() > 1;
  }
  return head + RankList(ranks) + " joined " + (more ? "more than once" : "twice") + " (" + detail + ")" + tail;
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

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string list;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    list += (list.empty() ? "" : ", ") + std::to_string(ranks[i]) +
            (j > i + 1 ? "-" + std::to_string(ranks[j]) : j == i + 1 ? ", " + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + list;
}

// The serving side: a thread answering clients, the keys, and the roster of
// the ranks that said hello.
struct TcpStore::Server {
  struct Client {
    int fd;
    std::string in;
    std::string out;          // replies not yet sent: the thread never blocks on one client
    bool broken = false;      // a send failed
    bool conflicted = false;  // its hello conflicts: its requests wait for the roster's end
    std::string refused;      // why its every request is refused (a conflicting latecomer)
    bool settled = false;     // it reads no more keys ('D'): the destructor does not wait for it
  };
  struct Pending {
    int fd;
    char op;  // 'G' waits for the key, 'R' for the roster; a conflicted client's any op
    std::string key;
  };

  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<char>> keys;
  Hello self;                        // rank 0's
  std::map<uint32_t, Hello> hellos;  // each rank's first hello
  std::vector<Conflict> conflicts;   // before the roster completed: they end it for every rank
  std::vector<Conflict> late;        // after: each refuses only its latecomer
  std::string aborted;  // why connecting stopped ("" while it goes on): every request is answered with it
  bool timed_out = false;  // `aborted` is the roster's timeout (an Error, not ConnectAborted)
  bool complete = false;   // every expected rank said hello once
  Clock::time_point deadline;                            // serving began plus the timeout
  Clock::time_point decide_at = Clock::time_point::max();  // the first conflict plus kConflictGrace
  std::chrono::milliseconds timeout{0};
  uint32_t expected = 0;
  size_t active = 0;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  bool stop = false;
  bool abandoned = false;  // StopServing: the destructor waits for nobody
  std::thread thread;
  std::string address;

  void Wake() {
    char c = 0;
    [[maybe_unused]] ssize_t w = ::write(wake[1], &c, 1);
  }

  // The ranks that have not said hello (under mu).
  std::vector<uint32_t> Missing() const {
    std::vector<uint32_t> missing;
    for (uint32_t id = 1; id <= expected; ++id)
      if (!hellos.count(id)) missing.push_back(id);
    return missing;
  }

  std::vector<char> AbortReply() const { return Marked(timed_out ? kTimeoutMark : kAbortMark, aborted); }

  void Abort(const std::string& why, bool timeout_kind) {
    aborted = why;
    timed_out = timeout_kind;
    cv.notify_all();
  }

  // Ends an unfinished roster (under mu): with the conflicts once their grace
  // has passed, with the timeout at the deadline. True when it ended now.
  bool Update(Clock::time_point now) {
    if (!aborted.empty() || complete) return false;
    if (!conflicts.empty() && (now >= decide_at || now >= deadline)) {
      Abort(ConflictReason(address, conflicts), false);
      return true;
    }
    if (now >= deadline) {
      Abort(RosterTimeout(address, timeout, Missing()), true);
      return true;
    }
    return false;
  }

  // A client whose own roster wait timed out (its timeout in ms in `value`):
  // the roster ends now, unless it completed, with that client's timeout, so
  // that every rank reports the same (under mu).
  void GiveUp(const std::vector<char>& value) {
    if (!aborted.empty() || complete) return;
    if (!conflicts.empty()) {
      Abort(ConflictReason(address, conflicts), false);
      return;
    }
    const std::string ms(value.begin(), value.end());
    std::chrono::milliseconds t = timeout;
    if (!ms.empty() && ms.size() <= 12 && ms.find_first_not_of("0123456789") == std::string::npos) {
      t = std::chrono::milliseconds(std::stoll(ms));
    }
    Abort(RosterTimeout(address, t, Missing()), true);
  }

  void OnHello(Client& c, uint32_t rank, const Hello& h, Clock::time_point now) {
    Conflict conflict;
    conflict.rank = rank;
    conflict.second = h;
    if (auto it = hellos.find(rank); it != hellos.end()) {
      conflict.first = it->second;
    } else if (rank == 0) {
      conflict.first = self;  // a second rank 0: this process serves as rank 0
    } else if (rank > expected || OtherJob(self, h)) {
      conflict.first = self;
      conflict.foreign = true;
    } else {
      hellos.emplace(rank, h);
      if (aborted.empty() && conflicts.empty() && hellos.size() == expected) complete = true;
      cv.notify_all();
      return;
    }
    if (complete) {
      // The ranks that completed the roster are connecting already: only the latecomer is refused.
      late.push_back(conflict);
      c.refused = ConflictReason(address, late);
      return;
    }
    if (!aborted.empty()) return;  // its requests are answered with the reason already given
    conflicts.push_back(conflict);
    c.conflicted = true;
    if (conflicts.size() == 1) decide_at = now + kConflictGrace;
  }

  void Loop() {
    std::list<Client> clients;
    std::vector<Pending> pending;
    auto find = [&](int fd) -> Client* {
      for (Client& c : clients)
        if (c.fd == fd) return &c;
      return nullptr;
    };
    auto flush = [](Client& c) {
      while (!c.out.empty() && !c.broken) {
        ssize_t w = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
          c.out.erase(0, static_cast<size_t>(w));
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          break;
        } else if (!(w < 0 && errno == EINTR)) {
          c.broken = true;
        }
      }
    };
    auto reply = [&](Client& c, const std::vector<char>& value) {
      const uint64_t n = value.size();
      c.out.append(reinterpret_cast<const char*>(&n), sizeof n);
      c.out.append(value.begin(), value.end());
      flush(c);
    };
    auto drop = [&](std::list<Client>::iterator it) {
      ::close(it->fd);
      const int fd = it->fd;
      pending.erase(std::remove_if(pending.begin(), pending.end(), [&](const Pending& p) { return p.fd == fd; }),
                    pending.end());
      const bool counted = !it->settled;
      clients.erase(it);
      std::lock_guard<std::mutex> lock(mu);
      if (counted) --active;
      cv.notify_all();
    };
    for (;;) {
      int wait_ms = 1000;
      bool stopping;
      {
        std::lock_guard<std::mutex> lock(mu);
        Update(Clock::now());
        // Answer the requests that can be answered now: all of them once connecting was aborted.
        for (size_t p = 0; p < pending.size();) {
          Client* c = find(pending[p].fd);
          std::vector<char> value;
          if (c == nullptr) {
            // answered by nobody: its client is gone
          } else if (!aborted.empty()) {
            value = AbortReply();
          } else if (c->conflicted) {
            ++p;
            continue;
          } else if (pending[p].op == 'G' && keys.count(pending[p].key)) {
            value = keys[pending[p].key];
          } else if (pending[p].op != 'R' || !complete) {
            ++p;
            continue;
          }
          if (c != nullptr) reply(*c, value);
          pending.erase(pending.begin() + static_cast<long>(p));
        }
        stopping = stop;
        if (aborted.empty() && !complete) {
          wait_ms = std::min(wait_ms, MsLeft(deadline) + 1);
          if (!conflicts.empty()) wait_ms = std::min(wait_ms, MsLeft(decide_at) + 1);
        }
      }
      if (stopping) break;
      std::vector<pollfd> fds{{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
      std::vector<std::list<Client>::iterator> polled;
      for (auto it = clients.begin(); it != clients.end(); ++it) {
        fds.push_back({it->fd, static_cast<short>(POLLIN | (it->out.empty() ? 0 : POLLOUT)), 0});
        polled.push_back(it);
      }
      if (poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) break;
      if (fds[1].revents & POLLIN) {
        char buf[64];
        [[maybe_unused]] ssize_t r = ::read(wake[0], buf, sizeof buf);
      }
      // Only the clients polled above have revents; one accepted below waits for the next poll.
      if (fds[0].revents & POLLIN) {
        int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          clients.push_back(Client{fd, "", "", false, false, ""});
          std::lock_guard<std::mutex> lock(mu);
          ++active;
        }
      }
      for (size_t i = 0; i < polled.size(); ++i) {
        const short ev = fds[i + 2].revents;
        Client& c = *polled[i];
        if (ev & POLLOUT) flush(c);
        if (!(ev & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[65536];
        ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          c.broken = true;
          continue;
        }
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
        // Complete frames.
        for (;;) {
          if (c.in.size() < 1 + 4) break;
          uint32_t klen;
          std::memcpy(&klen, c.in.data() + 1, 4);
          if (klen > (1u << 20)) {
            c.broken = true;
            break;
          }
          if (c.in.size() < 1 + 4 + klen + 8) break;
          uint64_t vlen;
          std::memcpy(&vlen, c.in.data() + 5 + klen, 8);
          if (vlen > (uint64_t{1} << 30)) {
            c.broken = true;
            break;
          }
          const size_t total = 1 + 4 + klen + 8 + vlen;
          if (c.in.size() < total) break;
          const char op = c.in[0];
          std::string key = c.in.substr(5, klen);
          std::vector<char> value(c.in.begin() + 13 + klen, c.in.begin() + static_cast<long>(total));
          c.in.erase(0, total);
          std::lock_guard<std::mutex> lock(mu);
          const Clock::time_point now = Clock::now();
          if (op == 'H') {
            uint32_t rank;
            if (!ParseRank(key, &rank)) {
              c.broken = true;
              break;
            }
            OnHello(c, rank, DecodeHello(value), now);
            continue;
          }
          if (op != 'S' && op != 'G' && op != 'C' && op != 'D' && op != 'R' && op != 'M' && op != 'Q') {
            c.broken = true;
            break;
          }
          if (op == 'D') {
            if (!c.settled) {
              c.settled = true;
              --active;
              cv.notify_all();
            }
            reply(c, {});
            continue;
          }
          if (op == 'M') {
            reply(c, Marked(kMissingMark, JoinRanks(Missing())));
            continue;
          }
          if (!c.refused.empty()) {
            reply(c, Marked(kAbortMark, c.refused));
            continue;
          }
          if (op == 'Q') GiveUp(value);
          Update(now);
          if (!aborted.empty()) {
            reply(c, AbortReply());
          } else if (c.conflicted) {
            pending.push_back({c.fd, op, key});
          } else if (op == 'S') {
            if (IsAbortKey(key)) {
              Abort(std::string(value.begin(), value.end()), false);
            } else {
              keys[key] = std::move(value);
              cv.notify_all();
            }
            reply(c, {});
          } else if (op == 'G' && keys.count(key)) {
            reply(c, keys[key]);
          } else if (op == 'C') {
            auto it = keys.find(key);
            reply(c, it == keys.end() ? Marked(kAbsentMark, "")
                                      : Marked(kFoundMark, std::string(it->second.begin(), it->second.end())));
          } else if ((op == 'R' || op == 'Q') && complete) {
            reply(c, {});
          } else {
            pending.push_back({c.fd, op, key});
          }
        }
      }
      for (auto it = clients.begin(); it != clients.end();) {
        auto next = std::next(it);
        if (it->broken) drop(it);
        it = next;
      }
    }
    // The last answers (the roster's end, StopServing's reason) go out before the sockets close.
    for (Client& c : clients) flush(c);
    for (const Client& c : clients) ::close(c.fd);
  }

  // Stops the thread and closes the listening socket; the caller has set `stop`.
  void Join() {
    Wake();
    if (thread.joinable()) thread.join();
    if (listen_fd >= 0) ::close(listen_fd);
    listen_fd = -1;
  }
};

std::unique_ptr<TcpStore> TcpStore::Serve(const std::string& address, uint32_t clients,
                                          std::chrono::milliseconds timeout, const std::string& job) {
  const Clock::time_point began = Clock::now();
  HostPort hp = ParseHostPort(address, "rendezvous");
  Addr a = Resolve(hp, address);
  std::unique_ptr<TcpStore> store(new TcpStore());
  store->address_ = address;
  store->timeout_ = timeout;
  store->deadline_ = began + timeout;
  auto server = std::make_unique<Server>();
  server->expected = clients;
  server->address = address;
  server->timeout = timeout;
  server->deadline = store->deadline_;
  server->self = ThisProcess(clients + 1, job);
  server->complete = clients == 0;
  // Non-blocking: a connection reset between poll and accept must not block the thread.
  int fd = ::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
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
                                            std::chrono::milliseconds timeout, uint32_t world_size,
                                            const std::string& job) {
  const Clock::time_point began = Clock::now();
  HostPort hp = ParseHostPort(address, "rendezvous");
  std::unique_ptr<TcpStore> store(new TcpStore());
  store->address_ = address;
  store->timeout_ = timeout;
  store->deadline_ = began + timeout;
  const auto deadline = store->deadline_;
  auto pause = [&](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(std::min(ms, MsLeft(deadline)))); };
  std::string last = "no answer";
  for (;;) {
    Addr a;
    try {
      a = Resolve(hp, address);
    } catch (const Error& e) {
      last = e.what();
      if (Clock::now() >= deadline) throw;
      InterruptCheck("connecting");
      pause(200);
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
      const std::string hello = Frame('H', std::to_string(id), EncodeHello(ThisProcess(world_size, job)));
      // A connection made at the deadline still says hello: the frame fits the empty send buffer.
      if (!SendAll(fd, hello, std::max(deadline, Clock::now() + std::chrono::milliseconds(100)))) {
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
    pause(100);
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  if (server_) {
    Server& s = *server_;
    {
      // Keep serving until every client has come and gone: a slower rank may
      // still be reading keys after this rank's mesh is up. A roster that
      // never completed ends at the deadline serving began with: no rank can
      // be building a mesh then, and the clients still waiting have had
      // their answer.
      std::unique_lock<std::mutex> lock(s.mu);
      if (!s.abandoned) {
        const Clock::time_point until = s.complete ? Clock::now() + timeout_ : s.deadline;
        s.cv.wait_until(lock, until, [&] { return (s.complete || !s.aborted.empty()) && s.active == 0; });
      }
      s.stop = true;
    }
    s.Join();
    ::close(s.wake[0]);
    ::close(s.wake[1]);
  }
}

void TcpStore::StopServing(const std::string& why) {
  if (!server_) return;
  Server& s = *server_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.aborted.empty()) {
      s.Abort(why.empty() ? "rank 0 stopped serving the rendezvous at '" + address_ + "'" : why, false);
    }
    s.abandoned = true;
    s.stop = true;
  }
  s.Join();
}

std::string TcpStore::TimeoutMessage(char op, const std::string& key, std::chrono::milliseconds timeout) {
  if (op == 'S') return "rendezvous '" + address_ + "': timed out after " + SecondsString(timeout) + " setting key '" + key + "'";
  if (op == 'C') return "rendezvous '" + address_ + "': no answer within " + SecondsString(timeout) + " checking key '" + key + "'";
  std::vector<uint32_t> missing;
  AskMissing(&missing);
  return op == 'R' ? RosterTimeout(address_, timeout, missing) : KeyTimeout(address_, timeout, key, missing);
}

int TcpStore::ReadReply(Clock::time_point deadline, std::vector<char>* value) {
  for (;;) {
    if (in_.size() >= 8) {
      uint64_t need;
      std::memcpy(&need, in_.data(), 8);
      if (need > (uint64_t{1} << 30)) throw Error("rendezvous '" + address_ + "': bad reply");
      if (in_.size() >= 8 + need) {
        value->assign(in_.begin() + 8, in_.begin() + 8 + static_cast<long>(need));
        in_.erase(0, 8 + need);
        return 1;
      }
    }
    pollfd p{fd_, POLLIN, 0};
    const int rc = poll(&p, 1, MsLeft(deadline));
    if (rc <= 0) return 0;  // the deadline, or a signal for the caller to check
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return -1;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return -1;
    }
    in_.append(buf, static_cast<size_t>(n));
  }
}

bool TcpStore::AskMissing(std::vector<uint32_t>* missing) {
  const auto deadline = Clock::now() + kAskServer;
  if (!SendAll(fd_, Frame('M', "", {}), deadline)) return false;
  // Earlier requests' late answers may come first.
  for (;;) {
    std::vector<char> got;
    if (ReadReply(deadline, &got) != 1) return false;
    if (HasMark(got, kMissingMark)) {
      *missing = SplitRanks(AfterMark(got, kMissingMark));
      return true;
    }
  }
}

std::vector<char> TcpStore::Request(char op, const std::string& key, const std::vector<char>& value,
                                    Clock::time_point deadline, std::chrono::milliseconds timeout) {
  if (server_) {
    Server& s = *server_;
    std::unique_lock<std::mutex> lock(s.mu);
    auto fail = [&] {
      if (s.timed_out) throw Error(s.aborted);
      throw ConnectAborted(s.aborted);
    };
    if (s.Update(Clock::now())) s.Wake();
    if (!s.aborted.empty()) fail();
    if (op == 'S') {
      if (IsAbortKey(key)) {
        s.Abort(std::string(value.begin(), value.end()), false);
      } else {
        s.keys[key] = value;
        s.cv.notify_all();
      }
      lock.unlock();
      s.Wake();
      return {};
    }
    if (op == 'C') {
      auto it = s.keys.find(key);
      return it == s.keys.end() ? Marked(kAbsentMark, "")
                                : Marked(kFoundMark, std::string(it->second.begin(), it->second.end()));
    }
    auto ready = [&] { return !s.aborted.empty() || (op == 'R' ? s.complete : s.keys.count(key) > 0); };
    for (;;) {
      const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      if (s.cv.wait_until(lock, slice, ready)) break;
      lock.unlock();
      InterruptCheck("connecting");
      lock.lock();
      if (s.Update(Clock::now())) s.Wake();
      if (ready()) break;
      if (Clock::now() >= deadline) {
        // The serving rank knows who never came: the clients that never said hello.
        throw Error(op == 'R' ? RosterTimeout(address_, timeout, s.Missing())
                              : KeyTimeout(address_, timeout, key, s.Missing()));
      }
    }
    if (!s.aborted.empty()) fail();
    return op == 'R' ? std::vector<char>() : s.keys[key];
  }
  if (fd_ < 0) throw Error("rendezvous '" + address_ + "': not connected");
  const std::string closed = "rendezvous '" + address_ + "': the server closed the connection";
  if (!SendAll(fd_, Frame(op, key, value), deadline)) {
    throw Error(Clock::now() >= deadline ? TimeoutMessage(op, key, timeout) : closed);
  }
  auto take = [&](const std::vector<char>& got) {
    if (HasMark(got, kAbortMark)) throw ConnectAborted(AfterMark(got, kAbortMark));
    if (HasMark(got, kTimeoutMark)) throw Error(AfterMark(got, kTimeoutMark));
    return got;
  };
  for (;;) {
    std::vector<char> got;
    const int r = ReadReply(std::min(deadline, Clock::now() + std::chrono::milliseconds(100)), &got);
    if (r == 1 && HasMark(got, kMissingMark)) continue;  // a late answer to an earlier 'M'
    if (r == 1) return take(got);
    if (r < 0) throw Error(closed);
    if (Clock::now() < deadline) {
      InterruptCheck("connecting");
      continue;
    }
    if (op != 'R') throw Error(TimeoutMessage(op, key, timeout));
    // The roster: the server decides whether it completed after all or ends
    // for every rank with this timeout. Its answer, or the roster's (both
    // say the same), comes first; the other follows and is skipped below.
    const std::string ms = std::to_string(timeout.count());
    const auto ask = Clock::now() + kAskServer;
    if (SendAll(fd_, Frame('Q', "", std::vector<char>(ms.begin(), ms.end())), ask)) {
      for (;;) {
        const int q = ReadReply(ask, &got);
        if (q == 1 && HasMark(got, kMissingMark)) continue;
        if (q != 1) break;
        take(got);  // throws the reason the roster ended with
        // It completed: the other answer comes before any later request's;
        // taking it here keeps the stream in step.
        std::vector<char> second;
        while (ReadReply(ask, &second) == 1 && HasMark(second, kMissingMark)) {
        }
        return got;
      }
    }
    throw Error(RosterTimeout(address_, timeout, {}));
  }
}

void TcpStore::WaitForRoster() { Request('R', "", {}, deadline_, timeout_); }

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  Request('S', key, data, Clock::now() + timeout_, timeout_);
}

void TcpStore::set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds timeout) {
  Request('S', key, data, Clock::now() + timeout, timeout);
}

std::vector<char> TcpStore::get(const std::string& key) {
  return Request('G', key, {}, Clock::now() + timeout_, timeout_);
}

void TcpStore::Settle() {
  if (server_) return;
  Request('D', "", {}, Clock::now() + timeout_, timeout_);
}

bool TcpStore::Check(const std::string& key, std::vector<char>* value, std::chrono::milliseconds timeout) {
  const std::vector<char> got = Request('C', key, {}, Clock::now() + timeout, timeout);
  if (HasMark(got, kAbsentMark)) return false;
  if (!HasMark(got, kFoundMark)) throw Error("rendezvous '" + address_ + "': an answer out of step with the request");
  value->assign(got.begin() + static_cast<long>(kFoundMark.size()), got.end());
  return true;
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const std::string& k : keys) Request('G', k, {}, deadline, timeout);
}

}  // namespace reshard
