// DTensor / FSDP2 cuts in reshard.layout/1 (issue 30): `"split": "chunk"`
// (torch.chunk sizes, trailing ranks short or empty), empty shards as
// zero-size buffers, `"order"` (TP cuts before FSDP: _StridedShard), a
// layout-wide `"dtype"`, a fused buffer chunked as a whole, and the errors.
#include <gtest/gtest.h>

#include "compiler/expand.h"
#include "compiler/test.h"

namespace reshard {
namespace {

using nlohmann::json;
using testing::ErrorOf;

json Model() {
  return json::parse(R"({"format": "reshard.model/1", "name": "m", "dtype": "bf16", "dims": {"layer": 1, "expert": 3},
    "tensors": [
      {"name": "w", "shape": [250, 4]},
      {"name": "norm", "shape": [3]},
      {"name": "q", "shape": [101, 4]},
      {"name": "e.{expert}.gate", "shape": [5, 4]},
      {"name": "e.{expert}.up", "shape": [5, 4]}]})");
}

Expansion ExpandJson(const json& layout) {
  ModelSpec m = ParseModel(Model(), "model.json");
  return Expand(m, ParseLayout(layout, "train.json", m));
}

json Layout(int64_t ranks, json meshes, json placements, json buffers = json::array()) {
  return {{"format", "reshard.layout/1"}, {"name", "l"},       {"ranks", ranks},
          {"meshes", meshes},             {"placements", placements}, {"default_buffers", true},
          {"buffers", buffers}};
}

// Shape of buffer `name` on `rank`; {-1} when the rank has no such buffer.
std::vector<int64_t> ShapeOf(const Expansion& e, int rank, const std::string& name) {
  for (const BufferDesc& b : e.ranks[rank].buffers)
    if (b.name == name) return b.shape;
  return {-1};
}

const json kFsdp4 = json::parse(R"({"fsdp": [["dp_shard", 4]]})");
const json kFsdp2Tp2 = json::parse(R"({"fsdp": [["dp_shard", 2], ["tp", 2]]})");

TEST(ChunkSplit, TorchChunkSizesWithEmptyTrailingShards) {
  Expansion e = ExpandJson(Layout(4, kFsdp4, {{{"match", "*"}, {"dp_shard", {{"shard", 0}, {"split", "chunk"}}}}}));
  // 250 rows over 4: chunks of 63 (torch.chunk), the last one 61.
  std::vector<std::vector<int64_t>> w, norm;
  for (int r = 0; r < 4; ++r) w.push_back(ShapeOf(e, r, "w")), norm.push_back(ShapeOf(e, r, "norm"));
  EXPECT_EQ(w, (std::vector<std::vector<int64_t>>{{63, 4}, {63, 4}, {63, 4}, {61, 4}}));
  // 3 over 4: 1, 1, 1 and an empty shard that is still a (zero-size) buffer, as FSDP2 holds it.
  EXPECT_EQ(norm, (std::vector<std::vector<int64_t>>{{1}, {1}, {1}, {0}}));
  // 5 rows: chunks of 2 (2, 2, 1, 0).
  EXPECT_EQ(ShapeOf(e, 2, "e.1.gate"), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(ShapeOf(e, 3, "e.1.gate"), (std::vector<int64_t>{0, 4}));
  // A stack dim: 3 experts over 4 ranks, the last holds none. Buffers named
  // per expert do not exist there; a buffer that keeps the experts as its
  // leading dim is [0, 5, 4], like transformers' fused experts under FSDP2.
  json by_expert = Layout(4, kFsdp4, {{{"match", "e.*"}, {"dp_shard", {{"shard", "expert"}, {"split", "chunk"}}}},
                                      {{"match", "*"}}},
                          {{{"name", "gate"}, {"tensor", "e.{expert}.gate"}}});
  Expansion x = ExpandJson(by_expert);
  EXPECT_EQ(ShapeOf(x, 2, "gate"), (std::vector<int64_t>{1, 5, 4}));
  EXPECT_EQ(ShapeOf(x, 3, "gate"), (std::vector<int64_t>{0, 5, 4}));
  EXPECT_EQ(ShapeOf(x, 2, "e.2.up"), (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(ShapeOf(x, 3, "e.2.up"), std::vector<int64_t>{-1});
}

TEST(ChunkSplit, EvenSplitStillRefusesWhatDoesNotDivide) {
  const std::string err =
      ErrorOf([] { ExpandJson(Layout(4, kFsdp4, {{{"match", "*"}, {"dp_shard", {{"shard", 0}}}}})); });
  EXPECT_NE(err.find("does not divide evenly over 4 positions of axis 'dp_shard'"), std::string::npos) << err;
  EXPECT_NE(err.find("\"split\": \"chunk\""), std::string::npos) << err;
}

TEST(ChunkSplit, OrderCutsTpFirstThenFsdp) {
  const json meshes = kFsdp2Tp2;
  const json tp_then_dp = {{"match", "q"},
                           {"tp", {{"shard", 0}, {"split", "chunk"}}},
                           {"dp_shard", {{"shard", 0}, {"split", "chunk"}}},
                           {"order", {"tp", "dp_shard"}}};
  const json dp_then_tp = {{"match", "q"},
                           {"tp", {{"shard", 0}, {"split", "chunk"}}},
                           {"dp_shard", {{"shard", 0}, {"split", "chunk"}}}};
  const json rest = {{"match", "*"}};
  // 101 rows: TP first 51 | 50, then FSDP 26 | 25 and 25 | 25. Rank = dp * 2 + tp.
  Expansion a = ExpandJson(Layout(4, meshes, {tp_then_dp, rest}));
  EXPECT_EQ(ShapeOf(a, 0, "q"), (std::vector<int64_t>{26, 4}));
  EXPECT_EQ(ShapeOf(a, 1, "q"), (std::vector<int64_t>{25, 4}));
  EXPECT_EQ(ShapeOf(a, 2, "q"), (std::vector<int64_t>{25, 4}));
  EXPECT_EQ(ShapeOf(a, 3, "q"), (std::vector<int64_t>{25, 4}));
  // Mesh order: FSDP first 51 | 50, then TP 26 | 25 and 25 | 25: rank 1 gets 25 rows either way,
  // but which rows differ. TP first, rank 1 (dp 0, tp 1) holds rows 51..76; mesh order, rows 26..51.
  Expansion b = ExpandJson(Layout(4, meshes, {dp_then_tp, rest}));
  auto first_row = [](const Expansion& e, int rank) {
    for (const Fragment& f : e.ranks[rank].fragments)
      if (e.ranks[rank].buffers[f.buffer].name == "q") return f.box.lo[0];
    return int64_t{-1};
  };
  EXPECT_EQ(first_row(a, 1), 51);
  EXPECT_EQ(first_row(b, 1), 26);
  EXPECT_EQ(first_row(a, 2), 26);
  EXPECT_EQ(first_row(b, 2), 51);
}

TEST(ChunkSplit, LayoutDtypeAppliesToEveryBufferWithoutItsOwn) {
  json l = Layout(4, kFsdp4, {{{"match", "*"}, {"dp_shard", {{"shard", 0}, {"split", "chunk"}}}}},
                  {{{"name", "qq"}, {"tensor", "q"}, {"dtype", "bf16"}}});
  l["dtype"] = "fp32";
  Expansion e = ExpandJson(l);
  for (const BufferDesc& b : e.ranks[0].buffers) EXPECT_EQ(b.dtype, b.name == "qq" ? Dtype::bf16 : Dtype::fp32) << b.name;
}

TEST(ChunkSplit, FusedBufferChunkedAsAWhole) {
  const json rule = {{"name", "gate_up"},
                     {"parts", {"e.{expert}.gate", "e.{expert}.up"}},
                     {"concat", 0},
                     {"shard", {{"axis", "dp_shard"}, {"split", "chunk"}}}};
  Expansion e = ExpandJson(Layout(4, kFsdp4, {{{"match", "*"}}}, json::array({rule})));
  // [3 experts, 10 rows (gate then up), 4]: the 10 rows chunked 3, 3, 3, 1.
  EXPECT_EQ(ShapeOf(e, 0, "gate_up"), (std::vector<int64_t>{3, 3, 4}));
  EXPECT_EQ(ShapeOf(e, 3, "gate_up"), (std::vector<int64_t>{3, 1, 4}));
  // The plain axis name still means an even cut, which 10 rows over 4 is not.
  json even = rule;
  even["shard"] = "dp_shard";
  const std::string err = ErrorOf([&] { ExpandJson(Layout(4, kFsdp4, {{{"match", "*"}}}, json::array({even}))); });
  EXPECT_NE(err.find("does not divide evenly over 4 positions of axis 'dp_shard'"), std::string::npos) << err;
}

TEST(ChunkSplit, BadInputIsNamed) {
  auto err = [](const json& placement) {
    return ErrorOf([&] {
      ExpandJson(Layout(4, kFsdp2Tp2, {placement, {{"match", "*"}}}));
    });
  };
  EXPECT_EQ(err({{"match", "w"}, {"tp", {{"shard", 0}, {"split", "chunks"}}}}),
            "train.json: /placements/0/tp/split: unknown split 'chunks', expected 'even' (the dim divides evenly) or "
            "'chunk' (torch.chunk: chunks of ceil(size / positions), the last ones short or empty); did you mean "
            "'chunk'?");
  EXPECT_EQ(err({{"match", "w"}, {"tp", {{"shard", 0}, {"split", "chunk"}, {"sizes", {100, 150}}}}}),
            "train.json: /placements/0/tp/split: \"split\" applies to an even cut or to \"blocks\", not to \"sizes\", "
            "\"parts\", \"cyclic\" or \"assign\", which say where every index goes");
  EXPECT_EQ(err({{"match", "w"}, {"tp", {{"shard", 0}}}, {"order", {"pp"}}}),
            "train.json: /placements/0/order/0: 'pp' is not an axis of mesh 'fsdp'; did you mean 'tp'?");
  EXPECT_EQ(err({{"match", "w"}, {"tp", {{"shard", 0}}}, {"order", {"dp_shard"}}}),
            "train.json: /placements/0/order/0: axis 'dp_shard' does not shard this placement; \"order\" lists the "
            "axes that cut the tensor");
  EXPECT_EQ(err({{"match", "w"}, {"tp", {{"shard", 0}}}, {"dp_shard", {{"shard", 1}}}, {"order", {"tp"}}}),
            "train.json: /placements/0/order: axis 'dp_shard' shards this placement but is not listed; list every "
            "axis that cuts the tensor, in the order they cut it");
  EXPECT_EQ(err({{"match", "w"}, {"tp", {{"shard", 0}}}, {"order", {"tp", "tp"}}}),
            "train.json: /placements/0/order/1: axis 'tp' is listed twice");
  const std::string dtype = ErrorOf([] {
    json l = Layout(4, kFsdp4, {{{"match", "*"}}});
    l["dtype"] = "float32";
    ExpandJson(l);
  });
  EXPECT_NE(dtype.find("train.json: /dtype: unknown dtype 'float32'"), std::string::npos) << dtype;
}

}  // namespace
}  // namespace reshard
