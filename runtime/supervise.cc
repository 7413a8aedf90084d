#include "runtime/supervise.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "runtime/error.h"
#include "runtime/interrupt.h"

namespace reshard {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  pid_t pid = -1;
  int fd = -1;  // the pipe's read end, -1 once it closed
  bool ended = false;
};

// Takes what the child has written so far; closes the pipe at its end.
void Drain(Child& c, ChildOutcome& out) {
  if (c.fd < 0) return;
  char buf[4096];
  ssize_t k;
  while ((k = read(c.fd, buf, sizeof buf)) > 0) out.text.append(buf, static_cast<size_t>(k));
  if (k == 0) {
    close(c.fd);
    c.fd = -1;
  }
}

[[noreturn]] void RunChild(size_t i, int fd, const std::function<int(size_t, int)>& child) {
  int code = 1;
  try {
    code = child(i, fd);
  } catch (const std::exception& e) {
    WriteAll(fd, e.what()[0] != '\0' ? e.what() : "exception");
  } catch (...) {
    WriteAll(fd, "unknown exception");
  }
  close(fd);
  _exit(code);
}

}  // namespace

bool ChildOutcome::succeeded() const { return !killed && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

int ChildOutcome::exit_code() const { return !killed && WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = write(fd, s.data() + off, s.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    off += static_cast<size_t>(w);
  }
}

SuperviseResult Supervise(size_t n, const std::function<int(size_t i, int fd)>& child, const SuperviseOptions& options) {
  auto name = [&](size_t i) { return options.name ? options.name(i) : "child " + std::to_string(i); };
  SuperviseResult result;
  result.children.resize(n);
  std::vector<Child> kids(n);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  const auto start = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    int fds[2];
    if (pipe(fds) != 0) {
      const std::string why = strerror(errno);
      for (size_t k = 0; k < i; ++k) kill(kids[k].pid, SIGKILL);
      throw Error("pipe: " + why);
    }
    const pid_t pid = fork();
    if (pid < 0) {
      const std::string why = strerror(errno);
      for (size_t k = 0; k < i; ++k) kill(kids[k].pid, SIGKILL);
      throw Error("fork: " + why);
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a child never outlives the supervisor
      if (getppid() != parent) _exit(1);
      close(fds[0]);
      for (size_t k = 0; k < i; ++k) close(kids[k].fd);
      RunChild(i, fds[1], child);
    }
    close(fds[1]);
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    kids[i].pid = pid;
    kids[i].fd = fds[0];
  }

  // Opened after the forks: a child must not inherit the watcher thread.
  std::unique_ptr<InterruptScope> interrupts;
  if (options.forward_interrupts) interrupts = std::make_unique<InterruptScope>();
  Clock::time_point kill_at = Clock::time_point::max();
  std::string kill_why;
  size_t ended = 0;
  size_t shown = SIZE_MAX;
  while (ended < n) {
    std::vector<pollfd> pfds;
    for (const Child& c : kids)
      if (c.fd >= 0) pfds.push_back({c.fd, POLLIN, 0});
    if (pfds.empty()) {
      usleep(20000);
    } else {
      poll(pfds.data(), pfds.size(), 20);
    }
    for (size_t i = 0; i < n; ++i) Drain(kids[i], result.children[i]);
    const auto now = Clock::now();
    for (size_t i = 0; i < n; ++i) {
      Child& c = kids[i];
      ChildOutcome& out = result.children[i];
      if (c.ended || waitpid(c.pid, &out.status, WNOHANG) != c.pid) continue;
      c.ended = true;
      ++ended;
      out.seconds = std::chrono::duration<double>(now - start).count();
      if (!out.succeeded() && kill_why.empty() && options.failure_grace.count() >= 0) {
        // The others get the grace to notice and report the failure themselves.
        kill_why = "killed after " + name(i) + " failed";
        kill_at = now + options.failure_grace;
      }
    }
    if (interrupts) {
      if (const int sig = interrupts->signal(); sig != 0 && result.interrupted == 0) {
        result.interrupted = sig;
        for (const Child& c : kids)
          if (!c.ended) kill(c.pid, sig);  // a terminal's Ctrl-C reached them already; a kill to this pid did not
        kill_why = "did not end within 1 s of the interrupt (" + SignalName(sig) + "): killed";
        kill_at = std::min(kill_at, now + std::chrono::seconds(1));
      }
    }
    const bool watchdog =
        options.watchdog_s > 0 && std::chrono::duration<double>(now - start).count() > options.watchdog_s;
    if (now > kill_at || watchdog) {
      char why[64];
      std::snprintf(why, sizeof why, "did not finish within %.0f s (killed)", options.watchdog_s);
      for (size_t i = 0; i < n; ++i) {
        Child& c = kids[i];
        ChildOutcome& out = result.children[i];
        if (c.ended) continue;
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &out.status, 0);
        c.ended = true;
        out.killed = true;
        out.timed_out = watchdog;
        out.killed_why = watchdog ? why : kill_why;
        out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        ++ended;
      }
    }
    if (options.progress && ended != shown) {
      options.progress(ended, n);
      shown = ended;
    }
  }
  // What a child wrote before it ended, still in its pipe (not waiting for
  // a process it started that holds the pipe open).
  for (size_t i = 0; i < n; ++i) {
    Child& c = kids[i];
    if (c.fd < 0) continue;
    Drain(c, result.children[i]);
    if (c.fd >= 0) close(c.fd);
  }
  return result;
}

}  // namespace reshard
