// reshard run PLAN --local | --ranks A-B --rendezvous DIR|HOST:PORT: executes
// a plan with one process per global rank (all of them, or ranks A..B meeting
// the other hosts' ranks) over Gloo, with synthetic weights, and checks every
// destination element of its ranks.
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/gloo_transport.h"
#include "runtime/plan.h"
#include "runtime/synthetic.h"
#include "runtime/interrupt.h"
#include "runtime/supervise.h"
#include "runtime/tcp_store.h"
#include "tools/commands.h"

namespace reshard::cli {
namespace {


// What a rank's process said (its pipe's lines).
struct RankReport {
  bool reported = false;  // the child sent a result line
  bool ok = false;
  std::string error;
  uint64_t bytes_sent = 0, net_bytes = 0, nvlink_bytes = 0, checked = 0, wrong = 0;
  double seconds = 0;
  std::vector<std::string> wrong_elements;
};

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// The child's side: everything it has to say goes into `fd` as lines.
int RunChild(const Plan& plan, uint32_t rank, const std::string& rendezvous, const std::string& listen,
             const std::string& nvlink_listen, double timeout_s, int fd) {
  // Ctrl-C (or the parent's forwarded signal) ends connecting or the run
  // within a second; the peers fail at once, naming this rank.
  InterruptScope interrupts;
  try {
    GlooOptions options;
    options.rendezvous = rendezvous;
    options.hostname = listen;
    options.nvlink_hostname = nvlink_listen;
    options.prefix = "run";
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    // Over the active ranks only: process_of(rank) of active_ranks().size().
    GlooTransport transport(static_cast<uint32_t>(plan.process_of(rank)),
                            static_cast<uint32_t>(plan.active_ranks().size()), options);
    // Every rank starts its run together (filling its sources takes each a
    // different time), so that the slowest rank's time is the run's.
    SyntheticRun run = RunSynthetic(plan, rank, transport, 10, [&] { transport.barrier(); });
    std::ostringstream out;
    out.precision(9);
    out << "ok " << run.stats.bytes_sent << " " << run.stats.channels[0].bytes_sent << " "
        << run.stats.channels[1].bytes_sent << " " << run.stats.seconds << " " << run.check.checked << " "
        << run.check.wrong << "\n";
    for (const WrongElement& w : run.check.first) out << "wrong " << OneLine(FormatWrong(w)) << "\n";
    WriteAll(fd, out.str());
    // Stay connected until every rank is done: closing while a peer still
    // receives what this rank sent can lose it (runtime/gloo_transport.h).
    // This rank's result stands whatever happens to the others here.
    try {
      transport.barrier();
    } catch (const std::exception&) {
    }
    return run.check.wrong == 0 ? 0 : 1;
  } catch (const Interrupted& e) {
    WriteAll(fd, "error " + OneLine(e.what()) + "\n");
    return 128 + e.signal();
  } catch (const std::exception& e) {
    WriteAll(fd, "error " + OneLine(e.what()) + "\n");
    return 1;
  }
}

RankReport Parse(const std::string& text) {
  RankReport r;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("ok ", 0) == 0) {
      std::istringstream f(line.substr(3));
      f >> r.bytes_sent >> r.net_bytes >> r.nvlink_bytes >> r.seconds >> r.checked >> r.wrong;
      r.reported = true;
      r.ok = true;
    } else if (line.rfind("wrong ", 0) == 0) {
      r.wrong_elements.push_back(line.substr(6));
    } else if (line.rfind("error ", 0) == 0) {
      r.reported = true;
      r.error = line.substr(6);
    }
  }
  return r;
}

std::string Describe(const RankReport& r, const ChildOutcome& c) {
  if (!r.error.empty()) return r.error;
  if (c.killed) return c.killed_why;
  if (WIFSIGNALED(c.status)) {
    return std::string("crashed (signal ") + std::to_string(WTERMSIG(c.status)) + ", " + strsignal(WTERMSIG(c.status)) +
           ")";
  }
  if (WIFEXITED(c.status) && !r.reported) {
    return "exited with status " + std::to_string(WEXITSTATUS(c.status)) + " without a report";
  }
  return "";
}

std::string Bytes(double b) {
  char buf[32];
  if (b >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  } else if (b >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  } else if (b >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.2f kB", b / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  }
  return buf;
}

// The address of this host's interface that reaches `host` (what a peer
// there can connect back to); 127.0.0.1 when it cannot be found.
std::string LocalAddressTowards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "127.0.0.1";
  std::string out = "127.0.0.1";
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof me;
    char buf[INET_ADDRSTRLEN];
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
        inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf) != nullptr) {
      out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

// The active ranks of [first, last] (one process each: idle ranks, unused
// GPUs of partly used NVLink domains, have nothing to run, and the transport
// connects the active ranks only: process i plays active_ranks()[i]), and
// the plan's round count, which bounds the run. Every program is checked
// before any process starts.
struct RankSet {
  std::vector<uint32_t> plan_ranks;
  uint32_t first = 0, last = 0, total = 0, idle = 0, rounds = 0;
};

RankSet ActiveRanks(const Plan& plan, uint32_t first, uint32_t last) {
  RankSet set;
  set.total = plan.num_ranks();
  if (last == UINT32_MAX) last = set.total - 1;
  if (last >= set.total) {
    throw Error("--ranks: rank " + std::to_string(last) + " is out of range: the plan has " +
                std::to_string(set.total) + " ranks (0-" + std::to_string(set.total - 1) + ")");
  }
  set.first = first;
  set.last = last;
  for (uint32_t r = first; r <= last; ++r)
    if (plan.process_of(r) >= 0) set.plan_ranks.push_back(r);
  if (set.plan_ranks.empty()) {
    throw Error("--ranks " + std::to_string(first) + "-" + std::to_string(last) +
                ": every one of these plan ranks is idle (no side, buffers or steps): nothing to run here");
  }
  set.idle = last - first + 1 - static_cast<uint32_t>(set.plan_ranks.size());
  for (uint32_t r = 0; r < set.total; ++r) {
    const fb::Program& p = plan.program(r);
    if (p.round_begin() && p.round_begin()->size() > 0) set.rounds = std::max(set.rounds, p.round_begin()->size() - 1);
  }
  return set;
}

// Where the ranks meet and listen. An empty rendezvous becomes a temporary
// directory, removed when this goes out of scope.
struct Meeting {
  std::string rendezvous, listen, temporary;
  ~Meeting() {
    std::error_code ec;
    if (!temporary.empty()) std::filesystem::remove_all(temporary, ec);
  }
};

void Meet(Meeting& m) {
  if (m.rendezvous.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "reshard-run-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      throw Error(std::string("cannot create a temporary directory: ") + strerror(errno));
    }
    m.rendezvous = m.temporary = tmpl;
  } else if (IsHostPort(m.rendezvous)) {
    HostPort hp = ParseHostPort(m.rendezvous, "--rendezvous");
    if (m.listen.empty()) m.listen = LocalAddressTowards(hp.host);
  } else {
    std::error_code ec;
    if (!std::filesystem::is_directory(m.rendezvous, ec)) {
      throw Error("--rendezvous: '" + m.rendezvous + "' is neither HOST:PORT nor an existing directory");
    }
  }
  if (m.listen.empty()) m.listen = "127.0.0.1";
}

// The run as a whole, from every rank's report and process.
struct Summary {
  uint64_t bytes = 0, net = 0, nvlink = 0, checked = 0, wrong = 0;
  double seconds = 0;  // the slowest rank's
  uint32_t failed = 0;
  std::vector<std::string> failures, wrong_elements;
  bool success() const { return failed == 0 && wrong == 0; }
};

Summary Summarize(const RankSet& set, const SuperviseResult& run) {
  Summary sum;
  for (size_t i = 0; i < set.plan_ranks.size(); ++i) {
    const ChildOutcome& c = run.children[i];
    const RankReport r = Parse(c.text);
    const std::string rank = "rank " + std::to_string(set.plan_ranks[i]);
    sum.bytes += r.bytes_sent;
    sum.net += r.net_bytes;
    sum.nvlink += r.nvlink_bytes;
    sum.checked += r.checked;
    sum.wrong += r.wrong;
    sum.seconds = std::max(sum.seconds, r.seconds);
    // A rank killed after reporting success was only waiting for its peers;
    // one that found wrong elements exits 1 and has said so.
    const bool rank_ok = r.ok && (c.killed || (WIFEXITED(c.status) && (WEXITSTATUS(c.status) == 0 || r.wrong > 0)));
    if (!rank_ok) {
      ++sum.failed;
      std::string why = Describe(r, c);
      if (why.rfind("rank ", 0) != 0) why = rank + ": " + why;
      sum.failures.push_back(why);
    }
    for (const std::string& w : r.wrong_elements) sum.wrong_elements.push_back(rank + ": " + w);
  }
  return sum;
}

void PrintJson(const std::string& path, const RankSet& set, const Summary& sum) {
  nlohmann::ordered_json j;
  j["plan"] = path;
  j["ranks"] = set.plan_ranks.size();
  j["failed_ranks"] = sum.failed;
  j["bytes"] = sum.bytes;
  j["net_bytes"] = sum.net;
  j["nvlink_bytes"] = sum.nvlink;
  j["seconds"] = sum.seconds;
  j["gbps"] = sum.seconds > 0 ? static_cast<double>(sum.bytes) / sum.seconds / 1e9 : 0.0;
  j["checked"] = sum.checked;
  j["wrong"] = sum.wrong;
  j["ok"] = sum.success();
  j["first_rank"] = set.first;
  j["plan_ranks"] = set.total;
  j["idle_ranks"] = set.idle;
  j["failures"] = sum.failures;
  j["wrong_elements"] = sum.wrong_elements;
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

void PrintText(const RankSet& set, const Summary& sum) {
  for (const std::string& f : sum.failures) std::fprintf(stderr, "reshard run: %s\n", f.c_str());
  const uint32_t n = static_cast<uint32_t>(set.plan_ranks.size());
  const std::string skipped = set.idle == 0 ? "" : ", " + std::to_string(set.idle) + " idle ranks need no process";
  if (n + set.idle == set.total) {
    std::printf("ranks:   %u, %u failed%s\n", n, sum.failed, skipped.c_str());
  } else {
    std::printf("ranks:   %u (%u-%u of %u), %u failed%s\n", n, set.first, set.last, set.total, sum.failed,
                skipped.c_str());
  }
  const double gbps = sum.seconds > 0 ? static_cast<double>(sum.bytes) / sum.seconds / 1e9 : 0;
  std::printf("moved:   %s (net %s, nvlink %s) in %.3f s: %.3f GB/s\n", Bytes(static_cast<double>(sum.bytes)).c_str(),
              Bytes(static_cast<double>(sum.net)).c_str(), Bytes(static_cast<double>(sum.nvlink)).c_str(), sum.seconds,
              gbps);
  std::printf("checked: %llu elements, %llu wrong\n", static_cast<unsigned long long>(sum.checked),
              static_cast<unsigned long long>(sum.wrong));
  for (const std::string& w : sum.wrong_elements) std::printf("  %s\n", w.c_str());
  std::printf("%s\n", sum.success() ? "ok" : "FAILED");
}

// Ranks [first, last] of the plan, each a process here; `rendezvous` empty:
// all ranks, meeting in a temporary directory.
int RunRanks(const std::string& path, uint32_t first, uint32_t last, const std::string& rendezvous,
             const std::string& listen, const std::string& nvlink_listen, double timeout_s, bool json) {
  Plan plan = Plan::open(path);
  const RankSet set = ActiveRanks(plan, first, last);
  Meeting meeting{rendezvous, listen, ""};
  Meet(meeting);

  SuperviseOptions options;
  // Every rank bounds its own waits by the timeout; the watchdog only
  // catches a rank stuck elsewhere (connecting takes one timeout, each
  // round at most one more). After a failure the others get 1.5 s to notice
  // and report it themselves. SIGINT/SIGTERM/SIGHUP go on to every rank,
  // which ends within a second and says so; the run then exits 128 + the
  // signal.
  options.watchdog_s = timeout_s * (set.rounds + 2) + 10;
  options.failure_grace = std::chrono::milliseconds(1500);
  options.forward_interrupts = true;
  options.name = [&](size_t i) { return "rank " + std::to_string(set.plan_ranks[i]); };
  const bool tty = isatty(STDERR_FILENO);
  auto last_shown = std::chrono::steady_clock::time_point();
  options.progress = [&](size_t ended, size_t n) {
    const auto now = std::chrono::steady_clock::now();
    if (!tty && ended != n && now - last_shown < std::chrono::seconds(1)) return;
    last_shown = now;
    std::fprintf(stderr, tty ? "\rreshard run: %zu/%zu ranks finished" : "reshard run: %zu/%zu ranks finished\n",
                 ended, n);
    if (tty && ended == n) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
  const SuperviseResult run = Supervise(
      set.plan_ranks.size(),
      [&](size_t i, int fd) {
        return RunChild(plan, set.plan_ranks[i], meeting.rendezvous, meeting.listen, nvlink_listen, timeout_s, fd);
      },
      options);

  const Summary sum = Summarize(set, run);
  if (json) {
    PrintJson(path, set, sum);
  } else {
    PrintText(set, sum);
  }
  std::fflush(stdout);
  if (run.interrupted != 0) {
    std::fprintf(stderr, "reshard run: interrupted (%s)\n", SignalName(run.interrupted).c_str());
    return 128 + run.interrupted;
  }
  return sum.success() ? 0 : 1;
}

}  // namespace

void AddRunCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("run", "Run a plan on this machine, one process per rank over Gloo, with "
                                        "synthetic weights, and check every destination element");
  struct Options {
    std::string plan;
    bool local = false;
    std::string ranks, rendezvous, listen, nvlink_listen;
    double timeout = 60;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  cmd->add_option("PLAN", opts->plan, "the plan file (.rsplan)")->required();
  cmd->add_flag("--local", opts->local, "run every rank as a process on this machine");
  cmd->add_option("--ranks", opts->ranks,
                  "run plan ranks A-B (or one rank A) here, one process per active rank (idle ranks "
                  "need none), meeting the other hosts' ranks through --rendezvous");
  cmd->add_option("--rendezvous", opts->rendezvous,
                  "where the ranks meet: a fresh directory every host shares, or HOST:PORT (the host "
                  "running the first active rank serves it there)");
  cmd->add_option("--listen", opts->listen,
                  "address this host's ranks listen on for their peers (default: the address that "
                  "reaches the rendezvous host; 127.0.0.1 with a directory)");
  cmd->add_option("--nvlink-listen", opts->nvlink_listen,
                  "address for the messages of the plan's nvlink channel (a second Gloo mesh, e.g. over "
                  "another interface); default: they share the --listen mesh");
  cmd->add_option("--timeout", opts->timeout, "seconds a rank waits for a peer before failing (default 60)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", opts->json, "print the result as JSON");
  cmd->callback([opts, &exit_code] {
    if (opts->local) {
      if (!opts->ranks.empty() || !opts->rendezvous.empty()) {
        throw Error("run: --local runs every rank here: it takes no --ranks or --rendezvous");
      }
      exit_code = RunRanks(opts->plan, 0, UINT32_MAX, "", opts->listen, opts->nvlink_listen, opts->timeout, opts->json);
      return;
    }
    if (opts->ranks.empty() || opts->rendezvous.empty()) {
      throw Error("run: pass --local, or --ranks A-B with --rendezvous DIR|HOST:PORT");
    }
    uint32_t a = 0, b = 0;
    auto number = [&](const std::string& t) -> uint32_t {
      if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos) {
        throw Error("--ranks: '" + opts->ranks + "' is not A-B or A (ranks are numbers from 0)");
      }
      return static_cast<uint32_t>(std::stoul(t));
    };
    size_t dash = opts->ranks.find('-');
    a = number(opts->ranks.substr(0, dash));
    b = dash == std::string::npos ? a : number(opts->ranks.substr(dash + 1));
    if (b < a) throw Error("--ranks: '" + opts->ranks + "' is empty (B < A)");
    exit_code = RunRanks(opts->plan, a, b, opts->rendezvous, opts->listen, opts->nvlink_listen, opts->timeout, opts->json);
  });
}

}  // namespace reshard::cli
