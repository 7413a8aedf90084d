// reshard init: placeholder registration, replaced by the real command.
#include "runtime/error.h"
#include "tools/commands.h"

namespace reshard::cli {

void AddInitCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("init", "(not yet implemented)");
  cmd->callback([] { throw Error("reshard init is not implemented yet"); });
}

}  // namespace reshard::cli
