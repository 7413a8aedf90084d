// `reshard init` against the recorded dumps of tests/data/recorded/: every
// rank's parameters (name, dtype, shape). The vLLM cases are dumps of real
// vLLM 0.33 ranks built and loaded on CPU (tests/vllm/record.py; CI re-records
// them in tools/test.d/25-vllm.sh and fails on any change), the SGLang cases
// of real SGLang 0.5.23 ranks (tests/sglang/record.py, tools/test.d/26-sglang.sh,
// MLA's derived attributes included); the Megatron-Core
// 0.19.2 Transformer Engine cases are derived from the source by
// tests/recorded/derive.py (each case's SOURCES.md names the file and function
// of every name pattern), since TE does not run without a GPU. `reshard check`
// must find zero differences.
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace reshard::testing {
namespace {

namespace fs = std::filesystem;

struct RecordedCase {
  const char* name;
  const char* train;  // --train (hf when the case is vLLM's)
  const char* infer;  // --infer (hf when the case is Megatron's)
  int engine = 0;     // the engine's own tensors `check` reports, all ranks together (vLLM: attention scales, W_UV / W_UK_T)
};

bool IsHf(const char* side) { return std::string(side) == "hf"; }

// The init settings that match each recorded case (derive.py's CASES).
const std::vector<RecordedCase>& Cases() {
  static const std::vector<RecordedCase> cases = {
      {"megatron-te-dense-tp2-pp2", "megatron:tp=2,pp=2,spec=te", "hf"},
      {"megatron-te-moe-grouped-tp2-pp2-ep2", "megatron:tp=2,pp=2,ep=2,etp=1,grouped-gemm,spec=te", "hf"},
      {"megatron-te-moe-grouped-tp2-dp2-ep2-etp2", "megatron:tp=2,dp=2,ep=2,etp=2,grouped-gemm,spec=te", "hf"},
      {"megatron-te-moe-sequential-tp2-ep2", "megatron:tp=2,ep=2,etp=1,spec=te", "hf"},
      {"megatron-te-mla-tp2-pp2-ep2", "megatron:tp=2,pp=2,ep=2,etp=1,grouped-gemm,spec=te", "hf"},
      // engine: ranks x layers on each x (4 attention scales, + W_UV and W_UK_T under MLA)
      {"vllm-dense-tp4", "hf", "vllm:tp=4", 4 * 4 * 4},
      {"vllm-dense-tp2-pp2", "hf", "vllm:tp=2,pp=2", 4 * 2 * 4},
      {"vllm-moe-tp2", "hf", "vllm:tp=2", 2 * 4 * 4},
      {"vllm-moe-tp2-dp2", "hf", "vllm:tp=2,dp=2", 4 * 4 * 4},
      {"vllm-moe-tp2-dp2-ep", "hf", "vllm:tp=2,dp=2,ep", 4 * 4 * 4},
      {"vllm-moe-tp2-fp8-channel", "hf", "vllm:tp=2,quant=fp8-channel", 2 * 4 * 4},
      {"vllm-mla-dp3-ep-uneven", "hf", "vllm:tp=1,dp=3,ep", 3 * 4 * 6},
      {"vllm-mla-tp2", "hf", "vllm:tp=2", 2 * 4 * 6},
      // No quant=: init takes FP8 block scales from the checkpoint's quantization_config.
      {"vllm-mla-fp8-tp2-dp2-ep", "hf", "vllm:tp=2,dp=2,ep", 4 * 4 * 6},
      // SGLang: ranks x MLA layers x (w_kc, w_vc; under FP8 also w_scale and
      // attn_mqa / attn_mha k_scale, v_scale)
      {"sglang-dense-tp4", "hf", "sglang:tp=4"},
      {"sglang-moe-tp2", "hf", "sglang:tp=2"},
      {"sglang-moe-tp4-ep2-attn-dp2", "hf", "sglang:tp=4,ep=2,attn-dp=2"},
      {"sglang-mla-tp2", "hf", "sglang:tp=2", 2 * 4 * 2},
      {"sglang-mla-fp8-tp2", "hf", "sglang:tp=2", 2 * 4 * 7},
      {"sglang-mla-tp2-ep2-attn-dp2", "hf", "sglang:tp=2,ep=2,attn-dp=2", 2 * 4 * 2},
  };
  return cases;
}

// Parameters that are views of the layout's memory rather than its shape:
// vLLM's per-channel FP8 linears (compressed_tensors_w8a8_fp8.py
// process_weights_after_loading: `weight = weight.t()`) report [in, out] over
// [out, in] row-major storage, the layout init writes. `reshard check` reads
// the view's strides from the dump and says so instead of a difference.
const std::map<std::string, std::set<std::string>>& ExpectedViews() {
  static const std::map<std::string, std::set<std::string>> views = [] {
    std::set<std::string> lines;  // o_proj is square (64 x 64): the same shape, a view all the same
    for (int rank : {0, 1})
      for (int layer = 0; layer < 4; ++layer)
        for (const auto& [proj, dump, layout] : {std::tuple{"qkv_proj", "[64, 96]", "[96, 64]"},
                                                 std::tuple{"o_proj", "[64, 64]", "[64, 64]"}})
          lines.insert("rank " + std::to_string(rank) + ": view: model.layers." + std::to_string(layer) +
                       ".self_attn." + proj + ".weight: the dump has fp8_e4m3" + dump +
                       " with strides [1, 64], the transposed view of the layout's row-major fp8_e4m3" + layout +
                       " the layout declares (\"held\": \"transposed\"): binding it binds the memory");
    return std::map<std::string, std::set<std::string>>{{"vllm-moe-tp2-fp8-channel", lines}};
  }();
  return views;
}

bool IsEngineLine(const std::string& line) { return line.find(": engine: ") != std::string::npos; }

std::set<std::string> DiffLines(const std::string& out) {
  std::set<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("rank ", 0) == 0 && !IsEngineLine(line)) lines.insert(line);
  return lines;
}

std::vector<std::string> EngineLines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("rank ", 0) == 0 && IsEngineLine(line)) lines.push_back(line);
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
    const bool engine_side = !IsHf(c.infer);
    r = Reshard(dir, {"check", "--layout", out + (engine_side ? "/infer.json" : "/train.json"), "--model",
                      out + "/model.json", "--state-dict", data + "dump.json"});
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("matches the dump"), std::string::npos) << r.out;
    auto views = ExpectedViews().find(c.name);
    EXPECT_EQ(DiffLines(r.out), views == ExpectedViews().end() ? std::set<std::string>{} : views->second) << r.out;
    // The engine's own tensors: each named with its reason, none a difference.
    const std::vector<std::string> engine = EngineLines(r.out);
    EXPECT_EQ(static_cast<int>(engine.size()), c.engine) << r.out;
    for (const std::string& l : engine) {
      const bool scale = l.find("runtime buffer of vLLM 0.33: attention / KV-cache scale") != std::string::npos ||
                         l.find("runtime buffer of SGLang 0.5.23: FP8 KV-cache scale parameter") != std::string::npos;
      const bool mla = (l.find("derived at load of vLLM 0.33, from model.layers.") != std::string::npos ||
                        l.find("derived at load of SGLang 0.5.23, from model.layers.") != std::string::npos) &&
                       l.find(".self_attn.kv_b_proj.weight: MLA's absorbed projection") != std::string::npos;
      EXPECT_TRUE(scale || mla) << l;
    }
  }
}

// A dumped tensor the layout does not bind stays a difference unless it is
// one of the engine's own by name and the dump says which engine it is.
TEST(RecordedDumps, EngineTensorsNeedTheirEngineAndExactNames) {
  TempDir dir;
  const std::string data = Recorded("vllm-mla-tp2"), out = dir.File("specs");
  ASSERT_EQ(Reshard(dir, {"init", "-q", "--hf-config", data + "config.json", "--train", "hf", "--infer", "vllm:tp=2",
                          "-o", out})
                .code,
            0);
  nlohmann::json dump = nlohmann::json::parse(ReadText(data + "dump.json"));
  for (auto& rank : dump) {
    rank.erase("framework");  // no engine named: its tensors are extras
    rank["params"].push_back({{"name", "model.layers.0.self_attn.W_UV_copy"}, {"dtype", "torch.bfloat16"},
                              {"shape", {2}}});
  }
  WriteText(dir.File("plain.json"), dump.dump());
  Result r = Reshard(dir, {"check", "--layout", out + "/infer.json", "--model", out + "/model.json", "--state-dict",
                           dir.File("plain.json"), "--json"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["engine_tensors"].empty());
  // 2 ranks x 4 layers x (4 scales + W_UV + W_UK_T) + the made-up tensor on each rank
  EXPECT_EQ(j["differences"].size(), 2u * 4 * 6 + 2) << r.out;
  for (auto& rank : dump) rank["framework"] = "vLLM 0.33.0";
  WriteText(dir.File("named.json"), dump.dump());
  r = Reshard(dir, {"check", "--layout", out + "/infer.json", "--model", out + "/model.json", "--state-dict",
                    dir.File("named.json"), "--json"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["engine_tensors"].size(), 2u * 4 * 6);
  ASSERT_EQ(j["differences"].size(), 2u) << r.out;
  EXPECT_EQ(j["differences"][0]["name"], "model.layers.0.self_attn.W_UV_copy");
  EXPECT_EQ(j["engine_tensors"][4]["kind"], "derived at load");
}

// SGLang's derived MLA attributes are engine tensors only in a dump that
// names SGLang: under another engine's name, or none, they are differences.
TEST(RecordedDumps, SglangEngineTensorsNeedSglangsName) {
  TempDir dir;
  const std::string data = Recorded("sglang-mla-fp8-tp2"), out = dir.File("specs");
  ASSERT_EQ(Reshard(dir, {"init", "-q", "--hf-config", data + "config.json", "--train", "hf", "--infer", "sglang:tp=2",
                          "-o", out})
                .code,
            0);
  nlohmann::json dump = nlohmann::json::parse(ReadText(data + "dump.json"));
  for (const char* framework : {"", "vLLM 0.33.0", "SGLang 0.5.23"}) {
    SCOPED_TRACE(framework);
    for (auto& rank : dump) rank["framework"] = framework;
    WriteText(dir.File("dump.json"), dump.dump());
    Result r = Reshard(dir, {"check", "--layout", out + "/infer.json", "--model", out + "/model.json", "--state-dict",
                             dir.File("dump.json"), "--json"});
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const bool sglang = std::string(framework).rfind("SGLang", 0) == 0;
    // 2 ranks x 4 layers x (w_kc, w_vc, w_scale, attn_mqa and attn_mha k_scale / v_scale)
    EXPECT_EQ(r.code, sglang ? 0 : 1) << r.out << r.err;
    EXPECT_EQ(j["engine_tensors"].size(), sglang ? 2u * 4 * 7 : 0u);
    EXPECT_EQ(j["differences"].size(), sglang ? 0u : 2u * 4 * 7);
  }
}

// SGLang's fused shared expert: every rank holds it in slot E_local of
// w13_weight / w2_weight, split over TP like a routed expert; init refuses
// the setting with that reason (a layout cannot name the slot yet), and the
// same ranks without fusion are what shared-experts=tp describes.
TEST(RecordedDumps, SglangFusedSharedExpertIsSlotEOfTheExperts) {
  TempDir dir;
  const std::string data = Recorded("sglang-mla-tp2-fused");
  Result r = Reshard(dir, {"init", "-q", "--hf-config", data + "config.json", "--train", "hf", "--infer",
                           "sglang:tp=2,shared-experts=fused", "-o", dir.File("fused")});
  EXPECT_EQ(r.code, 2);  // a refusal, like every init error
  EXPECT_NE(r.err.find("SGLang holds a fused shared expert in slot 8 of every rank's w13_weight / w2_weight"),
            std::string::npos)
      << r.err;
  const nlohmann::json dump = nlohmann::json::parse(ReadText(data + "dump.json"));
  ASSERT_EQ(dump.size(), 2u);
  for (const auto& rank : dump) {
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& p : rank["params"]) shapes[p["name"]] = p["shape"].get<std::vector<int64_t>>();
    for (int layer = 1; layer < 4; ++layer) {  // the MoE layers: 8 routed experts + the shared one, I = 32 over TP2
      const std::string prefix = "model.layers." + std::to_string(layer) + ".mlp.";
      EXPECT_EQ(shapes[prefix + "experts.w13_weight"], (std::vector<int64_t>{9, 32, 64})) << prefix;
      EXPECT_EQ(shapes[prefix + "experts.w2_weight"], (std::vector<int64_t>{9, 64, 16})) << prefix;
      EXPECT_EQ(shapes.count(prefix + "shared_experts.gate_up_proj.weight"), 0u) << prefix;
    }
  }
}

// Every case directory is one the tests above check, with its three files.
TEST(RecordedDumps, EveryRecordedCaseIsChecked) {
  std::set<std::string> on_disk, tested = {"sglang-mla-tp2-fused"};
  for (const auto& e : fs::directory_iterator(SourceDir() + "/tests/data/recorded"))
    if (e.is_directory()) on_disk.insert(e.path().filename().string());
  for (const RecordedCase& c : Cases()) tested.insert(c.name);
  EXPECT_EQ(on_disk, tested);
  for (const std::string& name : on_disk)
    for (const char* f : {"config.json", "dump.json", "SOURCES.md"})
      EXPECT_TRUE(fs::exists(Recorded(name) + f)) << name << "/" << f;
}

// The checked-in Megatron dumps are exactly what derive.py's source-derived rules write.
TEST(RecordedDumps, CheckedInFilesAreWhatDeriveWrites) {
  TempDir dir;
  if (Shell(dir, "command -v python3").code != 0) GTEST_SKIP() << "python3 not found (needed to run derive.py)";
  Result r = Shell(dir, "python3 " + Quote(SourceDir() + "/tests/recorded/derive.py") + " " + Quote(dir.File("out")));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const RecordedCase& c : Cases()) {
    if (std::string(c.name).rfind("megatron", 0) != 0) continue;  // the vLLM ones are recorded from real ranks
    for (const char* f : {"config.json", "dump.json", "SOURCES.md"})
      EXPECT_EQ(ReadText(dir.File("out/" + std::string(c.name) + "/" + f)), ReadText(Recorded(c.name) + f))
          << c.name << "/" << f << " differs from what tests/recorded/derive.py writes";
  }
}

// The checked-in samples (what samples/regenerate.sh has init write for the
// real Qwen3-235B, DeepSeek-V3, Kimi-K2 configs and the tiny ones) against the
// same source-derived rules at full size, for every pipeline stage's first rank
// and the last rank: zero differences but for the known one, where it applies.
TEST(RecordedDumps, SamplesMatchTheFrameworksSource) {
  TempDir dir;
  if (Shell(dir, "command -v python3").code != 0) GTEST_SKIP() << "python3 not found (needed to run derive.py)";
  Result r = Shell(dir, "python3 " + Quote(SourceDir() + "/tests/recorded/derive.py") + " --samples " +
                            Quote(dir.File("dumps")));
  ASSERT_EQ(r.code, 0) << r.err;
  struct SampleCase {
    std::string sample, layout;
    bool views;  // vLLM per-channel FP8: transposed views of the layout's memory
  };
  const std::vector<SampleCase> cases = {
      {"tiny-dense", "train.json", false},
      {"tiny-dense", "infer.json", false},
      {"tiny-dense", "infer-tp2-dp2.json", false},
      {"tiny-dense", "infer-tp1-dp4.json", false},
      {"tiny-moe", "train.json", false},
      {"tiny-moe", "infer.json", false},
      {"tiny-moe", "infer-ep.json", false},
      {"qwen3-235b", "train-tp4-pp8-ep16.json", false},
      {"qwen3-235b", "infer-tp8-dp16.json", false},
      {"qwen3-235b", "infer-tp4-dp32.json", false},
      {"qwen3-235b", "infer-tp8-dp16-fp8-channel.json", true},
      {"deepseek-v3", "train-pp16-ep16.json", false},
      {"deepseek-v3", "infer-tp32-dp8.json", false},
      {"deepseek-v3", "infer-tp16-dp16-fp8.json", false},
      {"kimi-k2", "train-1024.json", false},
      {"kimi-k2", "infer-512.json", false},
      {"moe-2.4t", "train-1024.json", false},
      {"moe-2.4t", "infer-512.json", false},
  };
  size_t dumps = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.File("dumps")))
    dumps += e.is_regular_file();
  EXPECT_EQ(dumps, cases.size()) << "derive.py's SAMPLES and this list differ";
  for (const SampleCase& c : cases) {
    SCOPED_TRACE(c.sample + "/" + c.layout);
    const std::string stem = c.layout.substr(0, c.layout.size() - std::string(".json").size());
    const std::string dump = dir.File("dumps/" + c.sample + "/" + stem + ".dump.json");
    r = Reshard(dir, {"check", "--layout", Sample(c.sample + "/" + c.layout), "--model",
                      Sample(c.sample + "/model.json"), "--state-dict", dump});
    const std::set<std::string> lines = DiffLines(r.out);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_EQ(lines.empty(), !c.views) << r.out;
    for (const std::string& l : lines) EXPECT_NE(l.find(": view: "), std::string::npos) << l;
  }
}

}  // namespace
}  // namespace reshard::testing
