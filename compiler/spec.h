// The validated inputs of the compiler: model, layouts and cluster, parsed from
// their JSON specs (docs/specs.md: every field). Parsing is the only pass that reads
// files; every later pass works on these structs.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace reshard {

enum class Dtype : uint8_t { bf16 = 0, fp16 = 1, fp32 = 2, fp8_e4m3 = 3, e8m0 = 4 };
size_t DtypeBytes(Dtype d);
const char* DtypeString(Dtype d);

constexpr int kMaxDims = 6;  // logical dims of a tensor: stack dims then shape
/// Limits of spec values (README, bad-input catalogue): any integer, and dims,
/// shapes and sizes (fragment coordinates are 32-bit); ranks of a layout; a
/// tensor family's and a model's elements; bandwidths and latencies.
constexpr int64_t kMaxSpecInt = 0xFFFFFFFFll;
constexpr int64_t kMaxRanks = int64_t{1} << 20;
constexpr int64_t kMaxTensorElements = int64_t{1} << 48;
constexpr int64_t kMaxModelElements = int64_t{1} << 52;
constexpr double kMaxSpecNumber = 1e12;

/// A family of logical tensors: `name` with `{dim}` placeholders for its stack dims.
struct TensorSpec {
  std::string name;
  std::vector<int> stack;          // indices into Model::dims, in order of appearance
  std::vector<int64_t> shape;
  Dtype dtype = Dtype::bf16;
  std::vector<int64_t> lo, hi;     // logical box: stack ranges, then [0, shape)
  /// Attention heads (`"heads": {"dim": D, "size": S}`): shape dim D is made
  /// of heads of S elements, which no layout may cut (-1: none declared).
  int head_dim = -1;
  int64_t head_size = 0;
  std::string path;                // JSON path, for messages
  int ndim() const { return static_cast<int>(lo.size()); }
  int64_t elements() const;
};

struct ModelSpec {
  std::string file, name;
  Dtype dtype = Dtype::bf16;
  std::vector<std::pair<std::string, int64_t>> dims;
  std::vector<TensorSpec> tensors;
  int dim_index(const std::string& name) const;  // -1 if unknown
  int64_t total_bytes() const;
};

enum class AxisKind { replicate, shard, at };

/// How one mesh axis places a tensor.
struct AxisSpec {
  AxisKind kind = AxisKind::replicate;
  std::string dim_name;          // as written: a stack-dim name or a shape index
  int stack_dim = -1;            // model dim index when sharding a stack dim
  int shape_dim = -1;            // index into shape otherwise
  std::vector<int64_t> sizes;    // uneven shard
  int64_t blocks = 0, parts = 0, cyclic = 0;
  /// `"split": "chunk"`: torch.chunk's cut (DTensor Shard, FSDP2): chunks of
  /// ceil(L / n), the last ones short or empty; a rank whose chunk is empty
  /// still holds the tensor, with a zero extent (a zero-size buffer).
  bool chunk = false;
  std::vector<std::vector<int64_t>> assign;
  std::vector<int64_t> at;       // `"at": I` or `"at": [I, J, ...]`: the positions that hold it
  std::string path;
};

struct Placement {
  std::string match;
  int mesh = 0;
  std::vector<AxisSpec> axes;    // one per axis of the mesh
  /// The order in which the axes cut the tensor (indices into axes): each
  /// cuts what the ones before it left. Mesh order unless `"order"` says
  /// otherwise (torch's _StridedShard: TP cuts first, then FSDP chunks the
  /// TP-local piece).
  std::vector<int> order;
  bool split_heads = false;      // cutting a declared head is intended
  std::string path;
};

struct Mesh {
  std::string name;
  std::vector<std::pair<std::string, int64_t>> axes;
};

enum class Fuse { none, concat, interleave };

/// How a buffer stores its parts quantized (layout `quant`): FP8 E4M3 values
/// with one scale per block of the last two logical dims, the scales in a
/// buffer of their own. `block` counts elements of (rows, cols); 0 spans the
/// whole dim (per-channel: {1, 0}, per-tensor: {0, 0}).
struct QuantSpec {
  std::string format;            // "fp8_e4m3" or "mxfp8"
  std::string scale;             // "block", "channel", "tensor" (mxfp8: "block")
  std::array<int64_t, 2> block{0, 0};
  Dtype scale_dtype = Dtype::fp32;  // fp32 inverse scales, or e8m0 (mxfp8)
  std::string scale_name;        // name template of the scale buffer
  std::string path;
};

struct BufferRule {
  std::string name;              // template with {dim} / {dim.local} / {dim.chunk} / {dim.in_chunk}
  std::vector<std::string> parts;
  Fuse fuse = Fuse::none;
  int fuse_dim = 0;
  int64_t groups = 0;
  /// `"interleave": {..., "blocks": [{"parts": N, "groups": g}, ...]}`: within
  /// each of the `groups` outer groups, consecutive runs of parts (blocks)
  /// follow one another, each block interleaving its parts in g groups
  /// (vLLM's gated qkv_proj: [heads' query and gate; k; v]; Megatron's Llama 4
  /// linear_qkv per query group: [q's RoPE pairs; k's; v]). Empty: one block
  /// of all parts, g = 1 (plain interleave). Pairs (parts, groups).
  std::vector<std::pair<int64_t, int64_t>> blocks;
  std::optional<std::vector<int64_t>> shape;  // padded physical trailing dims
  std::optional<Dtype> dtype;
  std::optional<QuantSpec> quant;
  /// `"shard": AXIS`: the fused buffer as a whole is cut evenly along its
  /// fused dim over this axis of the parts' mesh (Megatron's linear_qkv when
  /// TP exceeds the query groups); the parts replicate on that axis.
  std::string shard_axis;
  bool shard_chunk = false;      // `"shard": {"axis": A, "split": "chunk"}`: torch.chunk's cut
  /// `"range": {DIM: [lo, hi]}`: the rule names only these instances of its
  /// parts' stack dims; other rules may name the rest (TE's dense layers fuse
  /// the pre-MLP norm into linear_fc1, MoE layers keep pre_mlp_layernorm).
  std::vector<std::tuple<int, int64_t, int64_t>> range;  // model dim, lo, hi
  /// `"at": {AXIS: I}`: the rule names only what ranks at these positions of
  /// the parts' mesh hold (Megatron's tied output_layer copy on the last stage).
  std::vector<std::pair<std::string, int64_t>> at;
  /// `"held": "transposed"`: the framework holds each (2-D) buffer of the
  /// rule as a transposed view of its row-major memory (vLLM's per-channel
  /// FP8 linears after loading: `weight.t()`); bindings of that view bind
  /// the memory in place (Plan Buffer.held).
  bool held_transposed = false;
  /// `"transform": {"offset": c}`: the framework holds the model's values
  /// plus c in this rule's buffers (Megatron's zero-centered norm gamma under
  /// layernorm_zero_centered_gamma holds w - 1: c = -1). The plan subtracts c
  /// where it reads them and adds it where it writes them (Buffer.offset).
  float offset = 0;
  std::string transform_path;    // JSON path of "transform", "" when absent
  std::string path;
};

struct LayoutSpec {
  std::string file, name, model;
  int64_t ranks = 0;
  std::vector<Mesh> meshes;
  std::vector<Placement> placements;
  std::vector<BufferRule> buffers;
  /// Tensors no buffer rule names get a buffer named as the tensor. Without
  /// it, a layout with buffer rules must name every tensor it holds.
  bool default_buffers = false;
  /// `"dtype"`: what every buffer holds unless its rule says (FSDP2's fp32
  /// masters of a bf16 model); unset: the model tensor's dtype. Quantized
  /// buffers and their scales keep theirs.
  std::optional<Dtype> dtype;
  /// Per model tensor: the offset its buffers hold its values with (every
  /// rule that names it agrees; 0 where none says), and the JSON path of the
  /// "transform" that says so ("" for none). Plan Tensor.train_offset /
  /// infer_offset.
  std::vector<float> offsets;
  std::vector<std::string> offset_paths;
};

struct ClusterSpec {
  std::string file, name;
  int64_t gpus_per_domain = 8;
  double nic_gbps = 400, nvlink_GBps = 450, hbm_GBps = 3350;
  double nic_latency_us = 5, nvlink_latency_us = 1;
  bool colocated = false;
  /// Disjoint placement: how many GPUs of each NVLink domain the training and
  /// the inference side use (0: all). With either set, inference starts on a
  /// fresh domain; without, it follows the training ranks.
  int64_t train_per_domain = 0, infer_per_domain = 0;
  /// `"gpu_memory_GB"`: each GPU's memory in GB (1e9 bytes); 0 when the file
  /// does not say (optional). compile and init warn where a GPU's weights
  /// exceed it (compiler/memory_check.h).
  double gpu_memory_GB = 0;
};

/// Parsers: `text` is the file's contents, `file` its name for messages.
/// Throw reshard::Error ("train.json: /placements/3/tp: ...").
nlohmann::json ParseJson(const std::string& text, const std::string& file);
nlohmann::json LoadJson(const std::string& path);
ModelSpec ParseModel(const nlohmann::json& j, const std::string& file);
LayoutSpec ParseLayout(const nlohmann::json& j, const std::string& file, const ModelSpec& model);
ClusterSpec ParseCluster(const nlohmann::json& j, const std::string& file);

/// The clusters bundled with reshard (compiler/clusters.cc; samples/clusters/
/// holds the same text): name -> reshard.cluster/1 JSON text.
const std::vector<std::pair<std::string, std::string>>& BuiltinClusters();

/// What every `--cluster` takes: a reshard.cluster/1 file, or the name of a
/// bundled cluster (dgx-h100, gb200-nvl72). A path that exists wins over a
/// name. Returns the text and sets `*file` to the name messages use (the path,
/// or the bundled name). Errors name `option` and suggest a close bundled name.
std::string ClusterText(const std::string& path_or_name, const std::string& option, std::string* file);

/// "; did you mean 'x'?" for the candidate closest to `word` when it is close
/// enough (a few edits), else "".
std::string DidYouMean(const std::string& word, const std::vector<std::string>& candidates, size_t min_edits = 3);

/// "; did you mean ...?" among names of one kind whose numbers matter
/// (formats, dtypes, clusters), never a name of another kind: every
/// candidate that `word` begins or that begins `word`, not cut inside a
/// number, or that has `word` as one of its dash-separated parts ("fp8" ->
/// "did you mean 'fp8-block' or 'fp8-channel'?", "gb200" and "nvl72" ->
/// 'gb200-nvl72'; "h20" does not begin "h200"); else the closest candidate
/// whose words holding a number are those of `word` (a typo: "fp8_block" ->
/// 'fp8-block', but "mxfp4" is not 'mxfp8', "dgx-a100" and "dgx-h200" not
/// 'dgx-h100'). Case is ignored.
std::string DidYouMeanSameKind(const std::string& word, const std::vector<std::string>& candidates,
                               size_t min_edits = 2);

/// A name template cut at its placeholders: text[0] {dims[0]} text[1] ...
/// text[n]. Each placeholder names a stack dim's index as `kind` says:
///   {dim}          the global index;
///   {dim.local}    the index within the rank's share of the dim;
///   {dim.chunk}    which contiguous run of the rank's share holds it, and
///   {dim.in_chunk} the index within that run: under a cyclic placement
///                  (Megatron's virtual pipeline stages) the model chunk and
///                  the layer's number inside it.
/// The suffix is stripped from dims[i].
enum class IndexKind { global, local, chunk, in_chunk };
struct NameTemplate {
  std::vector<std::string> text, dims;
  std::vector<IndexKind> kind;
};
NameTemplate ParseNameTemplate(const std::string& name);

/// Glob match on tensor names: `*` any run of characters, `?` one, `[abc]` a class.
bool GlobMatch(const std::string& pattern, const std::string& text);

}  // namespace reshard
