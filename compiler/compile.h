// The compiler's entry point: specs in, plan bytes out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/program.h"
#include "compiler/spec.h"
#include "plan_generated.h"

namespace reshard {

struct CompileInputs {
  ModelSpec model;
  LayoutSpec src, dst;
  ClusterSpec cluster;
  std::string digest;  // of the canonicalized inputs
};

struct CompileOptions {
  std::string strategy = "direct";
  uint64_t staging_mb = 512;
  bool nvlink_exchange = true;
  bool quantize_on_sender = true;
  bool search_fills = false;  // RouteOptions::search_fills
  int fill_candidate = -1;     // RouteOptions::fill_candidate
  std::optional<RoundFill> fill_of = std::nullopt;  // RouteOptions::fill_of
  uint64_t flow_budget = 0;    // RouteOptions::flow_budget
  uint32_t stripe_mib = kStripeMiB;  // RouteOptions::stripe_mib (a fill_candidate's; the others choose)
  size_t emit_threads = 0;     // RouteOptions::emit_threads
};

/// Pass 1: reads and validates the four spec files; `cluster` may also name a
/// bundled cluster (ClusterText: a path that exists wins).
CompileInputs LoadInputs(const std::string& model, const std::string& from, const std::string& to,
                         const std::string& cluster);
/// The same from JSON already in memory (tests, random layouts).
CompileInputs ParseInputs(const nlohmann::json& model, const nlohmann::json& from, const nlohmann::json& to,
                          const nlohmann::json& cluster, const std::string& model_file = "model.json",
                          const std::string& from_file = "train.json", const std::string& to_file = "infer.json",
                          const std::string& cluster_file = "cluster.json");

/// The round fill an earlier plan records (`compile --fill-of`: a
/// recompile filled that way only); `path` names the plan in errors. Throws
/// reshard::Error where it records none (gather plans, older plans).
RoundFill RoundFillOf(const fb::Plan& plan, const std::string& path);

/// Passes 2-4. Throws reshard::Error.
PlanIR BuildPlan(const CompileInputs& in, const CompileOptions& opt);

/// Pass 5: the FlatBuffers plan. Same inputs give the same bytes.
std::vector<uint8_t> EmitPlan(const CompileInputs& in, const PlanIR& ir);

/// What `reshard compile --json` prints about a plan written to `out` (and
/// `reshard.compile` returns), but for its wall time ("seconds").
nlohmann::ordered_json CompileSummary(const std::string& out, const std::string& strategy, const PlanIR& ir,
                                      size_t plan_bytes);

/// The line `reshard compile` prints first (and `reshard.compile` returns as
/// "summary"), from a CompileSummary with its "seconds".
std::string CompileLine(const CompileInputs& in, const nlohmann::ordered_json& summary);

}  // namespace reshard
