// reshard run PLAN --local | --ranks A-B --rendezvous DIR|HOST:PORT: executes
// a plan with one process per global rank (all of them, or ranks A..B meeting
// the other hosts' ranks) over Gloo, with synthetic weights, and checks every
// destination element of its ranks.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
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

#include "runtime/error.h"
#include "runtime/gloo_transport.h"
#include "runtime/plan.h"
#include "runtime/synthetic.h"
#include "runtime/interrupt.h"
#include "runtime/tcp_store.h"
#include "tools/commands.h"

namespace reshard::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct RankReport {
  bool reported = false;  // the child sent a result line
  bool ok = false;
  std::string error;
  uint64_t bytes_sent = 0, net_bytes = 0, nvlink_bytes = 0, checked = 0, wrong = 0;
  double seconds = 0;
  std::vector<std::string> wrong_elements;
  std::string text;  // raw pipe contents
  // Process state.
  pid_t pid = -1;
  int fd = -1;
  bool exited = false;
  int status = 0;
  bool killed = false;
  std::string killed_why;
};

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t w = write(fd, s.data() + off, s.size() - off);
    if (w <= 0) return;
    off += static_cast<size_t>(w);
  }
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

void Parse(RankReport& r) {
  std::istringstream in(r.text);
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
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string Describe(const RankReport& r) {
  if (!r.error.empty()) return r.error;
  if (r.killed) return r.killed_why;
  if (r.exited && WIFSIGNALED(r.status)) {
    return std::string("crashed (signal ") + std::to_string(WTERMSIG(r.status)) + ", " + strsignal(WTERMSIG(r.status)) +
           ")";
  }
  if (r.exited && WIFEXITED(r.status) && !r.reported) {
    return "exited with status " + std::to_string(WEXITSTATUS(r.status)) + " without a report";
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

// Ranks [first, last] of the plan, each a process here; `rendezvous` empty:
// all ranks, meeting in a temporary directory.
int RunRanks(const std::string& path, uint32_t first, uint32_t last, std::string rendezvous, std::string listen,
             const std::string& nvlink_listen, double timeout_s, bool json) {
  Plan plan = Plan::open(path);
  const uint32_t total = plan.num_ranks();
  if (last == UINT32_MAX) last = total - 1;
  if (last >= total) {
    throw Error("--ranks: rank " + std::to_string(last) + " is out of range: the plan has " + std::to_string(total) +
                " ranks (0-" + std::to_string(total - 1) + ")");
  }
  // One process per active rank of the range: idle ranks (unused GPUs of
  // partly used NVLink domains) have nothing to run, and the transport
  // connects the active ranks only (process i plays active_ranks()[i]).
  std::vector<uint32_t> plan_ranks;
  for (uint32_t r = first; r <= last; ++r)
    if (plan.process_of(r) >= 0) plan_ranks.push_back(r);
  if (plan_ranks.empty()) {
    throw Error("--ranks " + std::to_string(first) + "-" + std::to_string(last) +
                ": every one of these plan ranks is idle (no side, buffers or steps): nothing to run here");
  }
  const uint32_t n = static_cast<uint32_t>(plan_ranks.size());
  const uint32_t idle = last - first + 1 - n;
  uint32_t rounds = 0;
  for (uint32_t r = 0; r < total; ++r) {
    const fb::Program& p = plan.program(r);  // every program checked before any process starts
    if (p.round_begin() && p.round_begin()->size() > 0) rounds = std::max(rounds, p.round_begin()->size() - 1);
  }
  std::string tmpl;
  if (rendezvous.empty()) {
    tmpl = (std::filesystem::temp_directory_path() / "reshard-run-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      throw Error(std::string("cannot create a temporary directory: ") + strerror(errno));
    }
    rendezvous = tmpl;
  } else if (IsHostPort(rendezvous)) {
    HostPort hp = ParseHostPort(rendezvous, "--rendezvous");
    if (listen.empty()) listen = LocalAddressTowards(hp.host);
  } else {
    std::error_code ec;
    if (!std::filesystem::is_directory(rendezvous, ec)) {
      throw Error("--rendezvous: '" + rendezvous + "' is neither HOST:PORT nor an existing directory");
    }
  }
  if (listen.empty()) listen = "127.0.0.1";
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } remove_dir{tmpl};

  std::vector<RankReport> ranks(n);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  for (uint32_t r = 0; r < n; ++r) {
    const uint32_t rank = plan_ranks[r];
    int fds[2];
    if (pipe(fds) != 0) throw Error(std::string("pipe: ") + strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
      for (uint32_t k = 0; k < r; ++k) kill(ranks[k].pid, SIGKILL);
      throw Error(std::string("fork: ") + strerror(errno));
    }
    if (pid == 0) {
      // A child never outlives the parent.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      close(fds[0]);
      for (uint32_t k = 0; k < r; ++k) close(ranks[k].fd);
      _exit(RunChild(plan, rank, rendezvous, listen, nvlink_listen, timeout_s, fds[1]));
    }
    close(fds[1]);
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    ranks[r].pid = pid;
    ranks[r].fd = fds[0];
  }

  // Every rank bounds its own waits by the timeout; this watchdog only
  // catches a rank stuck elsewhere (connecting takes one timeout, each round
  // at most one more).
  // Opened after the forks (a child must not inherit the watcher thread):
  // SIGINT/SIGTERM/SIGHUP to this process go on to every rank, which ends
  // within a second and says so; the run then exits 128 + the signal.
  InterruptScope interrupts;
  int interrupted = 0;
  const auto start = Clock::now();
  const double watchdog_s = timeout_s * (rounds + 2) + 10;
  const bool tty = isatty(STDERR_FILENO);
  Clock::time_point grace_end = Clock::time_point::max();
  std::string first_failure;
  uint32_t finished = 0, shown = UINT32_MAX;
  auto last_shown = Clock::now();
  while (finished < n) {
    std::vector<pollfd> pfds;
    for (auto& r : ranks) {
      if (r.fd >= 0) pfds.push_back({r.fd, POLLIN, 0});
    }
    poll(pfds.data(), pfds.size(), 50);
    for (auto& r : ranks) {
      if (r.fd < 0) continue;
      char buf[4096];
      ssize_t k;
      while ((k = read(r.fd, buf, sizeof buf)) > 0) r.text.append(buf, static_cast<size_t>(k));
      if (k == 0) {
        close(r.fd);
        r.fd = -1;
      }
    }
    for (uint32_t i = 0; i < n; ++i) {
      RankReport& r = ranks[i];
      if (r.exited) continue;
      if (waitpid(r.pid, &r.status, WNOHANG) != r.pid) continue;
      r.exited = true;
      ++finished;
      bool failed = !(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
      if (failed && first_failure.empty()) {
        first_failure = "rank " + std::to_string(plan_ranks[i]);
        // Let the other ranks notice and report the failure themselves.
        grace_end = Clock::now() + std::chrono::milliseconds(1500);
      }
    }
    if (const int sig = interrupts.signal(); sig != 0 && interrupted == 0) {
      interrupted = sig;
      for (const RankReport& r : ranks)
        if (!r.exited) kill(r.pid, sig);  // a terminal's Ctrl-C reached them already; a kill to this pid did not
      if (first_failure.empty()) first_failure = "the run was interrupted (" + SignalName(sig) + ")";
      grace_end = std::min(grace_end, Clock::now() + std::chrono::milliseconds(1000));
    }
    const auto now = Clock::now();
    const bool watchdog = std::chrono::duration<double>(now - start).count() > watchdog_s;
    if (now > grace_end || watchdog) {
      for (uint32_t i = 0; i < n; ++i) {
        RankReport& r = ranks[i];
        if (r.exited) continue;
        kill(r.pid, SIGKILL);
        waitpid(r.pid, &r.status, 0);
        r.exited = true;
        r.killed = true;
        char why[160];
        if (watchdog) {
          std::snprintf(why, sizeof why, "did not finish within %.0f s (killed)", watchdog_s);
        } else if (interrupted != 0) {
          std::snprintf(why, sizeof why, "did not end within 1 s of the interrupt (%s): killed",
                        SignalName(interrupted).c_str());
        } else {
          std::snprintf(why, sizeof why, "killed after %s failed", first_failure.c_str());
        }
        r.killed_why = why;
        ++finished;
      }
    }
    if (finished != shown && (tty || finished == n || now - last_shown > std::chrono::seconds(1))) {
      std::fprintf(stderr, tty ? "\rreshard run: %u/%u ranks finished" : "reshard run: %u/%u ranks finished\n",
                   finished, n);
      if (tty && finished == n) std::fputc('\n', stderr);
      std::fflush(stderr);
      shown = finished;
      last_shown = now;
    }
  }
  for (auto& r : ranks) {
    if (r.fd >= 0) {
      char buf[4096];
      ssize_t k;
      while ((k = read(r.fd, buf, sizeof buf)) > 0) r.text.append(buf, static_cast<size_t>(k));
      close(r.fd);
    }
    Parse(r);
  }

  uint64_t bytes = 0, net = 0, nvlink = 0, checked = 0, wrong = 0;
  double seconds = 0;
  uint32_t failed = 0;
  std::vector<std::string> failures, wrong_elements;
  for (uint32_t i = 0; i < n; ++i) {
    const RankReport& r = ranks[i];
    bytes += r.bytes_sent;
    net += r.net_bytes;
    nvlink += r.nvlink_bytes;
    checked += r.checked;
    wrong += r.wrong;
    seconds = std::max(seconds, r.seconds);
    // A rank killed after reporting success was only waiting for its peers.
    const bool rank_ok =
        r.ok && r.exited && (r.killed || (WIFEXITED(r.status) && (WEXITSTATUS(r.status) == 0 || r.wrong > 0)));
    if (!rank_ok) {
      ++failed;
      std::string why = Describe(r);
      if (why.rfind("rank ", 0) != 0) why = "rank " + std::to_string(plan_ranks[i]) + ": " + why;
      failures.push_back(why);
    }
    for (const std::string& w : r.wrong_elements) wrong_elements.push_back("rank " + std::to_string(plan_ranks[i]) + ": " + w);
  }
  const double gbps = seconds > 0 ? bytes / seconds / 1e9 : 0;
  const bool success = failed == 0 && wrong == 0;
  if (json) {
    std::printf("{\"plan\": %s, \"ranks\": %u, \"failed_ranks\": %u, \"bytes\": %llu, \"net_bytes\": %llu, "
                "\"nvlink_bytes\": %llu, \"seconds\": %.6f, \"gbps\": %.6f, \"checked\": %llu, \"wrong\": %llu, "
                "\"ok\": %s, \"first_rank\": %u, \"plan_ranks\": %u, \"idle_ranks\": %u, \"failures\": [",
                JsonString(path).c_str(), n, failed, static_cast<unsigned long long>(bytes),
                static_cast<unsigned long long>(net), static_cast<unsigned long long>(nvlink), seconds, gbps,
                static_cast<unsigned long long>(checked), static_cast<unsigned long long>(wrong),
                success ? "true" : "false", first, total, idle);
    for (size_t i = 0; i < failures.size(); ++i) std::printf("%s%s", i ? ", " : "", JsonString(failures[i]).c_str());
    std::printf("], \"wrong_elements\": [");
    for (size_t i = 0; i < wrong_elements.size(); ++i) {
      std::printf("%s%s", i ? ", " : "", JsonString(wrong_elements[i]).c_str());
    }
    std::printf("]}\n");
  } else {
    for (const std::string& f : failures) std::fprintf(stderr, "reshard run: %s\n", f.c_str());
    const std::string skipped = idle == 0 ? "" : ", " + std::to_string(idle) + " idle ranks need no process";
    if (n + idle == total) {
      std::printf("ranks:   %u, %u failed%s\n", n, failed, skipped.c_str());
    } else {
      std::printf("ranks:   %u (%u-%u of %u), %u failed%s\n", n, first, last, total, failed, skipped.c_str());
    }
    std::printf("moved:   %s (net %s, nvlink %s) in %.3f s: %.3f GB/s\n", Bytes(static_cast<double>(bytes)).c_str(),
                Bytes(static_cast<double>(net)).c_str(), Bytes(static_cast<double>(nvlink)).c_str(), seconds, gbps);
    std::printf("checked: %llu elements, %llu wrong\n", static_cast<unsigned long long>(checked),
                static_cast<unsigned long long>(wrong));
    for (const std::string& w : wrong_elements) std::printf("  %s\n", w.c_str());
    std::printf("%s\n", success ? "ok" : "FAILED");
  }
  std::fflush(stdout);
  if (interrupted != 0) {
    std::fprintf(stderr, "reshard run: interrupted (%s)\n", SignalName(interrupted).c_str());
    return 128 + interrupted;
  }
  return success ? 0 : 1;
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
