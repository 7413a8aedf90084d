// The command line around the specs (issue 31): every --cluster takes the
// bundled names, unknown options, commands and values get "did you mean", and
// compile / init warn where a rank's weights exceed its GPU's memory.
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace reshard::testing {
namespace {

std::vector<std::string> CompileTinyDense(const std::string& cluster, const std::string& out) {
  return {"compile", "--model", Sample("tiny-dense/model.json"), "--from", Sample("tiny-dense/train.json"), "--to",
          Sample("tiny-dense/infer.json"), "--cluster", cluster, "-o", out};
}

// `compile --cluster dgx-h100` said "File does not exist" though init takes the name.
TEST(CliClusters, EveryClusterOptionTakesTheBundledNames) {
  TempDir dir;
  const std::string plan = dir.File("p.rsplan");
  Result r = Reshard(dir, CompileTinyDense("dgx-h100", plan));
  ASSERT_EQ(r.code, 0) << r.err;
  r = Reshard(dir, {"show", plan, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["cluster"], "dgx-h100");
  r = Reshard(dir, {"simulate", plan, "--cluster", "gb200-nvl72"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(" on gb200-nvl72: "), std::string::npos) << r.out;
  // A file of that name wins over the bundled cluster.
  nlohmann::json mine = TinyCluster();
  mine["name"] = "mine";
  WriteText(dir.File("dgx-h100"), mine.dump());
  r = Shell(dir, "cd " + Quote(dir.path()) + " && " + Quote(RESHARD_BINARY) + " simulate p.rsplan --cluster dgx-h100");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(" on mine: "), std::string::npos) << r.out;
  // An unknown name: the bundled clusters with the GPU each has, and a
  // suggestion only of a cluster with the GPU the name says (issue 59).
  const std::string listed =
      "expected a reshard.cluster/1 file or a bundled cluster: 'dgx-h100' (H100 80 GB, 8 GPUs per NVLink domain) "
      "or 'gb200-nvl72' (GB200 186 GB, 72 GPUs per NVLink domain)";
  for (const char* cmd : {"compile", "simulate", "init"}) {
    SCOPED_TRACE(cmd);
    auto with = [&](const std::string& cluster) {
      if (std::string(cmd) == "compile") return Reshard(dir, CompileTinyDense(cluster, plan));
      if (std::string(cmd) == "simulate") return Reshard(dir, {"simulate", plan, "--cluster", cluster});
      return Reshard(dir, {"init", "--hf-config", Sample("tiny-dense/config.json"), "--train", "hf", "--infer", "hf",
                           "--cluster", cluster, "-o", dir.File("specs")});
    };
    r = with("dgx-h200");  // another GPU: no suggestion of an H100
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err, "reshard: error: --cluster: cannot open 'dgx-h200'; " + listed + "\n");
    r = with("dgx-h10");
    EXPECT_EQ(r.err, "reshard: error: --cluster: cannot open 'dgx-h10'; " + listed + "\n");
    r = with("gb200");
    EXPECT_EQ(r.err, "reshard: error: --cluster: cannot open 'gb200'; " + listed + "; did you mean 'gb200-nvl72'?\n");
    r = with("dgx_h100");
    EXPECT_EQ(r.err, "reshard: error: --cluster: cannot open 'dgx_h100'; " + listed + "; did you mean 'dgx-h100'?\n");
  }
  for (const char* cmd : {"compile", "simulate", "init"}) {
    SCOPED_TRACE(cmd);
    r = Reshard(dir, {cmd, "--help"});
    EXPECT_NE(r.out.find("the name of a bundled cluster (dgx-h100, gb200-nvl72"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("A path that exists wins over a name"), std::string::npos) << r.out;
  }
}

// CLI11 2.1 names an unknown option ("The following argument was not
// expected", or only "--model is required" when a required one is missing
// too) and an unknown command ("A subcommand is required") without a hint.
TEST(CliErrors, UnknownOptionsCommandsAndValuesSuggestTheClosest) {
  TempDir dir;
  Result r = Reshard(dir, {"compile", "--clustr", "x"});
  EXPECT_EQ(r.code, 106);
  EXPECT_EQ(r.err,
            "--model is required\n"
            "unknown option '--clustr' for 'reshard compile'; did you mean '--cluster'?\n"
            "Run with --help for more information.\n");
  std::vector<std::string> args = CompileTinyDense("dgx-h100", dir.File("p.rsplan"));
  args.push_back("--jsn");
  r = Reshard(dir, args);
  EXPECT_EQ(r.code, 109);
  EXPECT_EQ(r.err,
            "The following argument was not expected: --jsn\n"
            "unknown option '--jsn' for 'reshard compile'; did you mean '--json'?\n"
            "Run with --help for more information.\n");
  r = Reshard(dir, {"compil", "--model", "m.json"});
  EXPECT_EQ(r.err, "A subcommand is required\nunknown command 'compil'; did you mean 'compile'?\n"
                   "Run with --help for more information.\n");
  args = CompileTinyDense("dgx-h100", dir.File("p.rsplan"));
  args.insert(args.end(), {"--strategy", "drect"});
  r = Reshard(dir, args);
  EXPECT_EQ(r.err, "--strategy: drect not in {direct,gather}; did you mean 'direct'?\n"
                   "Run with --help for more information.\n");
  r = Reshard(dir, {"viz", "p.rsplan", "-o", "x.html", "--by", "domian"});
  EXPECT_EQ(r.err, "--by: domian not in {auto,rank,domain}; did you mean 'domain'?\n"
                   "Run with --help for more information.\n");
  r = Reshard(dir, {"show", "p.rsplan", "--rank=1", "--frobnicate"});  // nothing close: no guess
  EXPECT_NE(r.err.find("unknown option '--frobnicate' for 'reshard show'\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("unknown option '--rank'"), std::string::npos) << r.err;
}

// The SimGrid replay is a module beside the executable, loaded by
// `simulate` only: every other command starts without SimGrid and its
// ns-3 libraries. A copy of the CLI without the module compiles, and its
// simulate names what is missing; with a damaged module too, nothing is
// written and the exit is non-zero; with the module beside it, it predicts.
TEST(CliModules, SimulateLoadsTheSimGridReplayBesideTheExecutableOnly) {
  TempDir dir;
  const std::string bin = dir.File("reshard");
  std::filesystem::copy_file(RESHARD_BINARY, bin);
  std::filesystem::permissions(bin, std::filesystem::perms::owner_exec, std::filesystem::perm_options::add);
  auto run = [&](std::vector<std::string> args) {
    std::string cmd = Quote(bin);
    for (const std::string& a : args) {
      cmd += ' ';
      cmd += Quote(a);
    }
    return Shell(dir, cmd);
  };
  std::vector<std::string> compile = CompileTinyDense("dgx-h100", dir.File("p.rsplan"));
  Result r = run(compile);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<std::string> simulate = {"simulate", dir.File("p.rsplan"), "--cluster",
                                             Sample("clusters/dgx-h100.json"), "--json"};
  r = run(simulate);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "reshard: error: simulate: cannot load the SimGrid replay: " + dir.File("libreshard_simgrid.so") +
                       ": cannot open shared object file: No such file or directory (libreshard_simgrid.so is built "
                       "and installed beside the reshard executable; rebuild, or reinstall the package)\n");
  WriteText(dir.File("libreshard_simgrid.so"), "not a module");
  r = run(simulate);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("cannot load the SimGrid replay: " + dir.File("libreshard_simgrid.so") + ": file too short"),
            std::string::npos)
      << r.err;
  std::filesystem::copy_file(std::filesystem::path(RESHARD_BINARY).parent_path() / "libreshard_simgrid.so",
                             dir.File("libreshard_simgrid.so"), std::filesystem::copy_options::overwrite_existing);
  r = run(simulate);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_GT(nlohmann::json::parse(r.out)["predicted_seconds"].get<double>(), 0) << r.out;
}

// Llama-3.1-405B at vLLM TP8 needs 101 GB per 80 GB GPU and compiled
// silently: a warning on stderr and in --json, naming the rank, its bytes
// and the limit; the plan is written all the same.
TEST(CliMemory, CompileAndInitWarnWhereARanksWeightsExceedTheGpu) {
  TempDir dir;
  nlohmann::json small = TinyCluster();
  small["gpu_memory_GB"] = 0.00012;  // 120 kB: tiny-dense's training ranks 4-7 hold 144256 bytes
  WriteText(dir.File("small.json"), small.dump());
  const std::string plan = dir.File("p.rsplan");
  const std::string warning = "reshard: warning: " + Sample("tiny-dense/train.json") +
                              " (megatron-tp2-pp2-dp2-te): rank 4 holds 0.000144 GB of weights (144256 bytes), more "
                              "than its GPU's 0.00012 GB (" + dir.File("small.json") +
                              ": /gpu_memory_GB); 4 of its 8 ranks do\n";
  std::vector<std::string> args = CompileTinyDense(dir.File("small.json"), plan);
  args.push_back("-q");
  Result r = Reshard(dir, args);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.err, warning);
  EXPECT_TRUE(std::filesystem::exists(plan));
  args.back() = "--json";
  r = Reshard(dir, args);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["memory_warnings"].size(), 1u) << r.out;
  EXPECT_EQ(j["memory_warnings"][0]["side"], "train");
  EXPECT_EQ(j["memory_warnings"][0]["rank"], 4);
  EXPECT_EQ(j["memory_warnings"][0]["bytes"], 144256);
  EXPECT_EQ(j["memory_warnings"][0]["limit_bytes"], 120000);
  EXPECT_EQ(j["memory_warnings"][0]["ranks_over"], 4);
  args.push_back("--simulate-fills");  // the kept fill's summary carries them too
  r = Reshard(dir, args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["memory_warnings"], j["memory_warnings"]);
  // Without gpu_memory_GB (optional): no check, an empty list.
  WriteText(dir.File("plain.json"), TinyCluster().dump());
  args = CompileTinyDense(dir.File("plain.json"), plan);
  args.push_back("--json");
  r = Reshard(dir, args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(nlohmann::json::parse(r.out)["memory_warnings"], nlohmann::json::array());
  // init: the same check on the specs it writes.
  r = Reshard(dir, {"init", "-q", "--hf-config", Sample("tiny-dense"), "--train", "megatron:tp=2,pp=2,dp=2,pp-layers=1,3",
                    "--infer", "vllm:tp=4", "--cluster", dir.File("small.json"), "-o", dir.File("specs")});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.err, "reshard: warning: train.json (megatron-tp2-pp2-dp2-te): rank 4 holds 0.000144 GB of weights "
                   "(144256 bytes), more than its GPU's 0.00012 GB (" + dir.File("small.json") +
                   ": /gpu_memory_GB); 4 of its 8 ranks do\n");
  EXPECT_TRUE(std::filesystem::exists(dir.File("specs/cluster.json")));
}

}  // namespace
}  // namespace reshard::testing
