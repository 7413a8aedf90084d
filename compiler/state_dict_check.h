// `reshard check`: compare the buffers a layout says each rank binds (name,
// dtype, shape, from Expand()) with a dump of a framework's real parameters,
// rank by rank. The dump is what tools/dump_state_dict.py writes:
//   {"rank": R, "params": [{"name": N, "dtype": "torch.bfloat16", "shape": [..]}, ...]}
// or a list of such objects (several ranks in one file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compiler/expand.h"
#include "compiler/spec.h"
#include "frameworks/engine_tensors.h"

namespace reshard {

/// One parameter of a dump. `dtype` is reshard's when the framework's dtype
/// maps to one (see TorchDtype), else unset and `dtype_name` says what it was.
struct DumpParam {
  std::string name;
  std::optional<Dtype> dtype;
  std::string dtype_name;  // as written in the dump
  std::vector<int64_t> shape;
  /// Element strides when the parameter is not contiguous (empty: row-major).
  /// vLLM's per-channel FP8 linears are, after loading, `weight.t()`: shape
  /// [in, out], strides [1, in] over [out, in] row-major memory.
  std::vector<int64_t> stride;
};

struct RankDump {
  int64_t rank = 0;
  std::string framework;  // the dump's "framework" field ("vLLM 0.33.0 ..."), "" when absent
  std::string file, path;  // where it was read: path "" for a file of one rank, "/i" in a list
  std::string where() const { return path.empty() ? file : file + ": " + path; }
  std::vector<DumpParam> params;
};

/// reshard's dtype for a framework's dtype name: torch.bfloat16 -> bf16,
/// torch.float16 -> fp16, torch.float32 -> fp32, torch.float8_e4m3fn ->
/// fp8_e4m3, torch.float8_e8m0fnu -> e8m0 (with or without "torch.", and
/// reshard's own names); nullopt for anything else (int64, bool, ...).
std::optional<Dtype> TorchDtype(const std::string& name);

/// Parses one dump file's JSON; throws reshard::Error naming `file` and the
/// JSON path of what is wrong (missing field, bad shape, duplicate name).
std::vector<RankDump> ParseStateDictDump(const nlohmann::json& j, const std::string& file);

/// Loads and parses dump files; a rank found twice (in one file or across
/// files) is an error naming both places.
std::vector<RankDump> LoadStateDictDumps(const std::vector<std::string>& files);

enum class DiffKind { missing, extra, wrong_shape, wrong_dtype, undeclared_view };
/// "missing", "extra", "wrong shape", "wrong dtype", "undeclared view"
const char* DiffKindString(DiffKind k);

struct StateDictDiff {
  int64_t rank = 0;
  DiffKind kind = DiffKind::missing;
  std::string name;
  std::string layout;   // "bf16[48, 64]" (empty for extra)
  std::string dump;     // "fp32[48, 64]" (empty for missing)
  std::string message;  // the full line `reshard check` prints
};

/// A dumped tensor the layout does not bind that the framework holds beyond
/// the checkpoint (frameworks/engine_tensors.h): reported, not a difference.
struct EngineTensorLine {
  int64_t rank = 0;
  std::string name;
  std::string dump;  // "fp32[]"
  EngineTensor what;
  std::string message;  // the full line `reshard check` prints
};

struct StateDictReport {
  std::vector<int64_t> ranks;        // the ranks compared, ascending
  int64_t layout_buffers = 0;        // buffers the layout binds on those ranks
  int64_t dump_params = 0;           // parameters the dump lists on those ranks
  std::vector<StateDictDiff> diffs;  // by rank, then in the layout's buffer order, then extras in the dump's order
  /// Parameters that are the transposed view of the layout's row-major 2-D
  /// buffer where the layout declares it (`"held": "transposed"`): no
  /// difference (the binding binds the memory). Undeclared views are
  /// differences (DiffKind::undeclared_view). One line each, as printed.
  std::vector<std::string> views;
  /// The engine's own tensors (runtime buffers, tensors derived at load),
  /// by rank in the dump's order.
  std::vector<EngineTensorLine> engine;
  bool ok() const { return diffs.empty(); }
};

/// Compares the layout's buffers on each dumped rank (only `rank` when set)
/// with the dump. A dumped rank outside the layout, or a `rank` the dump does
/// not have, is an Error.
StateDictReport CheckStateDict(const LayoutSpec& layout, const Expansion& expansion, const std::vector<RankDump>& dumps,
                               std::optional<int64_t> rank = std::nullopt);

/// "bf16[48, 64]" (shape "[]" for a scalar).
std::string DescribeBuffer(const std::string& dtype, const std::vector<int64_t>& shape);

}  // namespace reshard
