// Values that change on the way, end to end: layouts whose buffers hold the
// model's values plus a constant (`"transform": {"offset": c}`, Megatron's
// zero-centered norm gamma, Gemma-style `1 + w` norms) compiled from
// tiny-dense, proven by `reshard validate`, run over Gloo by `reshard run
// --local`, every destination element compared with the reference (the
// source's stored values less its offset, rounded to the tensor's dtype, plus
// the destination's offset); and the inputs that cannot carry an offset,
// refused at compile with the JSON path.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "compiler/test.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using nlohmann::json;
using testing::LoadSample;
using testing::Shell;
using testing::TempDir;
using Result = testing::ShellResult;

const std::string kBinary = RESHARD_BINARY;
const std::string kSamples = std::string(RESHARD_SOURCE_DIR) + "/samples";

const std::string kInputNorm = "model.layers.{layer}.input_layernorm.weight";
const std::string kFinalNorm = "model.norm.weight";
const std::string kMegatronInputNorm = "decoder.layers.{layer.local}.self_attention.linear_qkv.layer_norm_weight";
const std::string kMegatronFinalNorm = "decoder.final_layernorm.weight";

// Sets the offset of the buffer rule named `name`, adding a rule for tensor
// `tensor` under that name where there is none (a layout with default buffers).
void Offset(json& layout, const std::string& name, double offset, const std::string& tensor = "") {
  for (json& b : layout["buffers"])
    if (b["name"] == name) {
      b["transform"] = {{"offset", offset}};
      return;
    }
  layout["buffers"].push_back({{"name", name}, {"tensor", tensor.empty() ? name : tensor},
                               {"transform", {{"offset", offset}}}});
}

struct Refit {
  Result compile, validate, run;
  json summary, show;
  std::string rank0;  // `show --rank 0`
};

// Compiles, validates and runs the refit; the results and `show --json`.
Refit CompileValidateRun(const json& train, const json& infer, const json& cluster = LoadSample("clusters/dgx-h100.json"),
                       const std::string& flags = "") {
  TempDir dir;
  std::ofstream(dir.File("train.json")) << train.dump();
  std::ofstream(dir.File("infer.json")) << infer.dump();
  std::ofstream(dir.File("cluster.json")) << cluster.dump();
  const std::string plan = dir.File("x.rsplan");
  Refit out;
  out.compile = Shell(kBinary + " compile --model " + kSamples + "/tiny-dense/model.json --from " +
                      dir.File("train.json") + " --to " + dir.File("infer.json") + " --cluster " +
                      dir.File("cluster.json") + " -q -o " + plan + " " + flags);
  if (out.compile.exit_code != 0) return out;
  out.validate = Shell(kBinary + " validate " + plan);
  out.run = Shell(kBinary + " run " + plan + " --local --timeout 20 --json");
  out.summary = json::parse(out.run.out.substr(std::min(out.run.out.find('{'), out.run.out.size())), nullptr, false);
  Result show = Shell(kBinary + " show " + plan + " --json");
  out.show = json::parse(show.out, nullptr, false);
  out.rank0 = Shell(kBinary + " show " + plan + " --rank 0").out;
  return out;
}

void ExpectExact(const Refit& r) {
  ASSERT_EQ(r.compile.exit_code, 0) << r.compile.out;
  EXPECT_EQ(r.validate.exit_code, 0) << r.validate.out;
  EXPECT_EQ(r.run.exit_code, 0) << r.run.out;
  EXPECT_EQ(r.summary.value("wrong", -1), 0) << r.run.out;
  EXPECT_GT(r.summary.value("checked", 0), 0) << r.run.out;
}

// Megatron's zero-centered gamma (w - 1) into a vLLM that holds w: the
// senders subtract -1 from what they pack. The plan is schema 3, so that a
// reader older than offsets refuses it; the same refit without them stays 2.
TEST(TransformE2eTest, TrainingSideOffset) {
  json train = LoadSample("tiny-dense/train.json");
  Offset(train, kMegatronInputNorm, -1);
  Offset(train, kMegatronFinalNorm, -1);
  const Refit r = CompileValidateRun(train, LoadSample("tiny-dense/infer.json"));
  ExpectExact(r);
  EXPECT_EQ(r.show.value("schema_version", 0), 3) << r.show.dump();
  EXPECT_NE(r.rank0.find(": decoder.layers.0.self_attention.linear_qkv.layer_norm_weight bf16[64] offset -1\n"),
            std::string::npos)
      << r.rank0;
  const Refit plain = CompileValidateRun(LoadSample("tiny-dense/train.json"), LoadSample("tiny-dense/infer.json"));
  ExpectExact(plain);
  EXPECT_EQ(plain.show.value("schema_version", 0), 2) << plain.show.dump();
}

// Offsets on both sides (the inference side holds 1 + w, Gemma-style; a
// fraction on another tensor), and an fp32 master layout whose buffers are
// wider than the wire: each end converts once.
TEST(TransformE2eTest, BothSidesAndWiderBuffers) {
  json train = LoadSample("tiny-dense/train.json");
  Offset(train, kMegatronInputNorm, -1);
  json infer = LoadSample("tiny-dense/infer.json");
  Offset(infer, kInputNorm, 1);
  Offset(infer, kFinalNorm, 0.5);
  ExpectExact(CompileValidateRun(train, infer));
  train["dtype"] = "fp32";
  ExpectExact(CompileValidateRun(train, infer));
  // The other way round: the inference layout as the source.
  json back = LoadSample("tiny-dense/train.json");
  Offset(back, kMegatronFinalNorm, -1);
  TempDir dir;
  std::ofstream(dir.File("a.json")) << infer.dump();
  std::ofstream(dir.File("b.json")) << back.dump();
  const std::string plan = dir.File("y.rsplan");
  Result c = Shell(kBinary + " compile --model " + kSamples + "/tiny-dense/model.json --from " + dir.File("a.json") +
                   " --to " + dir.File("b.json") + " --cluster dgx-h100 -q -o " + plan);
  ASSERT_EQ(c.exit_code, 0) << c.out;
  EXPECT_EQ(Shell(kBinary + " validate " + plan).exit_code, 0);
  Result run = Shell(kBinary + " run " + plan + " --local --timeout 20");
  EXPECT_EQ(run.exit_code, 0) << run.out;
}

// Colocated: a GPU that holds a norm on both sides copies it locally, the
// copy subtracting one offset and adding the other; the gather strategy's
// owners and chains convert at the same ends.
TEST(TransformE2eTest, ColocatedCopiesAndGather) {
  json train = LoadSample("tiny-dense/train.json");
  Offset(train, kMegatronInputNorm, -1);
  Offset(train, kMegatronFinalNorm, -1);
  json infer = LoadSample("tiny-dense/infer.json");
  Offset(infer, kFinalNorm, 1);
  json cluster = LoadSample("clusters/dgx-h100.json");
  cluster["placement"] = "colocated";
  ExpectExact(CompileValidateRun(train, infer, cluster));
  ExpectExact(CompileValidateRun(train, infer, LoadSample("clusters/dgx-h100.json"), "--strategy gather"));
}

// What cannot carry an offset is refused at compile, naming the JSON path,
// with no plan written.
Result CompileOnly(const json& train, const json& infer, std::string* plan_left = nullptr) {
  TempDir dir;
  std::ofstream(dir.File("train.json")) << train.dump();
  std::ofstream(dir.File("infer.json")) << infer.dump();
  Result c = Shell(kBinary + " compile --model " + kSamples + "/tiny-dense/model.json --from " + dir.File("train.json") +
                   " --to " + dir.File("infer.json") + " --cluster dgx-h100 -o " + dir.File("x.rsplan"));
  if (plan_left != nullptr) *plan_left = std::ifstream(dir.File("x.rsplan")).good() ? "written" : "";
  const std::string prefix = dir.path() + "/";
  for (size_t at; (at = c.out.find(prefix)) != std::string::npos;) c.out.erase(at, prefix.size());
  return c;
}

TEST(TransformE2eTest, RefusesOffsetsOnValuesThatCannotCarryThem) {
  const json infer = LoadSample("tiny-dense/infer.json");
  // FP8 values with scales.
  json quant = infer;
  for (json& b : quant["buffers"])
    if (b["name"] == "model.layers.{layer}.mlp.gate_up_proj.weight") {
      b["quant"] = {{"format", "mxfp8"}, {"scale_name", "model.layers.{layer}.mlp.gate_up_proj.weight_scale"}};
      b["transform"] = {{"offset", 1}};
    }
  std::string left;
  Result r = CompileOnly(LoadSample("tiny-dense/train.json"), quant, &left);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(r.out, "reshard: error: infer.json: /buffers/1/transform: an offset needs values stored as bf16, fp16 or "
                   "fp32; this rule stores them as mxfp8 (/buffers/1/quant), which cannot carry one\n");
  EXPECT_EQ(left, "");
  // FP8 storage without scales.
  json fp8 = infer;
  fp8["buffers"].push_back({{"name", kFinalNorm}, {"tensor", kFinalNorm}, {"dtype", "fp8_e4m3"},
                            {"transform", {{"offset", 1}}}});
  r = CompileOnly(LoadSample("tiny-dense/train.json"), fp8);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(r.out, "reshard: error: infer.json: /buffers/2/transform: an offset needs values stored as bf16, fp16 or "
                   "fp32; 'model.norm.weight' is stored as fp8_e4m3, which cannot carry one\n");
  // A tensor the other side stores quantized.
  json train = LoadSample("tiny-dense/train.json");
  Offset(train, "decoder.layers.{layer.local}.mlp.linear_fc1.weight", -1);
  json q = infer;
  q["buffers"][1]["quant"] = {{"format", "mxfp8"}, {"scale_name", "model.layers.{layer}.mlp.gate_up_proj.weight_scale"}};
  r = CompileOnly(train, q);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(r.out, "reshard: error: train.json: /buffers/5/transform: 'model.layers.{layer}.mlp.gate_proj.weight' is "
                   "stored quantized by infer.json; a tensor held with an offset moves unquantized on both sides (no "
                   "quantize or dequantize step applies an offset)\n");
  // Not a number, out of range, or not exact in fp32.
  for (const auto& [value, why] : std::vector<std::pair<json, std::string>>{
           {"1", "expected a number, got \"1\""},
           {1e6, "expected a number between -65504 and 65504 (what fp16 holds), got 1000000.0"},
           {0.1, "expected a number fp32 holds exactly, got 0.1"}}) {
    json bad = LoadSample("tiny-dense/train.json");
    Offset(bad, kMegatronFinalNorm, 0);
    bad["buffers"][7]["transform"]["offset"] = value;
    r = CompileOnly(bad, infer);
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_EQ(r.out, "reshard: error: train.json: /buffers/7/transform/offset: " + why + "\n");
  }
}

// Every buffer of a tensor holds it with one offset: rules that split a
// tensor by layer range must agree.
TEST(TransformE2eTest, RefusesTwoOffsetsForOneTensor) {
  json train = LoadSample("tiny-dense/train.json");
  json rule = train["buffers"][1];
  ASSERT_EQ(rule["name"], kMegatronInputNorm);
  json first = rule, second = rule;
  first["range"] = {{"layer", {0, 2}}};
  first["transform"] = {{"offset", -1}};
  second["range"] = {{"layer", {2, 4}}};
  train["buffers"][1] = first;
  train["buffers"].push_back(second);
  Result r = CompileOnly(train, LoadSample("tiny-dense/infer.json"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(r.out, "reshard: error: train.json: /buffers/9: 'model.layers.{layer}.input_layernorm.weight' is held with "
                   "none here and with offset -1 by /buffers/1/transform; every buffer of a tensor holds it with one "
                   "offset\n");
  train["buffers"][9]["transform"] = {{"offset", -1}};
  ExpectExact(CompileValidateRun(train, LoadSample("tiny-dense/infer.json")));
}

}  // namespace
}  // namespace reshard
