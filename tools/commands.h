// Each `reshard` subcommand lives in its own tools/cmd_<name>.cc and registers
// itself on the CLI11 app. Callbacks throw reshard::Error for bad input; the
// code they leave in `exit_code` becomes the process exit status.
#pragma once

#include <CLI/CLI.hpp>

namespace reshard::cli {

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
