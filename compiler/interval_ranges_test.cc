// Tensor families that exist for separate intervals of a stack dim: a model
// "range" that lists several [lo, hi] (a hybrid model's linear-attention
// layers between its full-attention ones, Qwen3-Next; Llama 4's MoE layers
// between dense ones). Each interval is a piece of the family under the
// family's one name; placements, buffer rules (and their own "range" lists)
// apply to every piece, and layer names stay global or stage-local.
#include <gtest/gtest.h>

#include "compiler/expand.h"
#include "compiler/test.h"

namespace reshard {
namespace {

using nlohmann::json;

// Layers 0 and 2 linear attention (one tensor), 1 and 3 full attention (q, k
// fused by the training side), an MLP norm everywhere.
json Model() {
  return json::parse(R"({
    "format": "reshard.model/1", "name": "hybrid", "dtype": "bf16", "dims": {"layer": 4},
    "tensors": [
      {"name": "layers.{layer}.linear_attn.in_proj.weight", "shape": [32, 16], "range": {"layer": [[0, 1], [2, 3]]}},
      {"name": "layers.{layer}.self_attn.q.weight", "shape": [16, 16], "range": {"layer": [[1, 2], [3, 4]]}},
      {"name": "layers.{layer}.self_attn.k.weight", "shape": [8, 16], "range": {"layer": [[1, 2], [3, 4]]}},
      {"name": "layers.{layer}.norm.weight", "shape": [16]}
    ]})");
}

// PP2 x TP2, stage-local names, q and k fused; the norm under two names:
// "in_linear" on the linear layers, "in_full" on the others (a rule "range" list).
json Train() {
  return json::parse(R"({
    "format": "reshard.layout/1", "name": "train", "model": "hybrid", "ranks": 4,
    "meshes": {"m": [["pp", 2], ["tp", 2]]},
    "placements": [
      {"match": "layers.{layer}.norm.weight", "mesh": "m", "pp": {"shard": "layer"}},
      {"match": "*", "mesh": "m", "pp": {"shard": "layer"}, "tp": {"shard": 0}}
    ],
    "buffers": [
      {"name": "decoder.{layer.local}.mixer.in_proj", "tensor": "layers.{layer}.linear_attn.in_proj.weight"},
      {"name": "decoder.{layer.local}.qk", "parts": ["layers.{layer}.self_attn.q.weight", "layers.{layer}.self_attn.k.weight"], "concat": 0},
      {"name": "decoder.{layer.local}.in_linear", "tensor": "layers.{layer}.norm.weight", "range": {"layer": [[0, 1], [2, 3]]}},
      {"name": "decoder.{layer.local}.in_full", "tensor": "layers.{layer}.norm.weight", "range": {"layer": [[1, 2], [3, 4]]}}
    ]})");
}

json Hf() {
  return json::parse(R"({
    "format": "reshard.layout/1", "name": "hf", "model": "hybrid", "ranks": 1,
    "meshes": {"m": [["r", 1]]}, "placements": [{"match": "*", "mesh": "m"}]})");
}

std::vector<std::string> Names(const Expansion& e, int rank) {
  std::vector<std::string> out;
  for (const BufferDesc& b : e.ranks[rank].buffers) out.push_back(b.name);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Error(const json& model, const json& layout) {
  return testing::ErrorOf([&] {
    ModelSpec m = ParseModel(model, "model.json");
    LayoutSpec l = ParseLayout(layout, "train.json", m);
    Expand(m, l);
  });
}

TEST(IntervalRanges, EachIntervalIsAPieceOfOneName) {
  ModelSpec m = ParseModel(Model(), "model.json");
  ASSERT_EQ(m.tensors.size(), 7u);  // 2 + 2 + 2 pieces, and the norm
  EXPECT_EQ(m.tensors[1].name, m.tensors[0].name);
  EXPECT_EQ(m.tensors[0].lo[0], 0);
  EXPECT_EQ(m.tensors[0].hi[0], 1);
  EXPECT_EQ(m.tensors[1].lo[0], 2);
  EXPECT_EQ(m.tensors[1].hi[0], 3);
  // Bytes: linear 2 x 32 x 16, q 2 x 16 x 16, k 2 x 8 x 16, norm 4 x 16; bf16.
  EXPECT_EQ(m.total_bytes(), 2 * (2 * 32 * 16 + 2 * 16 * 16 + 2 * 8 * 16 + 4 * 16));
}

TEST(IntervalRanges, StagesHoldTheirLayersUnderLocalNames) {
  ModelSpec m = ParseModel(Model(), "model.json");
  LayoutSpec l = ParseLayout(Train(), "train.json", m);
  ASSERT_EQ(l.buffers.size(), 6u);  // each "range" list is one rule per interval
  Expansion e = Expand(m, l);
  using V = std::vector<std::string>;
  // Stage 0: layers 0 (linear) and 1 (full); stage 1: layers 2 (linear) and 3 (full), local 0 and 1.
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(Names(e, r), (V{"decoder.0.in_linear", "decoder.0.mixer.in_proj", "decoder.1.in_full", "decoder.1.qk"}))
        << "rank " << r;
  // The TP halves: in_proj rows 16 per rank; qk = q's 8 rows then k's 4.
  for (const BufferDesc& b : e.ranks[3].buffers) {  // both present: Names above
    if (b.name == "decoder.0.mixer.in_proj") {
      EXPECT_EQ(b.shape, (std::vector<int64_t>{16, 16}));
    } else if (b.name == "decoder.1.qk") {
      EXPECT_EQ(b.shape, (std::vector<int64_t>{12, 16}));
    }
  }
  // Rank 3 (stage 1) holds layer 2 of the linear family: the second piece.
  int found = 0;
  for (const Fragment& f : e.ranks[3].fragments)
    if (m.tensors[f.tensor].name == "layers.{layer}.linear_attn.in_proj.weight") {
      ++found;
      EXPECT_EQ(f.tensor, 1);
      EXPECT_EQ(f.box.lo[0], 2);
      EXPECT_EQ(f.box.lo[1], 16);
    }
  EXPECT_EQ(found, 1);
}

TEST(IntervalRanges, CompilesAndValidatesBothWays) {
  for (bool to_train : {false, true}) {
    SCOPED_TRACE(to_train ? "hf -> train" : "train -> hf");
    std::vector<uint8_t> plan = testing::CompileJson(Model(), to_train ? Hf() : Train(), to_train ? Train() : Hf(),
                                                     testing::TinyCluster());
    ValidateReport v = testing::ValidateBytes(plan);
    EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
  }
}

TEST(IntervalRangesErrors, IntervalsOutOfOrderOrOverlapping) {
  json m = Model();
  m["tensors"][0]["range"]["layer"] = json::array({json::array({2, 3}), json::array({0, 1})});
  EXPECT_EQ(testing::ErrorOf([&] { ParseModel(m, "model.json"); }),
            "model.json: /tensors/0/range/layer/1: [0, 1] overlaps or precedes [2, 3]: list intervals ascending and "
            "apart (touching ones as one)");
  m["tensors"][0]["range"]["layer"] = json::array({json::array({0, 2}), json::array({2, 3})});
  EXPECT_EQ(testing::ErrorOf([&] { ParseModel(m, "model.json"); }),
            "model.json: /tensors/0/range/layer/1: [2, 3] touches [0, 2]: list intervals ascending and apart "
            "(touching ones as one)");
  m["tensors"][0]["range"]["layer"] = json::array({json::array({0, 1}), json::array({3, 5})});
  EXPECT_EQ(testing::ErrorOf([&] { ParseModel(m, "model.json"); }),
            "model.json: /tensors/0/range/layer/1: expected [lo, hi] with 0 <= lo < hi <= 4, or a list of such "
            "intervals ([[0, 3], [4, 7]])");
}

TEST(IntervalRangesErrors, FusedPartsOfDifferentLayers) {
  json l = Train();
  l["buffers"][1]["parts"][1] = "layers.{layer}.linear_attn.in_proj.weight";
  l["buffers"].erase(0);
  EXPECT_EQ(Error(Model(), l),
            "train.json: /buffers/0/parts/1: parts 'layers.{layer}.self_attn.q.weight' and "
            "'layers.{layer}.linear_attn.in_proj.weight' exist for different instances (their model \"range\"s "
            "differ); a fused buffer joins tensors of the same layers");
}

TEST(IntervalRangesErrors, RuleRangeOutsideEveryPiece) {
  json l = Train();
  l["buffers"][0]["range"] = {{"layer", json::array({1, 2})}};
  EXPECT_EQ(Error(Model(), l),
            "train.json: /buffers/0/range/layer: [1, 2] holds no instance of "
            "'layers.{layer}.linear_attn.in_proj.weight', which the model declares for other 'layer's");
}


TEST(IntervalRangesErrors, StackingSeparateIntervalsIntoOneBuffer) {
  json l = Hf();
  l["buffers"] = json::array({{{"name", "in_proj_stacked"}, {"tensor", "layers.{layer}.linear_attn.in_proj.weight"}}});
  l["default_buffers"] = true;
  EXPECT_EQ(Error(Model(), l),
            "train.json: /buffers/0/name: buffer 'in_proj_stacked' stacks the 'layer' instances of "
            "'layers.{layer}.linear_attn.in_proj.weight', which exists for separate intervals of 'layer' (its model "
            "\"range\"): name each instance ({layer} or {layer.local} in the buffer's name)");
}

}  // namespace
}  // namespace reshard
