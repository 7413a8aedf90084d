// Opens a plan and verifies one rank's program, as a rank does at job start;
// prints the median of N tries in milliseconds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "runtime/error.h"
#include "runtime/plan.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: plan_open_bench PLAN RANK [TRIES]\n");
    return 2;
  }
  int tries = argc > 3 ? std::atoi(argv[3]) : 5;
  uint32_t rank = static_cast<uint32_t>(std::atoi(argv[2]));
  std::vector<double> ms;
  try {
    for (int i = 0; i < tries; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      reshard::Plan plan = reshard::Plan::open(argv[1]);
      const reshard::fb::Program& p = plan.program(rank);
      volatile size_t n = p.steps() ? p.steps()->size() : 0;
      (void)n;
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  } catch (const reshard::Error& e) {
    std::fprintf(stderr, "plan_open_bench: %s\n", e.what());
    return 1;
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%.2f\n", ms[ms.size() / 2]);
  return 0;
}
