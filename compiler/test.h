// Fixtures shared by the compiler tests.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compiler/compile.h"
#include "compiler/validate.h"
#include "runtime/error.h"
#include "runtime/plan.h"

namespace reshard::testing {

inline std::string SourceDir() { return RESHARD_SOURCE_DIR; }
inline std::string Sample(const std::string& rel) { return SourceDir() + "/samples/" + rel; }
inline nlohmann::json LoadSample(const std::string& rel) { return LoadJson(Sample(rel)); }

/// Compiles specs held in memory; returns the plan bytes.
inline std::vector<uint8_t> CompileJson(const nlohmann::json& model, const nlohmann::json& train,
                                        const nlohmann::json& infer, const nlohmann::json& cluster,
                                        const std::string& strategy = "direct", uint64_t staging_mb = 64,
                                        bool nvlink_exchange = true) {
  CompileInputs in = ParseInputs(model, train, infer, cluster);
  CompileOptions opt;
  opt.strategy = strategy;
  opt.staging_mb = staging_mb;
  opt.nvlink_exchange = nvlink_exchange;
  return EmitPlan(in, BuildPlan(in, opt));
}

inline ValidateReport ValidateBytes(std::vector<uint8_t> bytes) {
  Plan plan = Plan::from_bytes(std::move(bytes), "test.rsplan");
  return ValidatePlan(plan.root(), [&](uint32_t r) -> const fb::Program& { return plan.program(r); });
}

inline nlohmann::json TinyCluster(int gpus_per_domain = 8) {
  return {{"format", "reshard.cluster/1"}, {"name", "test"}, {"gpus_per_domain", gpus_per_domain},
          {"nic_gbps", 400}, {"nvlink_GBps", 450}};
}

/// The message of the reshard::Error that `f` throws ("" if none).
template <class F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace reshard::testing
