// Buffer rules narrowed by "range" (some instances of a stack dim) or "at"
// (ranks at some mesh positions): one tensor family under several framework
// names. Megatron's TE spec fuses a dense layer's pre-MLP norm into
// linear_fc1 but keeps pre_mlp_layernorm on MoE layers; with tied embeddings
// and PP > 1 the last stage holds an output_layer copy of the embedding.
// The layout is tests/data/layouts/tied-pp2-dense-norms (run end to end by
// tests/framework_layout_e2e_test.cc).
#include <gtest/gtest.h>

#include "compiler/expand.h"
#include "compiler/test.h"

namespace reshard {
namespace {

using nlohmann::json;

json Data(const std::string& file) {
  return LoadJson(testing::SourceDir() + "/tests/data/layouts/tied-pp2-dense-norms/" + file);
}

std::vector<std::string> Names(const Expansion& e, int rank) {
  std::vector<std::string> out;
  for (const BufferDesc& b : e.ranks[rank].buffers) out.push_back(b.name);
  std::sort(out.begin(), out.end());
  return out;
}

std::string ExpandError(const json& layout) {
  return testing::ErrorOf([&] {
    ModelSpec m = ParseModel(Data("model.json"), "model.json");
    LayoutSpec l = ParseLayout(layout, "train.json", m);
    Expand(m, l);
  });
}

TEST(NarrowedRules, OneTensorFamilyUnderTheNamesEachStageHolds) {
  ModelSpec m = ParseModel(Data("model.json"), "model.json");
  LayoutSpec l = ParseLayout(Data("train.json"), "train.json", m);
  Expansion e = Expand(m, l);
  using V = std::vector<std::string>;
  // Stage 0 (ranks 0, 1): the embedding, dense layer 0 and MoE layer 1.
  for (int r : {0, 1})
    EXPECT_EQ(Names(e, r), (V{"decoder.layers.0.mlp.linear_fc1.layer_norm_weight", "decoder.layers.0.mlp.linear_fc2.weight",
                              "decoder.layers.1.mlp.linear_fc2.weight", "decoder.layers.1.pre_mlp_layernorm.weight",
                              "embedding.word_embeddings.weight"}));
  // Stage 1 (ranks 2, 3): layers 2 and 3 (local 0 and 1), the output_layer copy.
  for (int r : {2, 3})
    EXPECT_EQ(Names(e, r), (V{"decoder.final_layernorm.weight", "decoder.layers.0.mlp.linear_fc2.weight",
                              "decoder.layers.0.pre_mlp_layernorm.weight", "decoder.layers.1.mlp.linear_fc2.weight",
                              "decoder.layers.1.pre_mlp_layernorm.weight", "output_layer.weight"}));
  // Both copies hold the same vocabulary rows of the one tensor.
  for (int r = 0; r < 4; ++r) {
    int found = 0;
    for (const Fragment& f : e.ranks[r].fragments) {
      if (m.tensors[f.tensor].name != "model.embed_tokens.weight") continue;
      ++found;
      EXPECT_EQ(f.box.lo[0], (r % 2) * 32);
      EXPECT_EQ(f.box.hi[0], (r % 2) * 32 + 32);
    }
    EXPECT_EQ(found, 1) << "rank " << r;
  }
}

TEST(NarrowedRules, CompilesAndValidatesBothWays) {
  for (bool to_megatron : {false, true}) {
    SCOPED_TRACE(to_megatron ? "hf -> megatron" : "megatron -> hf");
    std::vector<uint8_t> plan = testing::CompileJson(Data("model.json"), Data(to_megatron ? "infer.json" : "train.json"),
                                                     Data(to_megatron ? "train.json" : "infer.json"),
                                                     testing::TinyCluster());
    ValidateReport v = testing::ValidateBytes(plan);
    EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
  }
}

TEST(NarrowedRulesErrors, RangesThatOverlap) {
  json l = Data("train.json");
  l["buffers"][3]["range"]["layer"] = json::array({0, 4});
  EXPECT_EQ(ExpandError(l),
            "train.json: /buffers/3: tensor 'model.layers.{layer}.post_attention_layernorm.weight' is already part "
            "of /buffers/2, and their \"range\"/\"at\" do not keep them apart; buffer rules overlap");
}

TEST(NarrowedRulesErrors, RangesThatLeaveALayerOut) {
  json l = Data("train.json");
  l["buffers"][3]["range"]["layer"] = json::array({1, 3});
  EXPECT_EQ(ExpandError(l),
            "train.json: /buffers/2, /buffers/3: rank 2 holds 32 elements of "
            "'model.layers.{layer}.post_attention_layernorm.weight' and these rules name 16 of them; rules with "
            "\"range\" or \"at\" must together name every instance of a tensor on every rank that holds it");
}

TEST(NarrowedRulesErrors, ARangeWithNoInstanceOfItsTensor) {
  json m = Data("model.json");
  json l = Data("train.json");
  l["buffers"][2]["range"]["layer"] = json::array({0, 5});
  EXPECT_EQ(ExpandError(l), "train.json: /buffers/2/range/layer: expected [lo, hi] with 0 <= lo < hi <= 4, or a list of such intervals ([[0, 3], [4, 7]])");
  l["buffers"][2]["range"] = {{"expert", {0, 1}}};
  EXPECT_EQ(ExpandError(l), "train.json: /buffers/2/range/expert: "
                            "'model.layers.{layer}.post_attention_layernorm.weight' has no stack dim 'expert'");
}

TEST(NarrowedRulesErrors, AtOnAnAxisTheMeshLacks) {
  json l = Data("train.json");
  l["buffers"][1]["at"] = {{"dp", -1}};
  EXPECT_EQ(ExpandError(l), "train.json: /buffers/1/at/dp: 'dp' is not an axis of mesh 'dense', where the rule's parts "
                            "are placed");
  l["buffers"][1]["at"] = {{"pp", 2}};
  EXPECT_EQ(ExpandError(l), "train.json: /buffers/1/at/pp: position 2 is outside the axis of size 2");
}

TEST(NarrowedRulesErrors, BothCopiesOnTheSameStage) {
  json l = Data("train.json");
  l["buffers"][1]["at"] = {{"pp", 0}};  // the output_layer rule now also on stage 0
  EXPECT_EQ(ExpandError(l),
            "train.json: /buffers/1: tensor 'model.embed_tokens.weight' is already part of /buffers/0, and their "
            "\"range\"/\"at\" do not keep them apart; buffer rules overlap");
}

TEST(NarrowedRulesErrors, AnUnnarrowedRuleBesideANarrowedOne) {
  json l = Data("train.json");
  l["buffers"][1].erase("at");
  EXPECT_EQ(ExpandError(l), "train.json: /buffers/1/parts/0: tensor 'model.embed_tokens.weight' is already part of "
                            "/buffers/0; buffer rules overlap");
}

TEST(NarrowedRulesErrors, PlacementPositionListedTwice) {
  json l = Data("train.json");
  l["placements"][0]["pp"]["at"] = json::array({1, -1});
  EXPECT_EQ(ExpandError(l), "train.json: /placements/0/pp/at/1: position -1 is listed twice (as 1)");
  l["placements"][0]["pp"]["at"] = json::array();
  EXPECT_EQ(ExpandError(l), "train.json: /placements/0/pp/at: list at least one position");
  l["placements"][0]["pp"]["at"] = json::array({-3});
  EXPECT_EQ(ExpandError(l), "train.json: /placements/0/pp/at/0: expected an integer >= -2, got -3");
}

TEST(NarrowedRulesErrors, QuantizedNarrowedRule) {
  json l = Data("train.json");
  l["buffers"][4]["range"] = {{"layer", {0, 4}}};
  l["buffers"][4]["quant"] = {{"format", "fp8_e4m3"}, {"scale", "channel"},
                              {"scale_name", "decoder.layers.{layer.local}.mlp.linear_fc2.weight_scale"}};
  EXPECT_EQ(ExpandError(l), "train.json: /buffers/4/quant: a rule with \"range\" or \"at\" cannot be quantized; "
                            "quantize the whole tensor in one rule");
}

}  // namespace
}  // namespace reshard
