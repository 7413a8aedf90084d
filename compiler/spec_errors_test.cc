// Spec input a fuzzer or an attacker would write (issue 17): numbers out of
// range, duplicate keys, syntax errors in long or binary lines. Each gets one
// clear message naming the file and the JSON path (or line and column),
// compared here in full.
#include <gtest/gtest.h>

#include "compiler/test.h"

namespace reshard {
namespace {

using nlohmann::json;
using testing::ErrorOf;

const char* kModel = R"({"format": "reshard.model/1", "name": "m", "dtype": "bf16", "dims": {"layer": 2},
  "tensors": [{"name": "layers.{layer}.w", "shape": [8, 8]}]})";
const char* kLayout = R"({"format": "reshard.layout/1", "name": "l", "ranks": 2,
  "meshes": {"dense": [["tp", 2]]}, "placements": [{"match": "*", "tp": {"shard": 0}}]})";
const char* kCluster = R"({"format": "reshard.cluster/1", "name": "c", "gpus_per_domain": 8, "nic_gbps": 400,
  "nvlink_GBps": 450})";

// Replaces the first `from` of `text` by `to`.
std::string With(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

std::string ModelError(const std::string& text) {
  return ErrorOf([&] { ParseModel(ParseJson(text, "model.json"), "model.json"); });
}
std::string LayoutError(const std::string& text) {
  return ErrorOf([&] {
    ModelSpec m = ParseModel(ParseJson(kModel, "model.json"), "model.json");
    ParseLayout(ParseJson(text, "infer.json"), "infer.json", m);
  });
}
std::string ClusterError(const std::string& text) {
  return ErrorOf([&] { ParseCluster(ParseJson(text, "cluster.json"), "cluster.json"); });
}

TEST(SpecErrors, TheBaseSpecsParse) {
  EXPECT_EQ(ModelError(kModel), "");
  EXPECT_EQ(LayoutError(kLayout), "");
  EXPECT_EQ(ClusterError(kCluster), "");
}

TEST(SpecErrors, RanksHaveAnUpperLimit) {
  EXPECT_EQ(LayoutError(With(kLayout, "\"ranks\": 2", "\"ranks\": 1000000000")),
            "infer.json: /ranks: expected an integer <= 1048576, got 1000000000");
  EXPECT_EQ(LayoutError(With(kLayout, "\"ranks\": 2", "\"ranks\": 1e9")),
            "infer.json: /ranks: expected an integer <= 1048576, got 1000000000.0");
  EXPECT_EQ(LayoutError(With(kLayout, "[\"tp\", 2]", "[\"tp\", 4294967295]")),
            "infer.json: /meshes/dense/0/1: expected an integer <= 1048576, got 4294967295");
  // Axes within the limit whose product is not: no 64-bit overflow on the way.
  EXPECT_EQ(LayoutError(With(kLayout, "[\"tp\", 2]", "[\"a\", 1048576], [\"b\", 1048576], [\"c\", 1048576], [\"d\", 1048576]")),
            "infer.json: /meshes/dense: mesh axes multiply to more than 1048576 ranks, the layout has 2");
}

TEST(SpecErrors, NumbersOutOfRange) {
  EXPECT_EQ(ClusterError(With(kCluster, "\"nic_gbps\": 400", "\"nic_gbps\": 1e400")),
            "cluster.json:1:80: number overflow parsing '1e400'\n"
            "... \"c\", \"gpus_per_domain\": 8, \"nic_gbps\": 1e400,\n"
            "                                           ^");
  EXPECT_EQ(ClusterError(With(kCluster, "\"nic_gbps\": 400", "\"nic_gbps\": 1e300")),
            "cluster.json: /nic_gbps: expected a number <= 1e12, got 1e+300");
  EXPECT_EQ(ClusterError(With(kCluster, "\"nic_gbps\": 400", "\"nic_gbps\": -0.0")),
            "cluster.json: /nic_gbps: expected a positive number, got -0.0");
  EXPECT_EQ(ClusterError(With(kCluster, "\"gpus_per_domain\": 8", "\"gpus_per_domain\": 18446744073709551615")),
            "cluster.json: /gpus_per_domain: expected an integer <= 4294967295, got 18446744073709551615");
}

// JSON holds 1e30 and 8.0 as floats: a whole number out of range is too
// large (or small), one in range is an integer in the wrong notation; only a
// number with a fractional part is called one.
TEST(SpecErrors, WholeNumbersWrittenAsFloats) {
  EXPECT_EQ(LayoutError(With(kLayout, "\"ranks\": 2", "\"ranks\": 1e30")),
            "infer.json: /ranks: expected an integer <= 1048576, got 1e+30");
  EXPECT_EQ(LayoutError(With(kLayout, "\"ranks\": 2", "\"ranks\": -1e30")),
            "infer.json: /ranks: expected an integer >= 1, got -1e+30");
  EXPECT_EQ(ModelError(With(kModel, "[8, 8]", "[8, 1e19]")),
            "model.json: /tensors/0/shape/1: expected an integer <= 4294967295, got 1e+19");
  EXPECT_EQ(LayoutError(With(kLayout, "\"ranks\": 2", "\"ranks\": 2.0")),
            "infer.json: /ranks: expected an integer, got 2.0; write it as 2");
  EXPECT_EQ(LayoutError(With(kLayout, "\"ranks\": 2", "\"ranks\": 2.5")),
            "infer.json: /ranks: expected an integer, got a number with a fraction");
  EXPECT_EQ(LayoutError(With(kLayout, "\"name\": \"l\"", "\"name\": 1e30")),
            "infer.json: /name: expected a string, got a number");
}

// A suggestion among formats, dtypes or clusters never changes what the
// value is: the ones it begins or is a part of, else a typo that keeps its numbers.
TEST(SpecErrors, DidYouMeanStaysWithinTheKind) {
  const std::vector<std::string> quant = {"none", "fp8-block", "fp8-channel", "mxfp8"};
  EXPECT_EQ(DidYouMeanSameKind("fp8", quant), "; did you mean 'fp8-block' or 'fp8-channel'?");
  EXPECT_EQ(DidYouMeanSameKind("FP8", quant), "; did you mean 'fp8-block' or 'fp8-channel'?");
  EXPECT_EQ(DidYouMeanSameKind("fp8_block", quant), "; did you mean 'fp8-block'?");
  EXPECT_EQ(DidYouMeanSameKind("block", quant), "; did you mean 'fp8-block'?");
  EXPECT_EQ(DidYouMeanSameKind("mxfp4", quant), "");
  EXPECT_EQ(DidYouMeanSameKind("fp4", quant), "");
  const std::vector<std::string> clusters = {"dgx-h100", "gb200-nvl72"};
  EXPECT_EQ(DidYouMeanSameKind("dgx-h200", clusters), "");
  EXPECT_EQ(DidYouMeanSameKind("dgx-a100", clusters), "");
  EXPECT_EQ(DidYouMeanSameKind("dgx-h10", clusters), "");  // H10 is not the start of H100
  EXPECT_EQ(DidYouMeanSameKind("gb200", clusters), "; did you mean 'gb200-nvl72'?");
  EXPECT_EQ(DidYouMeanSameKind("gb200-nvl36", clusters), "");
  EXPECT_EQ(DidYouMeanSameKind("nvl72", clusters), "; did you mean 'gb200-nvl72'?");
  EXPECT_EQ(DidYouMeanSameKind("h100", clusters), "; did you mean 'dgx-h100'?");
  EXPECT_EQ(DidYouMeanSameKind("dgx_h100", clusters), "; did you mean 'dgx-h100'?");
  EXPECT_EQ(DidYouMeanSameKind("dgx-h100-sxm", clusters), "; did you mean 'dgx-h100'?");
  EXPECT_EQ(ModelError(With(kModel, "\"bf16\"", "\"fp8\"")),
            "model.json: /dtype: unknown dtype 'fp8', expected one of bf16, fp16, fp32, fp8_e4m3; did you mean "
            "'fp8_e4m3'?");
  EXPECT_EQ(ModelError(With(kModel, "\"bf16\"", "\"fp8-e4m3\"")),
            "model.json: /dtype: unknown dtype 'fp8-e4m3', expected one of bf16, fp16, fp32, fp8_e4m3; did you mean "
            "'fp8_e4m3'?");
  EXPECT_EQ(ModelError(With(kModel, "\"bf16\"", "\"bf32\"")),
            "model.json: /dtype: unknown dtype 'bf32', expected one of bf16, fp16, fp32, fp8_e4m3");
}

TEST(SpecErrors, ShapesAreUnsigned64BitValues) {
  EXPECT_EQ(ModelError(With(kModel, "[8, 8]", "[8, 18446744073709551615]")),
            "model.json: /tensors/0/shape/1: expected an integer <= 4294967295, got 18446744073709551615");
  EXPECT_EQ(ModelError(With(kModel, "[8, 8]", "[8, 4294967296]")),
            "model.json: /tensors/0/shape/1: expected an integer <= 4294967295, got 4294967296");
  EXPECT_EQ(ModelError(With(kModel, "[8, 8]", "[8, -9223372036854775808]")),
            "model.json: /tensors/0/shape/1: expected an integer >= 1, got -9223372036854775808");
  EXPECT_EQ(ModelError(With(kModel, "\"layer\": 2", "\"layer\": 9223372036854775808")),
            "model.json: /dims/layer: expected an integer <= 4294967295, got 9223372036854775808");
}

TEST(SpecErrors, TensorAndModelElements) {
  EXPECT_EQ(ModelError(With(kModel, "[8, 8]", "[16777216, 16777217]")),
            "model.json: /tensors/0/shape: tensor 'layers.{layer}.w' has more than 2^48 elements (stack dims times shape)");
  EXPECT_EQ(ModelError(With(kModel, "[8, 8]", "[4294967295, 4294967295, 4294967295, 4294967295, 4294967295]")),
            "model.json: /tensors/0/shape: tensor 'layers.{layer}.w' has more than 2^48 elements (stack dims times shape)");
  // 17 tensors of 2^48 elements: more than 2^52 in all.
  json m = json::parse(kModel);
  m["dims"] = json::object();
  m["tensors"] = json::array();
  for (int i = 0; i < 17; ++i) {
    std::string name = "w";
    name += std::to_string(i);
    m["tensors"].push_back({{"name", name}, {"shape", {16777216, 16777216}}});
  }
  EXPECT_EQ(ModelError(m.dump()), "model.json: /tensors/16: the model's tensors up to 'w16' have more than 2^52 elements");
}

TEST(SpecErrors, DuplicateKeys) {
  EXPECT_EQ(ModelError(With(kModel, "\"name\": \"m\"", "\"name\": \"m\", \"name\": \"n\"")),
            "model.json: /name: duplicate key 'name' (each key at most once)");
  EXPECT_EQ(ModelError(With(kModel, "\"shape\": [8, 8]", "\"shape\": [8, 8], \"shape\": [4, 4]")),
            "model.json: /tensors/0/shape: duplicate key 'shape' (each key at most once)");
  EXPECT_EQ(LayoutError(With(kLayout, "{\"shard\": 0}", "{\"shard\": 0, \"shard\": 1}")),
            "infer.json: /placements/0/tp/shard: duplicate key 'shard' (each key at most once)");
  // Keys in different objects may repeat.
  EXPECT_EQ(ModelError(R"({"format": "reshard.model/1", "name": "m", "tensors": [{"name": "a", "shape": [1]},
                          {"name": "b", "shape": [2]}]})"),
            "");
}

TEST(SpecErrors, SyntaxErrorsShowAtMost80EscapedCharacters) {
  // Minified: the whole file on one line, raw bytes in it.
  std::string text = json::parse(kLayout).dump();
  text.insert(120, "\x01\xff oops");
  EXPECT_EQ(LayoutError(text),
            "infer.json:1:121: syntax error while parsing object key - invalid string: control character U+0001 (SOH) "
            "must be escaped to \\u0001; last read: '\"ran<U+0001>'; expected string literal\n"
            "...s\":[{\"match\":\"*\",\"tp\":{\"shard\":0}}],\"ran\\x01\\xff oopsks\":2}\n"
            "                                           ^");
  // A long line is cut to 40 characters either side, the token nlohmann read last to its last 40.
  std::string wide = "{\"format\": \"" + std::string(200, 'a') + "\" " + std::string(200, 'b') + "\"}";
  EXPECT_EQ(LayoutError(wide),
            "infer.json:1:215: syntax error while parsing object - invalid literal; last read: '..." +
                std::string(37, 'a') + "\" b'; expected '}'\n..." + std::string(38, 'a') + "\" " + std::string(40, 'b') +
                "...\n" + std::string(43, ' ') + "^");
}

TEST(SpecErrors, AtIsReadAsAnInteger) {
  const std::string pp = R"({"format": "reshard.layout/1", "name": "l", "ranks": 2,
  "meshes": {"dense": [["pp", 2]]}, "placements": [{"match": "*", "pp": {"at": 18446744073709551615}}]})";
  EXPECT_EQ(LayoutError(pp), "infer.json: /placements/0/pp/at: expected an integer <= 4294967295, got 18446744073709551615");
}

// What docs/specs.md found the parser let through (issue 31): each now has a message.
TEST(SpecErrors, LoopholesTheReferenceFound) {
  // An exact match names one tensor family; a typo would hand the tensor to a later "*".
  EXPECT_EQ(LayoutError(With(kLayout, "{\"match\": \"*\", \"tp\": {\"shard\": 0}}",
                             "{\"match\": \"layers.{layer}.v\"}, {\"match\": \"*\", \"tp\": {\"shard\": 0}}")),
            "infer.json: /placements/0/match: no tensor 'layers.{layer}.v' in model 'm'; did you mean "
            "'layers.{layer}.w'? (a match without * ? [ names one tensor family, as the model spec writes it)");
  // A mesh axis cannot take a placement field's name.
  EXPECT_EQ(LayoutError(With(With(kLayout, "[\"tp\", 2]", "[\"order\", 2]"), "\"tp\": {", "\"x\": {")),
            "infer.json: /meshes/dense/0/0: 'order' is a field of every placement and cannot name a mesh axis");
  const std::string rule = R"(, "buffers": [{"name": "b.{layer}", "tensor": "layers.{layer}.w", )";
  auto with_rule = [&](const std::string& fields) {
    std::string l = kLayout;
    return l.substr(0, l.size() - 1) + rule + fields + "}]}";
  };
  EXPECT_EQ(LayoutError(with_rule(R"("parts": ["layers.{layer}.nope"])")),
            "infer.json: /buffers/0: use either \"tensor\" (a buffer of one tensor) or \"parts\" (several, fused)");
  EXPECT_EQ(LayoutError(with_rule(R"("interleave": {"dim": 0, "groups": 2, "group": 4})")),
            "infer.json: /buffers/0/interleave/group: unknown field 'group'; did you mean 'groups'?");
}

}  // namespace
}  // namespace reshard
