// reshard check: placeholder registration, replaced by the real command.
#include "runtime/error.h"
#include "tools/commands.h"

namespace reshard::cli {

void AddCheckCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("check", "(not yet implemented)");
  cmd->callback([] { throw Error("reshard check is not implemented yet"); });
}

}  // namespace reshard::cli
