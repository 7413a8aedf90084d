// Bad input: every malformed or inconsistent spec gets one clear message,
// compared here in full.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "compiler/test.h"

namespace reshard {
namespace {

using nlohmann::json;
using testing::ErrorOf;

json Model() {
  return json::parse(R"({"format": "reshard.model/1", "name": "m", "dtype": "bf16", "dims": {"layer": 4},
    "tensors": [{"name": "embed", "shape": [16, 8]},
                {"name": "layers.{layer}.q", "shape": [8, 8]},
                {"name": "layers.{layer}.k", "shape": [4, 8]},
                {"name": "layers.{layer}.bias", "shape": [8], "dtype": "fp32"},
                {"name": "layers.{layer}.v32", "shape": [4, 8], "dtype": "fp32"}]})");
}

json Train() {
  return json::parse(R"({"format": "reshard.layout/1", "name": "train", "ranks": 4,
    "meshes": {"dense": [["pp", 2], ["tp", 2]]},
    "placements": [{"match": "layers.*", "mesh": "dense", "pp": {"shard": "layer"}, "tp": {"shard": 0}},
                   {"match": "*", "mesh": "dense", "pp": {"at": 0}}]})");
}

json Infer() {
  return json::parse(R"({"format": "reshard.layout/1", "name": "infer", "ranks": 2, "default_buffers": true,
    "meshes": {"tp": [["tp", 2]]},
    "placements": [{"match": "*", "tp": {"shard": 0}}],
    "buffers": [{"name": "layers.{layer}.qk", "parts": ["layers.{layer}.q", "layers.{layer}.k"], "concat": 0}]})");
}

std::string CompileError(const json& m, const json& t, const json& i) {
  return ErrorOf([&] { testing::CompileJson(m, t, i, testing::TinyCluster()); });
}

TEST(BadInput, BaseSpecsCompile) { EXPECT_EQ(CompileError(Model(), Train(), Infer()), ""); }

TEST(BadInput, JsonSyntaxErrorNamesLineAndColumn) {
  EXPECT_EQ(ErrorOf([] { ParseJson("{\n  \"name\": \"m\",\n  \"dims\": {\"layer\" 4}\n}", "model.json"); }),
            "model.json:3:20: syntax error while parsing object separator - unexpected number literal; expected ':'\n  \"dims\": {\"layer\" 4}\n                   ^");
}

TEST(BadInput, EmptyFile) {
  EXPECT_EQ(ErrorOf([] { ParseJson("  \n", "model.json"); }),
            "model.json:2:1: the file is empty, expected a JSON object\n\n^");
}

TEST(BadInput, UnknownFormatVersion) {
  json m = Model();
  m["format"] = "reshard.model/2";
  EXPECT_EQ(CompileError(m, Train(), Infer()),
            "model.json: /format: unknown format 'reshard.model/2', expected 'reshard.model/1'");
}

TEST(BadInput, MeshProductDiffersFromRanks) {
  json t = Train();
  t["ranks"] = 8;
  EXPECT_EQ(CompileError(Model(), t, Infer()), "train.json: /meshes/dense: mesh axes multiply to 4 ranks, the layout has 8");
}

TEST(BadInput, DimNotDivisibleWithoutSizes) {
  json i = Infer();
  i["ranks"] = 3;
  i["meshes"]["tp"] = json::parse(R"([["tp", 3]])");
  EXPECT_EQ(CompileError(Model(), Train(), i),
            "infer.json: /placements/0/tp: dim 0 of tensor 'layers.{layer}.q' (size 8) does not divide evenly over 3 positions "
            "of axis 'tp'; give \"sizes\" for an uneven split, or \"split\": \"chunk\" for torch.chunk's");
}

TEST(BadInput, SizesDoNotSumToTheDim) {
  json t = Train();
  t["placements"][0]["pp"]["sizes"] = {1, 2};
  EXPECT_EQ(CompileError(Model(), t, Infer()),
            "train.json: /placements/0/pp/sizes: sizes sum to 3, dim 'layer' of tensor 'layers.{layer}.q' (size 4) needs 4");
}

TEST(BadInput, ShardNamesUnknownDim) {
  json t = Train();
  t["placements"][0]["pp"]["shard"] = "layers";
  EXPECT_EQ(CompileError(Model(), t, Infer()),
            "train.json: /placements/0/pp/shard: unknown dim 'layers': the model's stack dims are 'layer', or give an "
            "index into the tensor's shape; did you mean 'layer'?");
}

TEST(BadInput, ShardOnStackDimTheTensorLacks) {
  json t = Train();
  t["placements"][1]["pp"] = {{"shard", "layer"}};
  EXPECT_EQ(CompileError(Model(), t, Infer()),
            "train.json: /placements/1/pp: tensor 'embed' has no dim 'layer' (use \"at\" or replicate)");
}

TEST(BadInput, TensorMatchedByNoPlacement) {
  json t = Train();
  t["placements"].erase(1);
  EXPECT_EQ(CompileError(Model(), t, Infer()), "train.json: /placements: no placement matches tensor 'embed'");
}

TEST(BadInput, DestinationTensorWithNoSource) {
  json t = Train();
  t["placements"][1] = json::parse(R"({"match": "*", "mesh": "dense", "tp": {"assign": [[0, 1, 2], [3]], "shard": 0}})");
  EXPECT_EQ(CompileError(Model(), t, Infer()),
            "infer.json: tensor 'embed': inference rank 0 needs [4:8, 0:8], which no training rank of train.json holds");
}

// The routing cuts the tensors' needs on several threads: where several
// tensors have needs no source holds, the message is still the first
// tensor's in model order, every time.
TEST(BadInput, NoSourceNamesTheFirstTensorInModelOrder) {
  json t = Train();
  t["placements"][0]["tp"] = json::parse(R"({"assign": [[0, 1, 2], [3]], "shard": 0})");
  t["placements"][1] = json::parse(R"({"match": "*", "mesh": "dense", "tp": {"assign": [[0, 1, 2], [3]], "shard": 0}})");
  for (int run = 0; run < 20; ++run)
    EXPECT_EQ(CompileError(Model(), t, Infer()),
              "infer.json: tensor 'embed': inference rank 0 needs [4:8, 0:8], which no training rank of train.json "
              "holds");
  // The layers' tensors lack sources too: with embed held whole, the first of them is named.
  t["placements"][1] = json::parse(R"({"match": "*", "mesh": "dense", "pp": {"at": 0}})");
  EXPECT_EQ(CompileError(Model(), t, Infer()),
            "infer.json: tensor 'layers.{layer}.q': inference rank 1 needs [0:4, 4:8, 0:8], which no training rank of "
            "train.json holds");
}

TEST(BadInput, LayoutWrittenForAnotherModel) {
  json i = Infer();
  i["model"] = "other";
  EXPECT_EQ(CompileError(Model(), Train(), i),
            "infer.json: /model: layout is written for model 'other', the model spec is 'm'");
}

TEST(BadInput, FusedPartsWithDifferentDtypes) {
  json i = Infer();
  i["buffers"][0]["parts"] = {"layers.{layer}.q", "layers.{layer}.v32"};
  EXPECT_EQ(CompileError(Model(), Train(), i),
            "infer.json: /buffers/0: parts 'layers.{layer}.q' (bf16) and 'layers.{layer}.v32' (fp32) have different "
            "dtypes");
}

TEST(BadInput, FusedPartsWithDifferentShapes) {
  json i = Infer();
  i["buffers"][0]["concat"] = 1;
  EXPECT_EQ(CompileError(Model(), Train(), i),
            "infer.json: /buffers/0: on rank 0, parts 'layers.{layer}.q' and 'layers.{layer}.k' have local extents 4 "
            "and 2 on dim 0, which is not fused");
}

TEST(BadInput, OverlappingBufferRules) {
  json i = Infer();
  i["buffers"].push_back({{"name", "layers.{layer}.q2"}, {"parts", {"layers.{layer}.q"}}});
  EXPECT_EQ(CompileError(Model(), Train(), i),
            "infer.json: /buffers/1/parts/0: tensor 'layers.{layer}.q' is already part of /buffers/0; buffer rules "
            "overlap");
}

TEST(BadInput, BufferNameProducedTwice) {
  json i = Infer();
  i["buffers"].push_back({{"name", "layers.{layer}.qk"}, {"parts", {"layers.{layer}.bias"}}});
  EXPECT_EQ(CompileError(Model(), Train(), i),
            "infer.json: /buffers/1/name: buffer name 'layers.0.qk' is produced twice on rank 0 (also by /buffers/0); "
            "buffer rules overlap");
}

TEST(BadInput, HeldIsTransposedOn2DBuffersOnly) {
  json i = Infer();
  i["buffers"][0]["held"] = "sideways";
  EXPECT_EQ(CompileError(Model(), Train(), i),
            "infer.json: /buffers/0/held: expected \"transposed\" (the framework holds the 2-D buffer as "
            "storage.t()), got 'sideways'");
  i["buffers"].push_back({{"name", "layers.{layer}.bias2"}, {"tensor", "layers.{layer}.bias"}, {"held", "transposed"}});
  i["buffers"][0].erase("held");
  EXPECT_EQ(CompileError(Model(), Train(), i),
            "infer.json: /buffers/1/held: \"held\": \"transposed\" is for 2-D buffers; this rule's buffers have 1 "
            "dims");
}

TEST(BadInput, BufferShapeTooSmall) {
  json i = Infer();
  i["buffers"][0]["shape"] = {4, 8};
  EXPECT_EQ(CompileError(Model(), Train(), i),
            "infer.json: /buffers/0/shape: buffer content on rank 0 is [6, 8], larger than the declared shape [4, 8]");
}

TEST(BadInput, UnknownPartName) {
  json i = Infer();
  i["buffers"][0]["parts"][1] = "layers.{layer}.kk";
  EXPECT_EQ(CompileError(Model(), Train(), i),
            "infer.json: /buffers/0/parts/1: no tensor 'layers.{layer}.kk' in model 'm'; did you mean "
            "'layers.{layer}.k'?");
}

TEST(BadInput, UnwritableOutputLeavesNoFile) {
  std::string out = "/nonexistent-dir/plan.rsplan";
  std::string cmd = std::string(RESHARD_BINARY) + " compile --model " + testing::Sample("tiny-dense/model.json") +
                    " --from " + testing::Sample("tiny-dense/train.json") + " --to " +
                    testing::Sample("tiny-dense/infer.json") + " --cluster " +
                    testing::Sample("clusters/dgx-h100.json") + " -o " + out + " 2>/tmp/reshard_err.txt";
  int rc = std::system(cmd.c_str());
  EXPECT_NE(rc, 0);
  std::ifstream in("/tmp/reshard_err.txt");
  std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(err, "reshard: error: /nonexistent-dir/plan.rsplan: cannot write: No such file or directory\n");
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace reshard
