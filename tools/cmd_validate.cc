// reshard validate: prove a plan moves every destination element exactly once
// from a source element with the same logical coordinate.
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "compiler/validate.h"
#include "runtime/error.h"
#include "runtime/plan.h"
#include "tools/commands.h"

namespace reshard::cli {

void AddValidateCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "validate",
      "Check a plan: every destination element written exactly once from the source element with the same\n"
      "logical coordinate, every send matched by a receive in the same order, staging within budget.\n"
      "Exit status: 0 valid, 1 invalid (problems are listed), 2 unreadable.");
  struct Opts {
    std::string plan;
    size_t max_errors = 20;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("plan", o->plan, "plan file (.rsplan)")->required();
  cmd->add_option("--max-errors", o->max_errors, "list at most this many problems");
  cmd->add_flag("--json", o->json, "print the result as JSON");
  cmd->callback([o, &exit_code] {
    auto t0 = std::chrono::steady_clock::now();
    Plan plan = Plan::open(o->plan);
    ValidateReport rep =
        ValidatePlan(plan.root(), [&](uint32_t r) -> const fb::Program& { return plan.program(r); }, o->max_errors);
    if (std::string why = plan.check_content_digest(); !why.empty()) {
      rep.errors.insert(rep.errors.begin(), why);
      ++rep.total_errors;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o->json) {
      nlohmann::ordered_json j = {{"plan", o->plan},
                                  {"valid", rep.ok()},
                                  {"content_digest", plan.content_digest().hex()},
                                  {"errors", rep.total_errors},
                                  {"steps", rep.steps},
                                  {"messages", rep.messages},
                                  {"destination_elements", rep.dest_elements},
                                  {"seconds", secs},
                                  {"problems", rep.errors}};
      std::printf("%s\n", j.dump().c_str());
    } else if (rep.ok()) {
      std::printf("%s: valid: %llu steps, %llu messages, %llu destination elements each written once, content digest "
                  "%s (%.2f s)\n",
                  o->plan.c_str(), static_cast<unsigned long long>(rep.steps),
                  static_cast<unsigned long long>(rep.messages), static_cast<unsigned long long>(rep.dest_elements),
                  plan.content_digest().hex().c_str(), secs);
    } else {
      for (const auto& e : rep.errors) std::fprintf(stderr, "%s: %s\n", o->plan.c_str(), e.c_str());
      if (rep.total_errors > rep.errors.size())
        std::fprintf(stderr, "%s: ... and %zu more problems\n", o->plan.c_str(), rep.total_errors - rep.errors.size());
      std::fprintf(stderr, "%s: INVALID: %zu problems\n", o->plan.c_str(), rep.total_errors);
    }
    exit_code = rep.ok() ? 0 : 1;
  });
}

}  // namespace reshard::cli
