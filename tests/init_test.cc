// `reshard init` on the command line, and the samples it generates: every
// checked-in sample spec must be exactly what samples/regenerate.sh writes.
#include <filesystem>
#include <set>
#include <tuple>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace reshard::testing {
namespace {

namespace fs = std::filesystem;

// Every spec under samples/ (all but config.json and the docs) is generated,
// and what init writes today is byte-identical to what is checked in.
TEST(InitSamples, CheckedInSamplesAreWhatInitWrites) {
  TempDir dir;
  Result r = Shell(dir, "RESHARD=" + Quote(RESHARD_BINARY) + " " + Quote(SourceDir() + "/samples/regenerate.sh") + " " +
                            Quote(dir.File("out")));
  ASSERT_EQ(r.code, 0) << r.err;
  std::set<std::string> generated, checked_in;
  for (const auto& e : fs::recursive_directory_iterator(dir.File("out")))
    if (e.is_regular_file()) generated.insert(fs::relative(e.path(), dir.File("out")).string());
  for (const auto& e : fs::recursive_directory_iterator(SourceDir() + "/samples"))
    if (e.is_regular_file() && e.path().extension() == ".json" && e.path().filename() != "config.json")
      checked_in.insert(fs::relative(e.path(), SourceDir() + "/samples").string());
  EXPECT_EQ(generated, checked_in) << "a sample spec that regenerate.sh does not write, or the other way round";
  for (const std::string& f : generated)
    EXPECT_EQ(ReadText(dir.File("out/" + f)), ReadText(Sample(f)))
        << "samples/" << f << " differs from what reshard init writes; run samples/regenerate.sh";
}

// What `reshard init ... --train megatron:...,spec=local` writes for the tiny
// configs that real Megatron-Core 0.19.2 ran on CPU (tests/data/megatron/, see
// tests/megatron/cases.py for the settings) has zero differences with every
// rank's recorded named_parameters() under `reshard check`: bf16 as under
// Float16Module, and with fp32-norms against a bare GPTModel's dump.
TEST(InitMegatron, RealDumpsHaveZeroDifferences) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"dense-tp2-pp2", "megatron:tp=2,pp=2,spec=local"},
      {"dense-tied-tp2-pp2", "megatron:tp=2,pp=2,spec=local"},
      {"dense-tp2-pp2-vpp2", "megatron:tp=2,pp=2,vpp=2,spec=local"},
      {"dense-tp4-qg2", "megatron:tp=4,spec=local,vocab-divisible=16"},
      {"dense-tp4-padded", "megatron:tp=4,spec=local"},
      {"moe-tp2-pp2-ep2", "megatron:tp=2,pp=2,ep=2,etp=1,spec=local"},
      {"moe-tp2-pp2-dp2-ep2-etp2", "megatron:tp=2,pp=2,dp=2,ep=2,etp=2,spec=local"},
  };
  for (const auto& [name, train] : cases) {
    SCOPED_TRACE(name);
    const std::string data = SourceDir() + "/tests/data/megatron/" + name + "/";
    for (const bool bare : {false, true}) {
      const std::string out = dir.File(name + (bare ? "-bare" : ""));
      Result r = Reshard(dir, {"init", "-q", "--hf-config", data + "config.json", "--train",
                               train + (bare ? ",fp32-norms" : ""), "--infer", "hf", "-o", out});
      ASSERT_EQ(r.code, 0) << r.err;
      r = Reshard(dir, {"check", "--layout", out + "/train.json", "--model", out + "/model.json", "--state-dict",
                        data + (bare ? "dump-no-float16module.json" : "dump.json")});
      EXPECT_EQ(r.code, 0) << (bare ? "fp32-norms" : "") << "\n" << r.out << r.err;
    }
  }
}

TEST(InitCli, WritesTheSpecsAndSaysWhatToRunNext) {
  TempDir dir;
  Result r = Reshard(dir, {"init", "--hf-config", Sample("tiny-moe"), "--train", "megatron:tp=2,ep=2,etp=1",
                           "--infer", "vllm:tp=4", "--cluster", "dgx-h100", "-o", dir.File("specs")});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string d = dir.File("specs") + "/";
  EXPECT_EQ(r.out, "wrote " + d + "model.json\nwrote " + d + "train.json\nwrote " + d + "infer.json\nwrote " + d +
                       "cluster.json\n"
                       "  train: megatron-tp2-ep2-te, 2 ranks\n"
                       "  infer: vllm-tp4, 4 ranks\n"
                       "  --infer: TP 4 > 2 KV heads: each KV head replicated on 2 ranks\n"
                       "next:\n  reshard compile --model " + d + "model.json --from " + d + "train.json --to " + d +
                       "infer.json --cluster " + d + "cluster.json -o " + d + "plan.rsplan\n");
  Result c = Reshard(dir, {"compile", "--model", d + "model.json", "--from", d + "train.json", "--to", d + "infer.json",
                           "--cluster", d + "cluster.json", "-o", d + "plan.rsplan", "-q"});
  ASSERT_EQ(c.code, 0) << c.err;
  Result v = Reshard(dir, {"validate", d + "plan.rsplan"});
  EXPECT_EQ(v.code, 0) << v.out << v.err;
}

// A refused combination: non-zero exit, the framework's rule, and nothing written.
TEST(InitCli, RefusedSettingsWriteNothing) {
  TempDir dir;
  Result r = Reshard(dir, {"init", "--hf-config", Sample("tiny-dense/config.json"), "--train", "megatron:tp=8",
                           "--infer", "vllm:tp=4", "-o", dir.File("specs")});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--train 'megatron:tp=8': Megatron-Core needs num_attention_heads (4) divisible by "
                       "tensor_model_parallel_size (8); use tp=1, tp=2 or tp=4\n"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir.File("specs")));
  r = Reshard(dir, {"init", "--hf-config", dir.File("missing.json"), "--train", "hf", "--infer", "hf", "-o",
                    dir.File("specs")});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("missing.json"), std::string::npos) << r.err;
  r = Reshard(dir, {"init", "--hf-config", Sample("tiny-dense"), "--train", "hf", "--infer", "hf", "--cluster",
                    "dgx-a100", "-o", dir.File("specs")});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--cluster: cannot open 'dgx-a100'; expected a reshard.cluster/1 file or a bundled cluster: "
                       "'dgx-h100' (H100 80 GB, 8 GPUs per NVLink domain) or 'gb200-nvl72' (GB200 186 GB, 72 GPUs "
                       "per NVLink domain)\n"),  // an A100 cluster: no suggestion of an H100 one
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir.File("specs")));
}

TEST(InitCli, HelpTeachesEveryOptionWithExamples) {
  TempDir dir;
  Result r = Reshard(dir, {"init", "--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* s : {"megatron:tp=N,pp=N", "pp-layers=", "grouped-gemm", "spec=te|local", "vocab-divisible",
                        "vllm:tp=N[,pp=N][,dp=N][,ep][,engines=N][,quant=none|fp8-block|fp8-channel|mxfp8]", "hf:tp=N",
                        "--cluster", "Examples:", "reshard init --hf-config", "deepseek_v3"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}


// The architectures issue 31 added (glm4_moe, gpt_oss) against real ranks
// (tests/data/archs/, recorded by tests/archs/record_vllm.py and
// record_megatron.py): what `reshard init` writes for each case's settings has
// zero differences with every rank's parameters under `reshard check` (vLLM's
// own runtime buffers, named as the engine's, aside).
TEST(InitArchs, RealRanksHaveZeroDifferences) {
  TempDir dir;
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"vllm-glm4moe-tp2", "--infer", "vllm:tp=2"},
      {"vllm-glm4moe-tp2-dp2-ep", "--infer", "vllm:tp=2,dp=2,ep"},
      {"vllm-gptoss-tp2", "--infer", "vllm:tp=2"},
      {"vllm-gptoss-tp2-dp2", "--infer", "vllm:tp=2,dp=2"},
      {"vllm-gptoss-tp2-dp2-ep", "--infer", "vllm:tp=2,dp=2,ep"},
      {"megatron-glm4moe-tp2-pp2-ep2", "--train", "megatron:tp=2,pp=2,ep=2,etp=1,spec=local"},
      {"megatron-gptoss-tp2-pp2-ep2", "--train", "megatron:tp=2,pp=2,ep=2,etp=1,spec=local"},
      {"vllm-qwen3next-tp2", "--infer", "vllm:tp=2"},
      {"vllm-qwen3next-tp2-dp2-ep", "--infer", "vllm:tp=2,dp=2,ep"},
      {"megatron-qwen3next-tp2-pp2-ep2", "--train", "megatron:tp=2,pp=2,ep=2,etp=1,spec=local"},
      {"megatron-llama4-tp2-pp2-ep2", "--train", "megatron:tp=2,pp=2,ep=2,etp=1,spec=local"},
      {"vllm-llama4-tp2", "--infer", "vllm:tp=2"},
      {"vllm-llama4-tp2-dp2-ep", "--infer", "vllm:tp=2,dp=2,ep"},
  };
  for (const auto& [name, side, setting] : cases) {
    SCOPED_TRACE(name);
    const std::string data = SourceDir() + "/tests/data/archs/" + name + "/";
    const std::string out = dir.File(name);
    const bool train = side == "--train";
    Result r = Reshard(dir, {"init", "-q", "--hf-config", data + "config.json", "--train", train ? setting : "hf",
                             "--infer", train ? "hf" : setting, "-o", out});
    ASSERT_EQ(r.code, 0) << r.err;
    r = Reshard(dir, {"check", "--layout", out + (train ? "/train.json" : "/infer.json"), "--model",
                      out + "/model.json", "--state-dict", data + "dump.json"});
    EXPECT_EQ(r.code, 0) << r.out << r.err;
  }
}

// init, compile, validate and `run --local` (every destination element
// checked) of `config` from `train` into `infer`, in folder `d`.
void RunExact(const TempDir& dir, const std::string& config, const std::string& train, const std::string& infer,
              const std::string& d) {
  Result r = Reshard(dir, {"init", "-q", "--hf-config", config, "--train", train, "--infer", infer, "-o", d});
  ASSERT_EQ(r.code, 0) << r.err;
  r = Reshard(dir, {"compile", "-q", "--model", d + "/model.json", "--from", d + "/train.json", "--to",
                    d + "/infer.json", "--cluster", "dgx-h100", "-o", d + "/p.rsplan"});
  ASSERT_EQ(r.code, 0) << r.err;
  r = Reshard(dir, {"validate", d + "/p.rsplan"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  r = Reshard(dir, {"run", d + "/p.rsplan", "--local", "--timeout", "60", "--json"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["wrong"], 0) << r.out;
  EXPECT_GT(j["checked"].get<int64_t>(), 0) << r.out;
}

// Tiny GLM-4.5 and gpt-oss configs: init, compile, validate and `run --local`
// (every destination element checked) from Megatron into vLLM layouts (TP and
// DP without EP, with EP) and into hf, and from hf into vLLM.
TEST(InitArchs, TinyConfigsRunExactIntoVllmAndHf) {
  TempDir dir;
  const std::string glm = R"({"model_type": "glm4_moe", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
    "moe_intermediate_size": 32, "n_routed_experts": 8, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "attention_bias": true, "use_qk_norm": true, "num_nextn_predict_layers": 1, "vocab_size": 500})";
  const std::string oss = R"({"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32,
    "num_local_experts": 8, "vocab_size": 500})";
  WriteText(dir.File("glm.json"), glm);
  WriteText(dir.File("oss.json"), oss);
  const std::vector<std::pair<std::string, std::string>> sides = {
      {"megatron:tp=2,pp=2,ep=2,etp=1", "vllm:tp=2,dp=2"},
      {"megatron:tp=2,pp=2,ep=4,etp=1,grouped-gemm", "vllm:tp=2,dp=2,ep"},
      {"megatron:tp=2,ep=2,etp=1,spec=local", "hf"},
      {"hf", "vllm:tp=2,pp=2"},
  };
  for (const std::string model : {"glm", "oss"}) {
    for (size_t i = 0; i < sides.size(); ++i) {
      const auto& [train, infer] = sides[i];
      SCOPED_TRACE(model + ": " + train + " -> " + infer);
      const std::string d = dir.File(model + "-" + std::to_string(i));
      RunExact(dir, dir.File(model + ".json"), train, infer, d);
    }
  }
}

// Qwen3-Next (hybrid linear/full attention, the checkpoint's fused tensors
// split in the model spec) and Llama 4 (MoE layers between dense ones): init,
// compile, validate and `run --local` every element, into and out of the
// layouts init describes for them.
TEST(InitArchs, HybridAndInterleavedMoeRunExact) {
  TempDir dir;
  WriteText(dir.File("next.json"), R"({"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "full_attention_interval": 2,
    "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "vocab_size": 500})");
  WriteText(dir.File("llama4.json"), R"({"model_type": "llama4", "text_config": {"hidden_size": 64,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 32, "intermediate_size_mlp": 96, "num_local_experts": 8, "interleave_moe_layer_step": 2,
    "vocab_size": 500}})");
  const std::vector<std::tuple<std::string, std::string, std::string>> runs = {
      {"next", "hf", "vllm:tp=2"},
      {"next", "hf:tp=2", "vllm:tp=2,dp=2,ep"},
      {"next", "hf", "vllm:tp=4,dp=2"},  // KV heads replicated, experts' intermediate dim over DP x TP
      {"next", "vllm:tp=2", "hf"},
      // Megatron's zero-centered norms: out_norm held as w - 1 (TE), the others as 1 + w (local).
      {"next", "megatron:tp=2,pp=2,ep=2,etp=1", "vllm:tp=2"},
      {"next", "megatron:tp=2,pp=2,ep=4,etp=1,spec=local", "vllm:tp=2,dp=2,ep"},
      {"next", "vllm:tp=2", "megatron:tp=2,pp=2,ep=2,etp=1"},
      {"llama4", "megatron:tp=2,pp=2,ep=2,etp=1", "hf"},
      {"llama4", "megatron:tp=2,pp=2,ep=2,etp=1", "vllm:tp=2"},
      {"llama4", "hf", "vllm:tp=4,dp=2,ep"},  // KV heads replicated over TP 4
      {"llama4", "vllm:tp=2", "megatron:tp=2,ep=4,etp=1,spec=local"},
      {"llama4", "hf:tp=2", "megatron:tp=2,pp=2,ep=4,etp=1,grouped-gemm"},
  };
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& [model, train, infer] = runs[i];
    SCOPED_TRACE(model + ": " + train + " -> " + infer);
    const std::string d = dir.File(model + "-" + std::to_string(i));
    RunExact(dir, dir.File(model + ".json"), train, infer, d);
  }
}

}  // namespace
}  // namespace reshard::testing
