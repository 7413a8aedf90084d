// Each `reshard` subcommand lives in its own tools/cmd_<name>.cc and registers
// itself on the CLI11 app. Callbacks throw reshard::Error for bad input; the
// code they leave in `exit_code` becomes the process exit status.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "compiler/spec.h"

namespace reshard::cli {

/// CLI::IsMember with "did you mean": `--strategy drect` ->
/// "--strategy: drect not in {direct,gather}; did you mean 'direct'?".
inline CLI::Validator OneOf(std::vector<std::string> values) {
  std::string desc = "{";
  for (size_t i = 0; i < values.size(); ++i) desc += (i ? "," : "") + values[i];
  desc += "}";
  return CLI::Validator(
      [values, desc](std::string& v) -> std::string {
        for (const auto& x : values)
          if (x == v) return "";
        return v + " not in " + desc + DidYouMean(v, values);
      },
      desc);
}

/// The help of every `--cluster`: what it takes, and that a file wins over a name.
inline std::string ClusterOptionHelp(const std::string& what) {
  std::string names;
  for (const auto& [name, text] : BuiltinClusters()) names += (names.empty() ? "" : ", ") + name;
  return what + ": a reshard.cluster/1 file, or the name of a bundled cluster (" + names +
         "; samples/clusters/ holds the same files). A path that exists wins over a name";
}

/// "unknown option '--clustr' for 'reshard compile'; did you mean '--cluster'?"
/// for every long option of `argv` its subcommand does not have, or "unknown
/// command ..." for a first word that is no subcommand: one line each, for
/// the CLI11 failure message (tools/main.cc; CLI11 2.1 suggests nothing).
std::string UnknownWords(CLI::App& app, int argc, char** argv);

void AddCompileCommand(CLI::App& app, int& exit_code);
void AddValidateCommand(CLI::App& app, int& exit_code);
void AddShowCommand(CLI::App& app, int& exit_code);
void AddRunCommand(CLI::App& app, int& exit_code);
void AddSimulateCommand(CLI::App& app, int& exit_code);
void AddDiffCommand(CLI::App& app, int& exit_code);
void AddVizCommand(CLI::App& app, int& exit_code);
void AddCheckCommand(CLI::App& app, int& exit_code);
void AddInitCommand(CLI::App& app, int& exit_code);

}  // namespace reshard::cli
