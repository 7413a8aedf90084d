// The physical lower bound of a refit, from the plan's inputs (what every rank
// holds and needs, its fragments), never from its steps: no plan on this
// cluster can finish sooner.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/spec.h"
#include "runtime/plan.h"

namespace reshard::sim {

struct LowerBound {
  double seconds = 0;  // max(max(ingress, egress, nvlink) + one latency, local)
  /// (a) a destination NVLink domain must take in, over its own NICs, every
  /// byte its GPUs need that no GPU of the domain holds.
  double ingress_s = 0;
  uint32_t ingress_domain = 0;
  uint64_t ingress_bytes = 0;
  /// (b) every byte needed outside the domains holding it leaves the source
  /// side at least once: over all source NICs, and over one domain's NICs for
  /// what only that domain holds.
  double egress_s = 0;
  uint64_t egress_bytes = 0;
  /// (c) every GPU of a domain must take in what it needs and does not hold
  /// over its NIC and NVLink port together (per GPU and per domain); over
  /// NVLink alone where every GPU of the job is in one domain.
  double nvlink_s = 0;
  bool nvlink_only = false;   // (c) counts NVLink alone: the job is on one domain
  uint64_t needed_bytes = 0;  // sum over destination GPUs of what they need and do not hold
  /// (d) colocated: a GPU copies what it needs and already holds (its
  /// training buffers into its inference buffers) through its own HBM, each
  /// byte read once and written once; the busiest GPU.
  double local_s = 0;
  uint32_t local_rank = 0;
  uint64_t local_bytes = 0;   // that GPU's bytes
  double latency_s = 0;
  const char* binding() const;  // which of (a) (b) (c) (d) sets the bound
};

LowerBound ComputeLowerBound(const Plan& plan, const ClusterSpec& cluster);

}  // namespace reshard::sim
