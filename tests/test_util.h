// Fixtures of the CLI tests: run the reshard binary, compile sample plans,
// read `show --json`, and run small python3 checkers.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "compiler/test.h"
#include "runtime/test.h"

namespace reshard::testing {

struct Result {
  int code = -1;
  std::string out, err;
};

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

inline std::string Quote(const std::string& s) {
  std::string q(1, '\'');
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  q += '\'';
  return q;
}

/// Runs a shell command line, capturing stdout and stderr in files of `dir`.
inline Result Shell(const TempDir& dir, const std::string& cmd) {
  std::string out = dir.File(".stdout"), err = dir.File(".stderr");
  int status = std::system((cmd + " >" + Quote(out) + " 2>" + Quote(err)).c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadText(out);
  r.err = ReadText(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

/// Runs `reshard ARGS` (each argument quoted).
inline Result Reshard(const TempDir& dir, const std::vector<std::string>& args) {
  std::string cmd = Quote(RESHARD_BINARY);
  for (const std::string& a : args) {  // not " " + Quote(a): gcc 12 -O2 reports a false -Wrestrict there
    cmd += ' ';
    cmd += Quote(a);
  }
  return Shell(dir, cmd);
}

/// Compiles a sample (paths relative to samples/) into dir/name; fails the test on error.
inline std::string CompileSample(const TempDir& dir, const std::string& name, const std::string& model,
                                 const std::string& from, const std::string& to, const std::string& cluster,
                                 const std::vector<std::string>& extra = {}) {
  std::string out = dir.File(name);
  std::vector<std::string> args = {"compile", "--model", Sample(model), "--from", Sample(from), "--to", Sample(to),
                                   "--cluster", Sample(cluster), "-o", out, "-q"};
  args.insert(args.end(), extra.begin(), extra.end());
  Result r = Reshard(dir, args);
  EXPECT_EQ(r.code, 0) << r.err;
  return out;
}

/// `reshard show PLAN --json` (with --rank when rank >= 0).
inline nlohmann::json ShowJson(const TempDir& dir, const std::string& plan, int rank = -1) {
  std::vector<std::string> args = {"show", plan, "--json"};
  if (rank >= 0) args.insert(args.end(), {"--rank", std::to_string(rank)});
  Result r = Reshard(dir, args);
  EXPECT_EQ(r.code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

inline bool HaveProgram(const std::string& name) {
  return std::system(("command -v " + name + " >/dev/null 2>&1").c_str()) == 0;
}

/// Writes `script` to dir and runs it with python3 and `args`; its stdout must be JSON.
inline nlohmann::json Python(const TempDir& dir, const std::string& script, const std::vector<std::string>& args) {
  std::string path = dir.File("check.py");
  std::ofstream(path) << script;
  std::string cmd = "python3 " + Quote(path);
  for (const std::string& a : args) {  // see Reshard: no " " + Quote(a)
    cmd += ' ';
    cmd += Quote(a);
  }
  Result r = Shell(dir, cmd);
  EXPECT_EQ(r.code, 0) << r.err;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

/// The tiny-dense plan (train PP2 DP2 TP2 -> infer `infer`) on `cluster`.
inline std::string TinyDense(const TempDir& dir, const std::string& name, const std::string& infer = "infer.json",
                             const std::string& cluster = "clusters/dgx-h100.json") {
  return CompileSample(dir, name, "tiny-dense/model.json", "tiny-dense/train.json", "tiny-dense/" + infer, cluster);
}

}  // namespace reshard::testing
