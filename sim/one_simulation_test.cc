// SimGrid keeps its engine and its clock for the process, so a second replay
// in one process would report the first's time plus its own (without the
// guard: 21.475 ms, then 42.950 ms for the same message). Simulate refuses it
// with a named error instead.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "runtime/error.h"
#include "sim/simulate.h"
#include "sim/test_cluster.h"
#include "sim/workload.h"

namespace reshard::sim {
namespace {

// Rank 0 sends `bytes` to rank 1 over the NIC (two domains of one GPU).
Workload OneMessage(uint64_t bytes) {
  Workload w;
  w.num_ranks = 2;
  w.num_rounds = 1;
  w.domain = {0, 1};
  w.ranks.resize(2);
  for (int p = 0; p < 2; ++p) w.sent[p].assign(2, 0), w.received[p].assign(2, 0);
  w.sent[0][0] = w.received[0][1] = w.net_bytes = bytes;
  RankRound a, b;
  a.round = b.round = 0;
  a.net.push_back({1, bytes, true});
  b.net.push_back({0, bytes, false});
  w.ranks[0].push_back(a);
  w.ranks[1].push_back(b);
  return w;
}

TEST(OneSimulationTest, ASecondSimulationInOneProcessIsANamedError) {
  const ClusterSpec cluster = testing::NoLatencyCluster(1);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the child: one simulation, then a second
    close(fds[0]);
    char out[512] = {};
    int code = 0;
    const double first = Simulate(OneMessage(uint64_t{1} << 30), cluster, {}).seconds;
    try {
      const double second = Simulate(OneMessage(uint64_t{1} << 30), cluster, {}).seconds;
      std::snprintf(out, sizeof out, "first %.6f s, second %.6f s: no error", first, second);
      code = 2;
    } catch (const Error& e) {
      std::snprintf(out, sizeof out, "first %.6f s; %s", first, e.what());
      code = first > 0.02 && first < 0.03 ? 0 : 3;  // 1 GiB at 50 GB/s: 21.5 ms
    }
    const ssize_t n = write(fds[1], out, std::strlen(out));
    _exit(n > 0 ? code : 4);
  }
  close(fds[1]);
  std::string said;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) said.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << said;
  EXPECT_EQ(WEXITSTATUS(status), 0) << said;
  EXPECT_NE(said.find("SimGrid runs one simulation per process"), std::string::npos) << said;
}

}  // namespace
}  // namespace reshard::sim
