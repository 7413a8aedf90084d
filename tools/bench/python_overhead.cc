// The C++ side of the Python overhead benchmark (tools/bench/python_overhead.sh):
//   python_overhead plans DIR [--rounds R --k K --params N]
//     writes DIR/steps.rsplan (2 ranks, per round k 4-byte packs, one
//     exchange, k unpacks: rounds*(2k+2) steps per rank, the plan of
//     runtime_bench's per-step case) and DIR/params.rsplan (1 rank binding N
//     small buffers, no steps: the bind_module case);
//   python_overhead run PLAN RANK STORE_DIR REPS
//     runs rank RANK of PLAN over Gloo from C++: three warm-up runs, then REPS
//     timed runs; prints "runs <seconds of each run>".
//   python_overhead serve PLAN RANK STORE_DIR
//     the same rank, set up and warmed up (prints "ready"), then one timed run
//     per "run" line on stdin, each answered "<wall seconds> <the runtime's own
//     seconds>", until EOF: python_overhead.py's driver interleaves these runs
//     with the Python ranks' (tools/bench/python_overhead.sh).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/gloo_transport.h"
#include "runtime/plan.h"
#include "runtime/session.h"
#include "runtime/test.h"

namespace {

using reshard::kNone;
using reshard::fb::Dtype;
using reshard::fb::StepKind;
using reshard::testing::MakeRegion;
using reshard::testing::MakeStep;
using reshard::testing::PlanSpec;
using reshard::testing::ProgramSpec;

PlanSpec StepPlan(uint32_t rounds, uint32_t k) {
  PlanSpec spec;
  const uint64_t elems = uint64_t{rounds} * k * 2;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ProgramSpec p;
    p.rank = rank;
    p.buffers = {{"src", Dtype::bf16, {elems}}, {"dst", Dtype::bf16, {elems}}};
    p.staging_bytes = uint64_t{k} * 8;
    const uint32_t in = k * 4;
    for (uint32_t r = 0; r < rounds; ++r) {
      p.Round();
      for (uint32_t j = 0; j < k; ++j) {
        uint32_t src = p.Region(MakeRegion(0, (uint64_t{r} * k + j) * 2, {2}, {1}));
        p.Step(MakeStep(StepKind::pack, kNone, src, kNone, j * 4, 4, Dtype::bf16));
      }
      p.Step(MakeStep(StepKind::send, 1 - rank, kNone, kNone, 0, k * 4, Dtype::bf16));
      p.Step(MakeStep(StepKind::recv, 1 - rank, kNone, kNone, in, k * 4, Dtype::bf16));
      for (uint32_t j = 0; j < k; ++j) {
        uint32_t dst = p.Region(MakeRegion(1, (uint64_t{r} * k + j) * 2, {2}, {1}));
        p.Step(MakeStep(StepKind::unpack, kNone, kNone, dst, in + j * 4, 4, Dtype::bf16));
      }
    }
    spec.programs.push_back(std::move(p));
  }
  return spec;
}

// One rank, `n` buffers named like a transformer's parameters, no steps.
PlanSpec ParamsPlan(uint32_t n) {
  PlanSpec spec;
  ProgramSpec p;
  p.rank = 0;
  for (uint32_t i = 0; i < n; ++i) {
    p.buffers.push_back({"decoder.layers." + std::to_string(i / 10) + ".p" + std::to_string(i % 10) + ".weight",
                         Dtype::bf16, {16, 8}});
  }
  spec.programs.push_back(std::move(p));
  return spec;
}

int Usage() {
  std::fprintf(stderr,
               "usage: python_overhead plans DIR [--rounds R] [--k K] [--params N]\n"
               "       python_overhead run PLAN RANK STORE_DIR REPS\n"
               "       python_overhead serve PLAN RANK STORE_DIR\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 3 && std::strcmp(argv[1], "plans") == 0) {
      uint32_t rounds = 800, k = 64, params = 2000;
      for (int i = 3; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
        else if (std::strcmp(argv[i], "--k") == 0) k = std::atoi(argv[i + 1]);
        else if (std::strcmp(argv[i], "--params") == 0) params = std::atoi(argv[i + 1]);
        else return Usage();
      }
      const std::string dir = argv[2];
      reshard::testing::WriteFile(dir + "/steps.rsplan", reshard::testing::BuildPlan(StepPlan(rounds, k)));
      reshard::testing::WriteFile(dir + "/params.rsplan", reshard::testing::BuildPlan(ParamsPlan(params)));
      std::printf("steps per rank %u, params %u\n", rounds * (2 * k + 2), params);
      return 0;
    }
    const bool serve = argc == 5 && std::strcmp(argv[1], "serve") == 0;
    if (serve || (argc == 6 && std::strcmp(argv[1], "run") == 0)) {
      reshard::Plan plan = reshard::Plan::open(argv[2]);
      const uint32_t rank = std::atoi(argv[3]);
      const int reps = serve ? 0 : std::atoi(argv[5]);
      reshard::GlooOptions o;
      o.store_dir = argv[4];
      o.prefix = "cpp";
      reshard::GlooTransport transport(rank, plan.num_ranks(), o);
      reshard::Session s(plan, rank, transport);
      std::vector<std::vector<uint16_t>> mem;
      for (const reshard::fb::Buffer* b : *plan.program(rank).buffers()) {
        mem.emplace_back(reshard::BufferElements(*b), 0x3f80);
        s.bind(b->name()->str(), mem.back().data(), b->dtype(), std::vector<uint64_t>(b->shape()->begin(), b->shape()->end()));
      }
      for (int i = 0; i < 3; ++i) s.run();  // warm-up: the peer may still be starting
      if (serve) {
        std::printf("ready\n");
        std::fflush(stdout);
        char line[64];
        while (std::fgets(line, sizeof line, stdin) != nullptr) {
          auto t0 = std::chrono::steady_clock::now();
          reshard::RunStats stats = s.run();
          const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::printf("%.6f %.6f\n", wall, stats.seconds);
          std::fflush(stdout);
        }
        return 0;
      }
      std::printf("runs");
      for (int i = 0; i < reps; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        s.run();
        std::printf(" %.6f", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("\n");
      return 0;
    }
    return Usage();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "python_overhead: %s\n", e.what());
    return 1;
  }
}
