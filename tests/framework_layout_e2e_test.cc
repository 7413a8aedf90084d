// The layouts of tests/data/layouts/ (issue 13: a fused buffer sharded as a
// whole, all-padding ranks, row-interleaved buffers) compile, validate and
// move every element right under `reshard run --local`.
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace reshard {
namespace {

using testing::Reshard;
using testing::Result;
using testing::TempDir;

struct Case {
  const char* dir;
  const char* from;
  const char* to;
};

class FrameworkLayoutE2e : public ::testing::TestWithParam<Case> {};

TEST_P(FrameworkLayoutE2e, CompilesValidatesAndRunsExact) {
  const Case& c = GetParam();
  TempDir dir;
  const std::string base = testing::SourceDir() + "/tests/data/layouts/" + c.dir + "/";
  const std::string plan = dir.File("p.rsplan");
  Result r = Reshard(dir, {"compile", "--model", base + "model.json", "--from", base + c.from, "--to", base + c.to,
                           "--cluster", testing::Sample("clusters/dgx-h100.json"), "-o", plan, "-q"});
  ASSERT_EQ(r.code, 0) << r.err;
  r = Reshard(dir, {"validate", plan});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  r = Reshard(dir, {"run", plan, "--local", "--timeout", "60", "--json"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["wrong"], 0) << r.out;
  EXPECT_GT(j["checked"].get<int64_t>(), 0) << r.out;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, FrameworkLayoutE2e,
    ::testing::Values(Case{"qkv-tp4-2groups", "train.json", "infer.json"},
                      // Megatron -> Megatron: the whole-sharded qkv on both sides, other ranks.
                      Case{"qkv-tp4-2groups", "infer.json", "train.json"},
                      Case{"padded-vocab", "train.json", "infer.json"},
                      Case{"padded-vocab", "infer.json", "train.json"},
                      Case{"interleaved-w13", "train.json", "infer.json"},
                      Case{"interleaved-w13", "train.json", "infer-whole.json"},
                      Case{"interleaved-w13", "infer.json", "infer-whole.json"},
                      // Megatron TE PP2 with tied embeddings: the last stage's output_layer
                      // copy is written too; dense and MoE pre-MLP norms under their names.
                      Case{"tied-pp2-dense-norms", "train.json", "infer.json"},
                      Case{"tied-pp2-dense-norms", "infer.json", "train.json"},
                      // DTensor / FSDP2 (issue 30): torch.chunk cuts with empty shards, fp32
                      // masters sent as bf16, TP then FSDP (_StridedShard), fused experts
                      // chunked over experts and over their fused dim; both directions.
                      Case{"dtensor-chunk", "fsdp4.json", "hf.json"},
                      Case{"dtensor-chunk", "tp2-fsdp2.json", "hf.json"},
                      Case{"dtensor-chunk", "fsdp4.json", "tp2-fsdp2.json"},
                      Case{"dtensor-chunk", "hf.json", "fsdp4.json"},
                      Case{"dtensor-chunk", "tp2-fsdp2.json", "fsdp4.json"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string n = std::string(i.param.dir) + "_" + i.param.from + "_" + i.param.to;
      for (char& ch : n)
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

}  // namespace
}  // namespace reshard
