// Wall time of the compiler's phases, printed to stderr when the environment
// sets RESHARD_PHASES (a profiling aid: `RESHARD_PHASES=1 reshard compile ...`):
// each Phase measures from its construction to its destruction, with the
// process's CPU time (all threads': cpu/wall near 2 on 2 cores is a phase
// that keeps both busy) and minor page faults in between, and the process's
// peak memory (resident) at its end.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sys/resource.h>

namespace reshard {

class Phase {
 public:
  explicit Phase(const char* name) : name_(name), on_(std::getenv("RESHARD_PHASES") != nullptr) {
    if (on_) t0_ = std::chrono::steady_clock::now(), Usage(cpu0_, faults0_);
  }
  ~Phase() {
    if (!on_) return;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    double cpu = 0;
    long faults = 0;
    const long peak = Usage(cpu, faults);
    std::fprintf(stderr, "phase %-24s %9.1f ms %9.1f cpu ms %8ld faults %6ld MiB peak\n", name_, ms, cpu - cpu0_,
                 faults - faults0_, peak / 1024);
  }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  // The process's CPU milliseconds and minor faults so far; its peak resident KiB.
  static long Usage(double& cpu_ms, long& faults) {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    cpu_ms = (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
    faults = u.ru_minflt;
    return u.ru_maxrss;
  }
  const char* name_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
  double cpu0_ = 0;
  long faults0_ = 0;
};

}  // namespace reshard
