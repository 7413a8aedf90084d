// The frameworks' side of `reshard init`: parallel settings as users write them
// ("megatron:tp=4,pp=8,ep=16", "vllm:tp=8,dp=16,ep", "hf:tp=2") and the layout
// (reshard.layout/1) each framework's ranks hold for an architecture
// (frameworks/architectures.h).
//
// One file per framework holds what that framework does with a tensor role
// (names, dtypes, fusions, sharding) and the sources it follows:
//   frameworks/megatron.cc   Megatron-Core 0.19
//   frameworks/vllm.cc       vLLM 0.33
//   frameworks/sglang.cc     SGLang 0.5.23
//   frameworks/hf.cc         Hugging Face names, plain TP shards
//   frameworks/fsdp2.cc      PyTorch FSDP2 / DTensor TP on transformers 5 models
// Each defines a FrameworkDef (its options and its layout); this file holds
// what they share: the settings parser, the layout Builder and the role
// helpers. Adding a framework is a file defining its FrameworkDef, its entry in
// Frameworks() (layout_builder.cc) and its fields in Settings.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "frameworks/architectures.h"

namespace reshard::init {

struct FrameworkDef;

/// Parsed framework settings. Unset sizes are 0 until resolved.
struct Settings {
  const FrameworkDef* def = nullptr;  // the framework named before the colon
  std::string option;            // "--train" or "--infer", for messages
  std::string text;              // as written
  int64_t tp = 1, pp = 1, dp = 0, cp = 1, ep = 1, etp = 0, vpp = 1, engines = 1;
  std::vector<int64_t> pp_layers;
  bool grouped_gemm = false, te = true, vllm_ep = false, fp32_norms = false;
  int64_t vocab_divisible = 128;
  std::string quant;             // vllm: "", "none", "fp8-block", "fp8-channel", "mxfp8"
  int64_t dp_shard = 0, dp_replicate = 1;  // fsdp2: the DeviceMesh's data-parallel dims (dp_shard required)
  std::string master = "fp32";   // fsdp2: the sharded parameters' dtype, "fp32" or "bf16"
  int64_t experts_dim = 0;       // fsdp2: the dim fully_shard cuts fused experts on (0 or 1)
  int64_t attn_dp = 1;           // sglang: attention DP groups inside the TP group
  int64_t dense_tp = 0;          // sglang: moe_dense_tp_size (0: unset, the whole TP group)
  bool dp_lm_head = false;       // sglang: lm_head over the attention-TP group
  std::string shared_experts;    // sglang: "", "fused", "tp", "replicated"
};

using Notes = std::vector<std::string>;

/// One framework as init knows it: how its settings are written and the
/// layout its ranks hold.
struct FrameworkDef {
  std::string name;              // before the colon: "megatron"
  std::string usage;             // in the unknown-framework error: "megatron:..."
  std::vector<std::string> keys;       // its options, in the order errors list them
  std::vector<std::string> flags;      // those of `keys` that take no value
  std::vector<std::string> list_keys;  // those whose value goes on over bare numbers (pp-layers=3,4,4)
  bool bare = false;             // the name alone is a setting ("hf")
  /// Stores one option (a key of `keys`; value "" for a flag; a list key is
  /// called once per number). Errors through Fail(s, ...).
  void (*set)(Settings& s, const std::string& key, const std::string& value) = nullptr;
  /// The layout for `arch`; may resolve defaults in `s`. `notes` gets one line
  /// per derived fact worth saying (padding, replication).
  nlohmann::ordered_json (*make)(const Arch& arch, const std::string& model_name, Settings& s, Notes& notes) = nullptr;
};

const FrameworkDef& MegatronFramework();  // frameworks/megatron.cc
const FrameworkDef& VllmFramework();      // frameworks/vllm.cc
const FrameworkDef& HfFramework();        // frameworks/hf.cc
const FrameworkDef& Fsdp2Framework();     // frameworks/fsdp2.cc
const FrameworkDef& SglangFramework();    // frameworks/sglang.cc

/// Every framework init knows, in the order messages list them.
const std::vector<const FrameworkDef*>& Frameworks();

/// Parses "megatron:...", "vllm:...", "hf[:tp=N]", "fsdp2:..."; errors name `option`.
Settings ParseSettings(const std::string& text, const std::string& option);

/// The layout for `arch` under `s`, in the order reshard.layout/1 writes it;
/// `notes` gets one line per derived fact worth saying (padding, replication).
nlohmann::ordered_json MakeLayout(const Arch& arch, const std::string& model_name, Settings s, Notes& notes);

// --- shared by the frameworks --------------------------------------------------------

std::string S(int64_t x);
std::string Join(const std::vector<std::string>& v);

/// Throws "OPTION 'TEXT': what".
[[noreturn]] void Fail(const Settings& s, const std::string& what);

/// Fail, for a refusal that another tensor-parallel size may fix (or, where
/// `try_quant_none`, vLLM's quant=none): MakeLayout then tries the other
/// TPs with the rest of the settings as given, and quant=none, and adds those
/// that work: "...; use tp=1 or tp=2, or quant=none (BF16 weights)" (nothing
/// where none does).
[[noreturn]] void FailTp(const Settings& s, const std::string& what, bool try_quant_none = false);

/// "; did you mean 'x'?" for the candidate closest to `word` when it is close
/// (two edits, or a third of its letters for longer words), else "".
std::string DidYouMean(const std::string& word, const std::vector<std::string>& candidates);

/// `value` as an integer from 1 to kMaxRanks, or an error naming `key`.
int64_t PositiveInt(const Settings& s, const std::string& key, const std::string& value);

/// Role classes: how a tensor is cut by tensor parallelism in every framework.
/// expert_whole: an expert's tensor that tensor parallelism leaves whole (the
/// down projection's bias, added after the row-parallel reduction).
enum class Cut { replicate, column, row, vocab, expert_column, expert_row, expert_whole };
Cut CutOf(Role r);
bool IsNorm(Role r);
bool IsExpert(Role r);
/// Linear weights a quantized inference checkpoint stores in FP8: every linear
/// of the decoder layers except the router (vLLM builds gates with quant_config=None).
bool IsQuantized(Role r);

/// The up part fused after a gate part ([gate; up]): up, shared_up,
/// expert_up, expert_up_bias for gate, shared_gate, expert_gate, expert_gate_bias.
Role UpOf(Role gate);

/// A checkpoint tensor the model spec holds split into parts
/// (frameworks/architectures.cc: Qwen3-Next's q_proj, in_proj_qkvz,
/// in_proj_ba, conv1d; Llama 4's q_proj and k_proj): for its first part, the
/// buffer rule fusing the parts back under the checkpoint's name; null for
/// the other parts and every other tensor.
nlohmann::ordered_json CheckpointFusion(const Arch& a, const ArchTensor& t);
/// Whether `t` is a part of such a tensor (its first part included).
bool InCheckpointFusion(const Arch& a, const ArchTensor& t);

/// The first tensor of `a` with role `r`; nullptr when none.
const ArchTensor* Find(const Arch& a, Role r);

/// Replaces the last occurrence of `from` in `name` by `to`.
std::string Rename(std::string name, const std::string& from, const std::string& to);

struct Axis {
  std::string name;
  int64_t size;
};

/// The layout being built: meshes, placements and buffer rules.
class Builder {
 public:
  /// A mesh without its size-1 axes (the last one kept when all are).
  void AddMesh(const std::string& name, std::vector<Axis> axes);
  bool HasAxis(const std::string& mesh, const std::string& axis) const;
  /// A placement rule for one tensor family: axis -> spec, on `mesh`; axes of
  /// size one (left out of the mesh) are dropped. `extra` fields ("order",
  /// "split_heads") follow the axes.
  void Place(const ArchTensor& t, const std::string& mesh,
             const std::vector<std::pair<std::string, nlohmann::ordered_json>>& axes,
             const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());
  /// The layout-wide buffer dtype ("dtype" after "ranks"); unset: none written.
  void SetDtype(const std::string& dtype) { dtype_ = dtype; }
  void Buffer(nlohmann::ordered_json b) { buffers_.push_back(std::move(b)); }

  nlohmann::ordered_json Finish(const std::string& name, const std::string& model, int64_t ranks, bool default_buffers,
                                const std::string& notes);

 private:
  std::vector<std::pair<std::string, std::vector<Axis>>> meshes_;
  std::string dtype_;
  nlohmann::ordered_json placements_ = nlohmann::ordered_json::array(), buffers_ = nlohmann::ordered_json::array();
};

nlohmann::ordered_json Shard(int64_t dim);

/// The vocabulary padded to `multiple` and split evenly over `n` ranks: the
/// placement of the vocab dim and, when there is padding, the padded buffer rows.
struct VocabSplit {
  nlohmann::ordered_json axis;   // null when n == 1
  int64_t padded = 0, per_rank = 0;
};
VocabSplit SplitVocab(int64_t vocab, int64_t multiple, int64_t n);

/// The "tp" axis of a non-expert tensor under vLLM-style tensor parallelism
/// (vLLM and plain HF TP): column roles by rows (K/V heads replicated over
/// `kv_heads` parts when TP exceeds them), row roles by columns, the
/// vocabulary as `vocab` says; appended to `axes`, nothing for the rest.
void AddTpAxis(const ArchTensor& t, bool kv_replicated, int64_t kv_heads, const VocabSplit& vocab,
               std::vector<std::pair<std::string, nlohmann::ordered_json>>& axes);

/// How an inference side stores quantized linear weights.
struct QuantFormat {
  std::string kind;              // "", "fp8-block", "fp8-channel", "mxfp8"
  int64_t block_rows = 0, block_cols = 0;
  std::string scale_suffix;      // appended to the weight buffer's name
};
/// `kind` as asked ("" for the checkpoint's own format, "none" for none).
QuantFormat QuantOf(const Arch& a, const std::string& kind);
/// A buffer rule's "quant" for `buffer`.
nlohmann::ordered_json QuantJson(const QuantFormat& q, const std::string& buffer);

/// Attention heads over TP as vLLM's QKVParallelLinear cuts them (also a plain
/// HF TP split): true when KV heads are replicated (TP exceeds them). Errors
/// name `who`; the replication is noted. frameworks/vllm.cc.
bool HeadsOverTp(const Arch& a, const Settings& s, const std::string& who, Notes& notes);

}  // namespace reshard::init
