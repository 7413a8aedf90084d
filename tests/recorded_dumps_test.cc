// `reshard init` against the recorded dumps of tests/data/recorded/: every
// rank's parameters (name, dtype, shape) as Megatron-Core 0.19.2 with the
// Transformer Engine layer spec (TEGroupedMLP, MLA) and vLLM hold them, derived
// from the frameworks' source by tests/recorded/derive.py (each case's
// SOURCES.md names the file and function of every name pattern), since neither
// runs without a GPU. `reshard check` must find zero differences.
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace reshard::testing {
namespace {

namespace fs = std::filesystem;

struct RecordedCase {
  const char* name;
  const char* train;  // --train (hf when the case is vLLM's)
  const char* infer;  // --infer (hf when the case is Megatron's)
};

// The init settings that match each recorded case (derive.py's CASES).
const std::vector<RecordedCase>& Cases() {
  static const std::vector<RecordedCase> cases = {
      {"megatron-te-dense-tp2-pp2", "megatron:tp=2,pp=2,spec=te", "hf"},
      {"megatron-te-moe-grouped-tp2-pp2-ep2", "megatron:tp=2,pp=2,ep=2,etp=1,grouped-gemm,spec=te", "hf"},
      {"megatron-te-moe-grouped-tp2-dp2-ep2-etp2", "megatron:tp=2,dp=2,ep=2,etp=2,grouped-gemm,spec=te", "hf"},
      {"megatron-te-moe-sequential-tp2-ep2", "megatron:tp=2,ep=2,etp=1,spec=te", "hf"},
      {"megatron-te-mla-tp2-pp2-ep2", "megatron:tp=2,pp=2,ep=2,etp=1,grouped-gemm,spec=te", "hf"},
      {"vllm-dense-tp4", "hf", "vllm:tp=4"},
      {"vllm-moe-tp2", "hf", "vllm:tp=2"},
      {"vllm-moe-tp2-dp2", "hf", "vllm:tp=2,dp=2"},
      {"vllm-moe-tp2-dp2-ep", "hf", "vllm:tp=2,dp=2,ep"},
      {"vllm-moe-tp2-fp8-channel", "hf", "vllm:tp=2,quant=fp8-channel"},
      {"vllm-mla-dp3-ep-uneven", "hf", "vllm:tp=1,dp=3,ep"},
      {"vllm-mla-tp2", "hf", "vllm:tp=2"},
      // No quant=: init takes FP8 block scales from the checkpoint's quantization_config.
      {"vllm-mla-fp8-tp2-dp2-ep", "hf", "vllm:tp=2,dp=2,ep"},
  };
  return cases;
}

// Known differences, each the framework's truth against what init writes today.
// Megatron-Core's TE spec builds a dense layer's pre-MLP norm into
// TELayerNormColumnParallelLinear (`mlp.linear_fc1.layer_norm_weight`) and only
// MoE layers get a separate `pre_mlp_layernorm`; init names it
// pre_mlp_layernorm.weight on every layer of a model with experts (MakeMegatron,
// init_layouts.cc), so the DeepSeek-style model's dense first layer differs on
// the ranks of the first pipeline stage.
const std::map<std::string, std::set<std::string>>& KnownDifferences() {
  static const std::map<std::string, std::set<std::string>> known = {
      {"megatron-te-mla-tp2-pp2-ep2",
       {"rank 0: missing: decoder.layers.0.pre_mlp_layernorm.weight bf16[64]: the layout binds it, the dump does not "
        "have it",
        "rank 0: extra: decoder.layers.0.mlp.linear_fc1.layer_norm_weight bf16[64]: the dump has it, the layout does "
        "not bind it",
        "rank 1: missing: decoder.layers.0.pre_mlp_layernorm.weight bf16[64]: the layout binds it, the dump does not "
        "have it",
        "rank 1: extra: decoder.layers.0.mlp.linear_fc1.layer_norm_weight bf16[64]: the dump has it, the layout does "
        "not bind it"}},
      // vLLM's per-channel FP8 linears (compressed_tensors_w8a8_fp8.py process_weights_after_loading:
      // `weight = weight.t()`) are, after loading, a transposed view: named_parameters() reports
      // [in, out] while the storage stays [out, in] row-major, the layout init writes. The bytes a
      // refit writes are the same; the reported shape differs wherever in != out (qkv_proj here,
      // o_proj is square). Telling them apart needs the dump's strides, not a different layout.
      {"vllm-moe-tp2-fp8-channel",
       {
        "rank 0: wrong shape: model.layers.0.self_attn.qkv_proj.weight: the layout says fp8_e4m3[96, 64], "
        "the dump has fp8_e4m3[64, 96]",
        "rank 0: wrong shape: model.layers.1.self_attn.qkv_proj.weight: the layout says fp8_e4m3[96, 64], "
        "the dump has fp8_e4m3[64, 96]",
        "rank 0: wrong shape: model.layers.2.self_attn.qkv_proj.weight: the layout says fp8_e4m3[96, 64], "
        "the dump has fp8_e4m3[64, 96]",
        "rank 0: wrong shape: model.layers.3.self_attn.qkv_proj.weight: the layout says fp8_e4m3[96, 64], "
        "the dump has fp8_e4m3[64, 96]",
        "rank 1: wrong shape: model.layers.0.self_attn.qkv_proj.weight: the layout says fp8_e4m3[96, 64], "
        "the dump has fp8_e4m3[64, 96]",
        "rank 1: wrong shape: model.layers.1.self_attn.qkv_proj.weight: the layout says fp8_e4m3[96, 64], "
        "the dump has fp8_e4m3[64, 96]",
        "rank 1: wrong shape: model.layers.2.self_attn.qkv_proj.weight: the layout says fp8_e4m3[96, 64], "
        "the dump has fp8_e4m3[64, 96]",
        "rank 1: wrong shape: model.layers.3.self_attn.qkv_proj.weight: the layout says fp8_e4m3[96, 64], "
        "the dump has fp8_e4m3[64, 96]"}},
  };
  return known;
}

std::set<std::string> DiffLines(const std::string& out) {
  std::set<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("rank ", 0) == 0) lines.insert(line);
  return lines;
}

std::string Recorded(const std::string& name) { return SourceDir() + "/tests/data/recorded/" + name + "/"; }

// What init writes for each recorded case has zero differences with the
// recorded dump under `reshard check` (or exactly the known ones).
TEST(RecordedDumps, InitMatchesTheFrameworksSource) {
  TempDir dir;
  for (const RecordedCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    const std::string data = Recorded(c.name), out = dir.File(c.name);
    Result r = Reshard(dir, {"init", "-q", "--hf-config", data + "config.json", "--train", c.train, "--infer",
                             c.infer, "-o", out});
    ASSERT_EQ(r.code, 0) << r.err;
    const bool vllm = std::string(c.infer) != "hf";
    r = Reshard(dir, {"check", "--layout", out + (vllm ? "/infer.json" : "/train.json"), "--model",
                      out + "/model.json", "--state-dict", data + "dump.json"});
    auto known = KnownDifferences().find(c.name);
    if (known == KnownDifferences().end()) {
      EXPECT_EQ(r.code, 0) << r.out << r.err;
      EXPECT_NE(r.out.find("matches the dump"), std::string::npos) << r.out;
    } else {
      EXPECT_EQ(r.code, 1) << r.out << r.err;
      EXPECT_EQ(DiffLines(r.out), known->second) << r.out;
    }
  }
}

// Every case directory is one the test above checks, with its three files.
TEST(RecordedDumps, EveryRecordedCaseIsChecked) {
  std::set<std::string> on_disk, tested;
  for (const auto& e : fs::directory_iterator(SourceDir() + "/tests/data/recorded"))
    if (e.is_directory()) on_disk.insert(e.path().filename().string());
  for (const RecordedCase& c : Cases()) tested.insert(c.name);
  EXPECT_EQ(on_disk, tested);
  for (const std::string& name : on_disk)
    for (const char* f : {"config.json", "dump.json", "SOURCES.md"})
      EXPECT_TRUE(fs::exists(Recorded(name) + f)) << name << "/" << f;
}

// The checked-in dumps are exactly what derive.py's source-derived rules write.
TEST(RecordedDumps, CheckedInFilesAreWhatDeriveWrites) {
  TempDir dir;
  if (Shell(dir, "command -v python3").code != 0) GTEST_SKIP() << "python3 not found (needed to run derive.py)";
  Result r = Shell(dir, "python3 " + Quote(SourceDir() + "/tests/recorded/derive.py") + " " + Quote(dir.File("out")));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const RecordedCase& c : Cases())
    for (const char* f : {"config.json", "dump.json", "SOURCES.md"})
      EXPECT_EQ(ReadText(dir.File("out/" + std::string(c.name) + "/" + f)), ReadText(Recorded(c.name) + f))
          << c.name << "/" << f << " differs from what tests/recorded/derive.py writes";
}

}  // namespace
}  // namespace reshard::testing
