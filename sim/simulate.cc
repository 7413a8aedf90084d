// Simulate (sim/simulate.h): the SimGrid replay, loaded from its module on
// first use, and where a prediction's time above its bound goes.
#include "sim/simulate.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <mutex>
#include <string>

#include "runtime/error.h"

namespace reshard::sim {

namespace {

// The module beside the running executable (the build tree's reshard and
// its test programs, or reshard/bin/ of the Python package).
std::string ModulePath() {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) throw Error("simulate: cannot find the running executable (/proc/self/exe) to load the SimGrid replay");
  std::string dir(exe, static_cast<size_t>(n));
  dir.resize(dir.rfind('/') + 1);
  return dir + "libreshard_simgrid.so";
}

ReplayFn LoadReplay() {
  const std::string path = ModulePath();
  void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!module)
    throw Error(std::string("simulate: cannot load the SimGrid replay: ") + dlerror() +
                " (libreshard_simgrid.so is built and installed beside the reshard executable; rebuild, or "
                "reinstall the package)");
  auto entry = reinterpret_cast<ReplayFn (*)()>(dlsym(module, "reshard_simgrid_replay"));
  if (!entry) throw Error("simulate: " + path + " has no entry reshard_simgrid_replay: a module of another build");
  return entry();  // the module stays loaded: SimGrid keeps state until the process ends
}

}  // namespace

SimResult Simulate(const Workload& w, const ClusterSpec& cluster, const SimOptions& opt) {
  // SimGrid keeps its engine, and its clock, for the process: a second
  // replay in one process reports the first's time plus its own (one 1 GiB
  // message at 50 GB/s: 21.5 ms, then 43.0 ms; sim/one_simulation_test.cc).
  // Refused, not mispredicted.
  static std::atomic<bool> ran{false};
  if (ran.exchange(true))
    throw Error("simulate: SimGrid runs one simulation per process, and this process has run one; simulate each "
                "plan in a process of its own (`reshard simulate`, or fork first, as `compile --simulate-fills` does)");
  static std::once_flag once;
  static ReplayFn replay = nullptr;
  std::call_once(once, [] { replay = LoadReplay(); });
  return replay(w, cluster, opt);
}

GapToBound GapOf(const SimResult& r, double bound_seconds, const LinkModel& m) {
  GapToBound g;
  if (bound_seconds <= 0 || r.seconds <= 0) return g;
  if (!r.busiest.empty()) {
    const double bw = r.busiest.front().path == Path::net ? m.nic_Bps : m.nvlink_Bps;
    if (r.busiest.front().bytes > 0 && bw > 0) {
      g.has_link = true;
      g.link = r.busiest.front();
      g.link_seconds = static_cast<double>(g.link.bytes) / bw;
    }
  }
  // The resource read off: the busiest GPU's HBM where its work outlasts
  // the busiest link's bytes, else that link.
  g.hbm = r.hbm_seconds > g.link_seconds;
  const double busy = g.hbm ? r.hbm_seconds : g.link_seconds;
  if (busy <= 0) return g;
  g.has_split = true;
  g.bytes = busy / bound_seconds;
  g.idle = r.seconds / busy;
  return g;
}

}  // namespace reshard::sim
