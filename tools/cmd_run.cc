#include "tools/commands.h"
namespace reshard::cli {
void AddRunCommand(CLI::App& app, int& exit_code) {}
}
