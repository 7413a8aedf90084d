// Wall time of the compiler's phases, printed to stderr when the environment
// sets RESHARD_PHASES (a profiling aid: `RESHARD_PHASES=1 reshard compile ...`):
// each Phase measures from its construction to its destruction, with the
// process's minor page faults in between (all threads': the fills run at once)
// and the process's peak memory (resident) at its end.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sys/resource.h>

namespace reshard {

class Phase {
 public:
  explicit Phase(const char* name) : name_(name), on_(std::getenv("RESHARD_PHASES") != nullptr) {
    if (on_) t0_ = std::chrono::steady_clock::now(), faults0_ = Faults();
  }
  ~Phase() {
    if (!on_) return;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    std::fprintf(stderr, "phase %-24s %9.1f ms %8ld faults %6ld MiB peak\n", name_, ms, u.ru_minflt - faults0_,
                 u.ru_maxrss / 1024);
  }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  static long Faults() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
  }
  const char* name_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
  long faults0_ = 0;
};

}  // namespace reshard
