// Rank processes on one machine: Supervise forks one child per rank, each
// writing what it has to say into a pipe, and watches them together until
// every one has ended. It is what `reshard run` runs its ranks with and what
// the multi-process tests run theirs with (runtime/test.h):
//   - a child never outlives the supervisor (PR_SET_PDEATHSIG);
//   - after the first child fails, the others get `failure_grace` to notice
//     and say so themselves, then are killed;
//   - SIGINT/SIGTERM/SIGHUP to the supervisor go on to every child, which
//     gets a second to end and report;
//   - a watchdog kills whatever still runs after `watchdog_s`.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace reshard {

struct ChildOutcome {
  std::string text;         // everything the child wrote into its pipe
  int status = 0;           // waitpid's status
  bool killed = false;      // by the supervisor (grace, interrupt or watchdog): see killed_why
  bool timed_out = false;   // killed by the watchdog
  std::string killed_why;   // "did not finish within 40 s (killed)", ...
  double seconds = 0;       // from the start until it ended

  /// Exited normally with status 0.
  bool succeeded() const;
  /// The exit status, or -1 when a signal ended it.
  int exit_code() const;
};

struct SuperviseOptions {
  /// Kill every child still running this many seconds after the start (0: never).
  double watchdog_s = 0;
  /// After the first child fails (a non-zero exit or a signal), the others
  /// get this long, then are killed (negative: they run on).
  std::chrono::milliseconds failure_grace{-1};
  /// Pass SIGINT/SIGTERM/SIGHUP on to every child; they get a second.
  bool forward_interrupts = false;
  /// Names child i in the kill reasons ("rank 3"); default "child i".
  std::function<std::string(size_t)> name;
  /// Called whenever the number of children that ended changes (first with 0).
  std::function<void(size_t ended, size_t n)> progress;
};

struct SuperviseResult {
  std::vector<ChildOutcome> children;
  int interrupted = 0;  // the signal that was passed on, 0 if none
};

/// Forks `n` children; child i runs child(i, fd), where fd is its pipe's
/// write end, and exits with what it returns (an exception escaping it is
/// written into the pipe and exits 1). Returns when every child has ended.
/// Throws reshard::Error when a pipe or a fork fails (after killing the
/// children started).
SuperviseResult Supervise(size_t n, const std::function<int(size_t i, int fd)>& child, const SuperviseOptions& options);

/// Writes all of `s` into `fd` (a child's pipe); stops at a closed pipe.
void WriteAll(int fd, const std::string& s);

}  // namespace reshard
