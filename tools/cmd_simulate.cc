// reshard simulate: placeholder until its issue lands.
#include "runtime/error.h"
#include "tools/commands.h"

namespace reshard::cli {

void AddSimulateCommand(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("simulate", "not implemented yet");
  cmd->callback([] { throw Error("reshard simulate is not implemented yet"); });
}

}  // namespace reshard::cli
