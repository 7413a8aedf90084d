#include "runtime/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

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
  int scopes = 0;
  struct sigaction old[3];
  bool installed[3] = {false, false, false};
  std::thread watcher;
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

void Watch() {
  for (;;) {
    char c;
    ssize_t n = ::read(g_pipe[0], &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == 0) return;  // 0: the last scope closed
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
  if (s.scopes++ > 0) return;
  g_signal = 0;
  s.fired = false;
  if (g_pipe[0] < 0 && ::pipe2(g_pipe, O_CLOEXEC) != 0) {
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
  s.watcher = std::thread(Watch);
}

InterruptScope::~InterruptScope() {
  State& s = S();
  std::thread watcher;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (--s.scopes > 0) return;
    for (int i = 0; i < 3; ++i)
      if (s.installed[i]) sigaction(kSignals[i], &s.old[i], nullptr);
    const char stop = 0;
    [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &stop, 1);
    watcher = std::move(s.watcher);
  }
  if (watcher.joinable()) watcher.join();
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
