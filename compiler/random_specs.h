// Random but valid model and layout specs, for property tests: random meshes,
// every placement kind (uneven sizes, blocks, parts, cyclic, assign, at),
// several meshes per side, fused (concat / interleave) and padded buffers,
// stack dims kept as physical dims.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace reshard {

struct RandomSpecs {
  nlohmann::json model, train, infer, cluster;
};

/// Deterministic in `seed`.
RandomSpecs MakeRandomSpecs(uint64_t seed);

/// MakeRandomSpecs(seed) with FP8 inference buffers: some 2-d tensors (alone
/// or fused by concat) quantized with block scales of random shape (cutting
/// shards or not), per-channel or per-tensor scales, or MXFP8; in some cases
/// (never colocated) FP8 training buffers as well.
RandomSpecs MakeRandomQuantSpecs(uint64_t seed);

/// MakeRandomSpecs(seed) with buffers that hold offset values (layout
/// "transform"): on either side, some buffer rules and some tensors of
/// default buffers (then under a rule of their own) with an offset of
/// -1, 1, 0.5 or -2, the same for every buffer of a tensor.
RandomSpecs MakeRandomTransformSpecs(uint64_t seed);

}  // namespace reshard
