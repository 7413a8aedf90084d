// reshard: compile, check and run weight-refit plans.
#include <cstdio>
#include <exception>
#include <new>

#include "runtime/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "reshard: compiles the weight refit from a training layout to an inference layout\n"
      "into a plan of per-rank steps, and checks, shows and runs such plans.\n\n"
      "  reshard compile --model M --from TRAIN --to INFER --cluster C -o PLAN\n"
      "  reshard validate PLAN\n"
      "  reshard show PLAN [--rank R] [--json]\n"
      "  reshard run PLAN --local\n"
      "  reshard simulate PLAN --cluster C [--trace T.json]\n"
      "  reshard diff A B\n"
      "  reshard viz PLAN -o OUT.html|.svg|.dot\n"
      "  reshard init --hf-config config.json --train megatron:... --infer vllm:... -o DIR\n"
      "  reshard check --layout L --model M --state-dict DUMP\n",
      "reshard"};
  app.require_subcommand(1);
  app.set_version_flag("--version", RESHARD_VERSION);
  int exit_code = 0;
  reshard::cli::AddCompileCommand(app, exit_code);
  reshard::cli::AddValidateCommand(app, exit_code);
  reshard::cli::AddShowCommand(app, exit_code);
  reshard::cli::AddRunCommand(app, exit_code);
  reshard::cli::AddSimulateCommand(app, exit_code);
  reshard::cli::AddDiffCommand(app, exit_code);
  reshard::cli::AddVizCommand(app, exit_code);
  reshard::cli::AddCheckCommand(app, exit_code);
  reshard::cli::AddInitCommand(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const reshard::Error& e) {
    std::fprintf(stderr, "reshard: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "reshard: error: out of memory: the specs need more memory than this machine (or ulimit -v) "
                         "gives; no output was written\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reshard: internal error: %s\n", e.what());
    return 3;
  }
  return exit_code;
}
