// The `reshard` binary end to end: `run --local` on hand-built plans and on
// plans compiled from samples/tiny-*.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/test.h"

namespace reshard {
namespace {

using testing::BuildPlan;
using testing::TempDir;

using Result = testing::ShellResult;
using testing::Shell;

const std::string kBinary = RESHARD_BINARY;
const std::string kSamples = std::string(RESHARD_SOURCE_DIR) + "/samples";

// The JSON `run --json` prints: its last line (progress lines come before it).
nlohmann::json RunJson(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const size_t nl = s.rfind('\n');
  return nlohmann::json::parse(nl == std::string::npos ? s : s.substr(nl + 1), nullptr, false);
}

TEST(E2eTest, RunChecksEveryElementOfAHandBuiltPlan) {
  TempDir dir;
  testing::WriteFile(dir.File("p.rsplan"), BuildPlan(testing::ForwardPlan()));
  Result r = Shell(kBinary + " run " + dir.File("p.rsplan") + " --local --timeout 10 --json");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = RunJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["ranks"], 4) << r.out;
  EXPECT_EQ(j["failed_ranks"], 0) << r.out;
  EXPECT_EQ(j["bytes"], 1024) << r.out;
  EXPECT_EQ(j["net_bytes"], 512) << r.out;
  EXPECT_EQ(j["nvlink_bytes"], 512) << r.out;
  EXPECT_EQ(j["checked"], 256) << r.out;
  EXPECT_EQ(j["wrong"], 0) << r.out;
  EXPECT_EQ(j["ok"], true) << r.out;
}

TEST(E2eTest, RunReportsWrongElements) {
  TempDir dir;
  testing::PlanSpec spec = testing::ForwardPlan();
  // Rank 3 unpacks rows 2..4 where rows 0..2 belong and back.
  spec.programs[3].regions[0] = testing::MakeRegion(kNone, 64, {2, 32}, {32, 1});
  spec.programs[3].regions[1] = testing::MakeRegion(0, 0, {2, 32}, {32, 1});
  spec.programs[3].steps[3] = testing::MakeStep(fb::StepKind::unpack, kNone, 0, 1, 0, 256, fb::Dtype::fp32);
  testing::WriteFile(dir.File("p.rsplan"), BuildPlan(spec));
  Result r = Shell(kBinary + " run " + dir.File("p.rsplan") + " --local --timeout 10");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("checked: 256 elements, 128 wrong"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 3: tensor 'u' [0,0] in buffer 'u': expected "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAILED"), std::string::npos) << r.out;
}

TEST(E2eTest, RunRefusesABrokenPlan) {
  TempDir dir;
  testing::WriteFile(dir.File("p.rsplan"), {1, 2, 3});
  Result r = Shell(kBinary + " run " + dir.File("p.rsplan") + " --local");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "reshard: error: " + dir.File("p.rsplan") + ": file is 3 bytes, too small to be a plan\n");
}

TEST(E2eTest, RunReportsARankThatFails) {
  TempDir dir;
  testing::PlanSpec spec = testing::PackAndDirectPlan();
  // Rank 1 expects a third message rank 0 never sends.
  spec.programs[1].steps.push_back(
      testing::MakeStep(fb::StepKind::recv, 0, kNone, kNone, 0, 16, fb::Dtype::bf16));
  testing::WriteFile(dir.File("p.rsplan"), BuildPlan(spec));
  Result r = Shell(kBinary + " run " + dir.File("p.rsplan") + " --local --timeout 2");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("reshard run: rank 1: step 3 (recv) of round 0 from peer 0 failed: "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("ranks:   2, 1 failed"), std::string::npos) << r.out;
}

struct Sample {
  const char* dir;
  const char* infer;
  const char* strategy;
};

class CompiledSampleTest : public ::testing::TestWithParam<Sample> {};

TEST_P(CompiledSampleTest, CompilesAndRunsWithEveryElementRight) {
  const Sample& s = GetParam();
  TempDir dir;
  const std::string d = kSamples + "/" + s.dir + "/";
  Result c = Shell(kBinary + " compile --model " + d + "model.json --from " + d + "train.json --to " + d + s.infer +
                   " --cluster " + kSamples + "/clusters/dgx-h100.json --strategy " + s.strategy + " -o " +
                   dir.File("p.rsplan"));
  ASSERT_EQ(c.exit_code, 0) << c.out;
  Result r = Shell(kBinary + " run " + dir.File("p.rsplan") + " --local --timeout 20 --json");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = RunJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["wrong"], 0) << r.out;
  EXPECT_EQ(j["ok"], true) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Tiny, CompiledSampleTest,
                         ::testing::Values(Sample{"tiny-dense", "infer.json", "direct"},
                                           Sample{"tiny-dense", "infer.json", "gather"},
                                           Sample{"tiny-dense", "infer-tp2-dp2.json", "direct"},
                                           Sample{"tiny-dense", "infer-tp2-dp2.json", "gather"},
                                           Sample{"tiny-dense", "infer-tp1-dp4.json", "direct"},
                                           Sample{"tiny-dense", "infer-tp1-dp4.json", "gather"},
                                           Sample{"tiny-moe", "infer.json", "direct"},
                                           Sample{"tiny-moe", "infer.json", "gather"},
                                           Sample{"tiny-moe", "infer-ep.json", "direct"},
                                           Sample{"tiny-moe", "infer-ep.json", "gather"}),
                         [](const ::testing::TestParamInfo<Sample>& info) {
                           std::string name = std::string(info.param.dir) + "_" + info.param.infer + "_" +
                                              info.param.strategy;
                           for (char& ch : name) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace reshard
