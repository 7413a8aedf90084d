#include "runtime/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <pthread.h>
#include <cstdint>

namespace reshard {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

std::atomic<int> g_signal{0};
int g_pipe[2] = {-1, -1};  // the handler writes a byte; the watcher reads it

void OnSignal(int sig) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
  const int saved = errno;
  const char c = 1;
  [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &c, 1);
  errno = saved;
}

struct State {
  std::mutex mu;
  pid_t pid = 0;  // the process that installed: a forked child starts afresh
  int scopes = 0;
  struct sigaction old[3];
  bool installed[3] = {false, false, false};
  pthread_t watcher{};
  bool watching = false;
  std::map<int, std::function<void()>> aborters;
  int next = 0;
  bool fired = false;  // aborters have been called for this signal
};

State& S() {
  static State* s = new State();  // never destroyed: scopes may close during exit
  return *s;
}

void FireAborters() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.fired) return;
  s.fired = true;
  for (auto& [id, abort] : s.aborters) abort();
}

void* Watch(void* fd_arg) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(fd_arg));
  for (;;) {
    char c;
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == 0) return nullptr;  // 0: the last scope closed
    FireAborters();
  }
}

}  // namespace

std::string SignalName(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
  }
  return "signal " + std::to_string(sig);
}

InterruptScope::InterruptScope() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.pid != getpid()) {
    // Forked from a process inside a scope: its watcher thread and handlers
    // are not this process's. Start afresh (the pipe's ends are copies).
    if (s.scopes > 0 && g_pipe[0] >= 0) {
      ::close(g_pipe[0]);
      ::close(g_pipe[1]);
    }
    g_pipe[0] = g_pipe[1] = -1;
    s.scopes = 0;
    s.watching = false;
    s.pid = getpid();
  }
  if (s.scopes++ > 0) return;
  g_signal = 0;
  s.fired = false;
  // A pipe per installation: one shared with a forked process would let
  // its watcher take this one's stop byte.
  if (::pipe2(g_pipe, O_CLOEXEC) != 0) {
    g_pipe[0] = g_pipe[1] = -1;
    return;  // no watcher, no handlers: signals act as before
  }
  for (int i = 0; i < 3; ++i) {
    struct sigaction cur {};
    s.installed[i] = false;
    if (sigaction(kSignals[i], nullptr, &cur) != 0) continue;
    // Ignored signals stay ignored (nohup, a launcher's choice).
    if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN) continue;
    struct sigaction mine {};
    mine.sa_handler = OnSignal;
    sigemptyset(&mine.sa_mask);
    if (sigaction(kSignals[i], &mine, &s.old[i]) == 0) s.installed[i] = true;
  }
  s.watching = pthread_create(&s.watcher, nullptr, Watch, reinterpret_cast<void*>(static_cast<intptr_t>(g_pipe[0]))) == 0;
}

InterruptScope::~InterruptScope() {
  State& s = S();
  pthread_t watcher{};
  bool join = false;
  int fds[2] = {-1, -1};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.pid != getpid() || s.scopes == 0) return;  // opened before a fork: not this process's
    if (--s.scopes > 0) return;
    for (int i = 0; i < 3; ++i)
      if (s.installed[i]) sigaction(kSignals[i], &s.old[i], nullptr);
    if (g_pipe[1] >= 0) {
      const char stop = 0;
      [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &stop, 1);
    }
    watcher = s.watcher;
    join = s.watching;
    s.watching = false;
    fds[0] = g_pipe[0];
    fds[1] = g_pipe[1];
    g_pipe[0] = g_pipe[1] = -1;
  }
  if (join) pthread_join(watcher, nullptr);
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
}

int InterruptScope::signal() const { return g_signal.load(); }

int InterruptSignal() { return g_signal.load(); }

void InterruptCheck(const std::string& doing) {
  if (int sig = g_signal.load()) throw Interrupted(sig, "interrupted (" + SignalName(sig) + ") while " + doing);
}

int RegisterAborter(std::function<void()> abort) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  const int id = s.next++;
  if (s.fired) abort();
  s.aborters.emplace(id, std::move(abort));
  return id;
}

void UnregisterAborter(int handle) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.aborters.erase(handle);
}

}  // namespace reshard
