// reshard viz: placeholder until its issue lands.
#include "runtime/error.h"
#include "tools/commands.h"

namespace reshard::cli {

void AddVizCommand(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("viz", "not implemented yet");
  cmd->callback([] { throw Error("reshard viz is not implemented yet"); });
}

}  // namespace reshard::cli
