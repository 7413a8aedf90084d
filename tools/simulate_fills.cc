#include "tools/simulate_fills.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <thread>
#include <vector>

#include "compiler/write_file.h"
#include "runtime/error.h"
#include "runtime/plan.h"
#include "sim/bound.h"
#include "sim/simulate.h"
#include "sim/workload.h"

namespace reshard::cli {
namespace {

constexpr size_t kMostChildren = 8;
constexpr size_t kMostResultBytes = 32 << 10;

std::string TempPath(const std::string& out, size_t fill) { return out + ".fill" + std::to_string(fill) + ".tmp"; }

// SIGINT, SIGTERM or SIGHUP while the fills run: noted here, the children
// killed and every temporary file removed by SimulateFills, then the signal
// raised again so that the compile ends as it would have.
volatile sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Installs OnSignal (without SA_RESTART, so that waitpid returns) for the
// fills' duration, and puts the previous handlers back.
class SignalGuard {
 public:
  SignalGuard() {
    g_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    for (size_t k = 0; k < std::size(kSignals); ++k) {
      sigaction(kSignals[k], nullptr, &old_[k]);
      set_[k] = old_[k].sa_handler != SIG_IGN;  // an ignored signal (nohup) stays ignored
      if (set_[k]) sigaction(kSignals[k], &sa, nullptr);
    }
  }
  ~SignalGuard() {
    for (size_t k = 0; k < std::size(kSignals); ++k)
      if (set_[k]) sigaction(kSignals[k], &old_[k], nullptr);
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  struct sigaction old_[std::size(kSignals)];
  bool set_[std::size(kSignals)] = {};
};

// In the child: fill `fill` compiled into `path`, simulated. One compile and
// one simulation a process: a child that compiled and simulated a second plan
// predicted a much longer refit for it than a fresh process does
// (DeepSeek-V3 FP8 GB200, 16 MiB stripes; not investigated further).
nlohmann::ordered_json CompileAndSimulate(const CompileInputs& in, CompileOptions opt, size_t fill,
                                          const std::string& path, const std::string& out) {
  opt.search_fills = true;
  opt.fill_candidate = static_cast<int>(fill);
  std::vector<uint8_t> bytes;
  nlohmann::ordered_json j;
  {
    PlanIR ir = BuildPlan(in, opt);
    bytes = EmitPlan(in, ir);
    j = CompileSummary(out, opt.strategy, ir, bytes.size());
    j["fill_candidates"] = ir.fill_candidates;
  }
  WriteFileAtomic(path, bytes);
  Plan plan = Plan::from_bytes(std::move(bytes), path);
  const sim::Workload w = sim::BuildWorkload(plan, in.cluster);
  const sim::LowerBound lb = sim::ComputeLowerBound(plan, in.cluster);
  const sim::SimResult r = sim::Simulate(w, in.cluster, {});
  j["predicted_seconds"] = r.seconds;
  j["lower_bound_seconds"] = lb.seconds;
  return j;
}

struct Child {
  pid_t pid = -1;
  int fd = -1;
  size_t fill = 0;
};

Child Launch(const CompileInputs& in, const CompileOptions& opt, size_t fill, const std::string& out) {
  int fds[2];
  if (pipe(fds) != 0) throw Error(std::string("--simulate-fills: pipe: ") + std::strerror(errno));
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]), close(fds[1]);
    throw Error(std::string("--simulate-fills: fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    for (int sig : kSignals) signal(sig, SIG_DFL);
    close(fds[0]);
    std::string msg;
    int rc = 0;
    try {
      msg = CompileAndSimulate(in, opt, fill, TempPath(out, fill), out).dump();
    } catch (const std::exception& e) {
      msg = nlohmann::json{{"error", e.what()}}.dump();
      rc = 1;
    }
    // The parent reads the pipe once this process has ended: what it writes
    // must fit the pipe's buffer (64 KiB on Linux; a summary is under 1 KiB).
    if (msg.size() > kMostResultBytes) {
      msg = nlohmann::json{{"error", "its result (" + std::to_string(msg.size()) + " bytes) is too long to report"}}.dump();
      rc = 1;
    }
    for (size_t off = 0; off < msg.size();) {
      const ssize_t k = write(fds[1], msg.data() + off, msg.size() - off);
      if (k <= 0) _exit(2);
      off += static_cast<size_t>(k);
    }
    _exit(rc);
  }
  close(fds[1]);
  return {pid, fds[0], fill};
}

std::string ReadAll(int fd) {
  std::string s;
  char buf[4096];
  for (;;) {
    const ssize_t k = read(fd, buf, sizeof buf);
    if (k > 0) {
      s.append(buf, static_cast<size_t>(k));
    } else if (k == 0 || errno != EINTR) {
      break;
    }
  }
  close(fd);
  return s;
}

}  // namespace

nlohmann::ordered_json SimulateFills(const CompileInputs& in, const CompileOptions& opt, const std::string& out,
                                     const std::function<void(size_t, size_t)>& progress) {
  if (opt.strategy != "direct") throw Error("--simulate-fills: the rounds of a gather plan are not filled; use --strategy direct");
  const size_t workers = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, kMostChildren);
  size_t total = FewestFillCandidates(), next = 0, done = 0;
  std::vector<Child> running;
  std::vector<std::string> temps;  // every file a child may leave: its plan, and WriteFileAtomic's own temporary
  std::vector<nlohmann::ordered_json> results;
  std::string failure;
  // The stripes a compile keeps (compile.cc: finer where the busiest NIC
  // waits), so that every fill is tried with them: one compile here first.
  CompileOptions each = opt;
  each.stripe_mib = BuildPlan(in, opt).round_fill.stripe_mib;
  const SignalGuard guard;
  auto cleanup = [&] {
    for (const Child& c : running) kill(c.pid, SIGKILL);
    for (const Child& c : running) {
      close(c.fd);
      waitpid(c.pid, nullptr, 0);
    }
    running.clear();
    for (const std::string& t : temps) std::remove(t.c_str());
  };
  try {
    while (failure.empty() && !g_signal && (next < total || !running.empty())) {
      while (running.size() < workers && next < total) {
        running.push_back(Launch(in, each, next, out));
        temps.push_back(TempPath(out, next));
        temps.push_back(TempPath(out, next) + ".tmp." + std::to_string(running.back().pid));
        ++next;
      }
      int status = 0;
      const pid_t pid = waitpid(-1, &status, 0);
      if (pid < 0) {
        if (errno == EINTR) continue;
        throw Error(std::string("--simulate-fills: waitpid: ") + std::strerror(errno));
      }
      auto it = std::find_if(running.begin(), running.end(), [pid](const Child& c) { return c.pid == pid; });
      if (it == running.end()) continue;
      const Child c = *it;
      running.erase(it);
      const std::string text = ReadAll(c.fd);
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        failure = "fill " + std::to_string(c.fill) + ": its compile or simulation ended without a result (" +
                  (WIFSIGNALED(status) ? std::string("killed by signal ") + std::to_string(WTERMSIG(status))
                                       : "exit status " + std::to_string(WEXITSTATUS(status))) +
                  ")";
      } else if (j.contains("error")) {
        failure = "fill " + std::to_string(c.fill) + ": " + j["error"].get<std::string>();
      } else {
        total = j["fill_candidates"].get<size_t>();
        j["fill"] = c.fill;
        results.push_back(std::move(j));
        if (progress) progress(++done, total);
      }
    }
  } catch (...) {
    cleanup();
    throw;
  }
  if (g_signal) {
    const int sig = g_signal;
    cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
    throw Error("--simulate-fills: interrupted by signal " + std::to_string(sig));
  }
  if (!failure.empty()) {
    cleanup();
    throw Error(failure);
  }
  std::sort(results.begin(), results.end(),
            [](const auto& a, const auto& b) { return a["fill"].template get<size_t>() < b["fill"].template get<size_t>(); });
  size_t best = 0;
  for (size_t k = 1; k < results.size(); ++k) {
    if (results[k]["predicted_seconds"].get<double>() < results[best]["predicted_seconds"].get<double>()) best = k;
  }
  const size_t kept = results[best]["fill"].get<size_t>();
  if (std::rename(TempPath(out, kept).c_str(), out.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    cleanup();
    throw Error(out + ": cannot write: " + why);
  }
  cleanup();
  nlohmann::ordered_json summary = results[best];
  summary.erase("fill_candidates");
  summary.erase("fill");
  nlohmann::ordered_json fills = nlohmann::ordered_json::array();
  for (const auto& r : results) {
    fills.push_back({{"fill", r["fill"]},
                     {"round_fill", r["round_fill"]},
                     {"staging_fill", r["staging_fill"]},
                     {"min_share", r["min_share"]},
                     {"split_share", r["split_share"]},
                     {"nic_reserve", r["nic_reserve"]},
                     {"stripe_mib", r["stripe_mib"]},
                     {"plan_bytes", r["plan_bytes"]},
                     {"predicted_seconds", r["predicted_seconds"]}});
  }
  summary["fills"] = fills;
  summary["kept_fill"] = kept;
  return summary;
}

}  // namespace reshard::cli
