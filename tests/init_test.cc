// `reshard init` on the command line, and the samples it generates: every
// checked-in sample spec must be exactly what samples/regenerate.sh writes.
#include <filesystem>
#include <set>

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
                       "tensor_model_parallel_size (8)"),
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
  EXPECT_NE(r.err.find("--cluster: cannot open 'dgx-a100'; expected dgx-h100, gb200-nvl72 or a reshard.cluster/1 file"),
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

}  // namespace
}  // namespace reshard::testing
