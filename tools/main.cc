// reshard: compile, check and run weight-refit plans.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "runtime/error.h"
#include "tools/commands.h"

namespace reshard::cli {

std::string UnknownWords(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) commands.push_back(sub->get_name());
  CLI::App* sub = nullptr;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("-", 0) == 0) continue;  // the app's own flags (--version, --help)
    for (CLI::App* s : app.get_subcommands([](CLI::App*) { return true; }))
      if (s->get_name() == a) sub = s;
    if (!sub) return "unknown command '" + a + "'" + DidYouMean(a, commands) + "\n";
    break;
  }
  if (!sub) return "";
  std::vector<std::string> names;
  for (const CLI::Option* o : sub->get_options())
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
  std::string out;
  for (++i; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a.rfind("--", 0) != 0) continue;
    const std::string name = a.substr(0, a.find('='));
    if (std::find(names.begin(), names.end(), name) == names.end())
      out += "unknown option '" + name + "' for 'reshard " + sub->get_name() + "'" + DidYouMean(name, names) + "\n";
  }
  return out;
}

}  // namespace reshard::cli

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
  // CLI11's messages for an unknown option or command, with "did you mean" added.
  app.failure_message([&app, argc, argv](const CLI::App* failed, const CLI::Error& e) {
    std::string msg = CLI::FailureMessage::simple(failed, e);
    const std::string extra = reshard::cli::UnknownWords(app, argc, argv);
    const size_t eol = msg.find('\n');
    return eol == std::string::npos ? msg + extra : msg.insert(eol + 1, extra);
  });
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
