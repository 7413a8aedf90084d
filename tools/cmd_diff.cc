// reshard diff: placeholder until its issue lands.
#include "runtime/error.h"
#include "tools/commands.h"

namespace reshard::cli {

void AddDiffCommand(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("diff", "not implemented yet");
  cmd->callback([] { throw Error("reshard diff is not implemented yet"); });
}

}  // namespace reshard::cli
