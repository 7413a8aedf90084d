// A fused buffer of blocks ("interleave": {"dim", "groups", "blocks": [{"parts",
// "groups"}, ...]}): in each outer group, runs of parts one after another,
// each run interleaving its parts in its own groups. vLLM's gated
// attention (Qwen3-Next) holds qkv_proj as, per rank, each of its heads'
// query rows then that head's gate rows, then its k rows, then its v rows;
// Megatron holds the same four tensors interleaved per query group.
#include <gtest/gtest.h>

#include "compiler/expand.h"
#include "compiler/test.h"

namespace reshard {
namespace {

using nlohmann::json;

// 4 heads of 2 rows (query and gate each), 2 KV heads of 2 rows.
json Model() {
  return json::parse(R"({
    "format": "reshard.model/1", "name": "gated", "dtype": "bf16", "dims": {},
    "tensors": [
      {"name": "query", "shape": [8, 3], "heads": {"dim": 0, "size": 2}},
      {"name": "gate", "shape": [8, 3], "heads": {"dim": 0, "size": 2}},
      {"name": "k", "shape": [4, 3], "heads": {"dim": 0, "size": 2}},
      {"name": "v", "shape": [4, 3], "heads": {"dim": 0, "size": 2}}
    ]})");
}

// vLLM TP2: qkv_proj = [per head: query, gate; k; v] of the rank's heads.
json Vllm() {
  return json::parse(R"({
    "format": "reshard.layout/1", "name": "vllm", "model": "gated", "ranks": 2,
    "meshes": {"m": [["tp", 2]]}, "placements": [{"match": "*", "mesh": "m", "tp": {"shard": 0}}],
    "buffers": [{"name": "qkv_proj", "parts": ["query", "gate", "k", "v"],
                 "interleave": {"dim": 0, "blocks": [{"parts": 2, "groups": 4}, {"parts": 1}, {"parts": 1}]}}]})");
}

// Megatron TP1: per KV group [its 2 heads' queries; their gates; k; v].
json Megatron() {
  return json::parse(R"({
    "format": "reshard.layout/1", "name": "megatron", "model": "gated", "ranks": 1,
    "meshes": {"m": [["tp", 1]]}, "placements": [{"match": "*", "mesh": "m"}],
    "buffers": [{"name": "linear_qkv", "parts": ["query", "gate", "k", "v"], "interleave": {"dim": 0, "groups": 2}}]})");
}

// The buffer row each row of `tensor` lands in on `rank`.
std::map<int64_t, int64_t> Rows(const ModelSpec& m, const Expansion& e, int rank, const std::string& tensor) {
  std::map<int64_t, int64_t> rows;
  for (const Fragment& f : e.ranks[rank].fragments) {
    if (m.tensors[f.tensor].name != tensor) continue;
    for (int64_t row = f.box.lo[0]; row < f.box.hi[0]; ++row) {
      Box one = f.box;
      one.lo[0] = row;
      one.hi[0] = row + 1;
      rows[row] = static_cast<int64_t>(f.RegionOf(one).offset) / 3;  // 3 elements per buffer row
    }
  }
  return rows;
}

TEST(InterleaveParts, HeadsQueryThenGateThenKThenV) {
  ModelSpec m = ParseModel(Model(), "model.json");
  LayoutSpec l = ParseLayout(Vllm(), "infer.json", m);
  Expansion e = Expand(m, l);
  using M = std::map<int64_t, int64_t>;
  // Rank 1 holds heads 2, 3 and KV head 1: rows [q2 q2 g2 g2 q3 q3 g3 g3 k1 k1 v1 v1].
  EXPECT_EQ(Rows(m, e, 1, "query"), (M{{4, 0}, {5, 1}, {6, 4}, {7, 5}}));
  EXPECT_EQ(Rows(m, e, 1, "gate"), (M{{4, 2}, {5, 3}, {6, 6}, {7, 7}}));
  EXPECT_EQ(Rows(m, e, 1, "k"), (M{{2, 8}, {3, 9}}));
  EXPECT_EQ(Rows(m, e, 1, "v"), (M{{2, 10}, {3, 11}}));
  ASSERT_EQ(e.ranks[1].buffers.size(), 1u);
  EXPECT_EQ(e.ranks[1].buffers[0].shape, (std::vector<int64_t>{12, 3}));
}

TEST(InterleaveParts, CompilesAndValidatesIntoMegatronsGroups) {
  for (bool to_vllm : {false, true}) {
    SCOPED_TRACE(to_vllm ? "megatron -> vllm" : "vllm -> megatron");
    std::vector<uint8_t> plan = testing::CompileJson(Model(), to_vllm ? Megatron() : Vllm(),
                                                     to_vllm ? Vllm() : Megatron(), testing::TinyCluster());
    ValidateReport v = testing::ValidateBytes(plan);
    EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
  }
}

// Megatron's Llama 4 linear_qkv: per query group, the group's q rows then k
// then v, with q and k in HF's interleaved-RoPE row order while the model
// spec holds each head's rows as vLLM does (first halves, second halves):
// blocks of one-row groups inside outer groups.
TEST(InterleaveParts, OneRowGroupsInsideOuterGroups) {
  json model = json::parse(R"({
    "format": "reshard.model/1", "name": "rope", "dtype": "bf16", "dims": {},
    "tensors": [
      {"name": "q_first", "shape": [4, 3]}, {"name": "q_second", "shape": [4, 3]},
      {"name": "k_first", "shape": [2, 3]}, {"name": "k_second", "shape": [2, 3]},
      {"name": "v", "shape": [4, 3]}
    ]})");
  // 2 groups: per group 2 q rows of each half (one head of 4), 1 of each k half, 2 v rows.
  json l = json::parse(R"({
    "format": "reshard.layout/1", "name": "m", "model": "rope", "ranks": 2,
    "meshes": {"m": [["tp", 2]]}, "placements": [{"match": "*", "mesh": "m", "tp": {"shard": 0}}],
    "buffers": [{"name": "qkv", "parts": ["q_first", "q_second", "k_first", "k_second", "v"],
                 "interleave": {"dim": 0, "groups": 2, "blocks": [{"parts": 2, "groups": 2}, {"parts": 2}, {"parts": 1}]}}]})");
  ModelSpec m = ParseModel(model, "model.json");
  Expansion e = Expand(m, ParseLayout(l, "m.json", m));
  using M = std::map<int64_t, int64_t>;
  // Rank 1 holds group 1: [q_first 2, q_second 2, q_first 3, q_second 3, k_first 1, k_second 1, v 2, v 3].
  EXPECT_EQ(Rows(m, e, 1, "q_first"), (M{{2, 0}, {3, 2}}));
  EXPECT_EQ(Rows(m, e, 1, "q_second"), (M{{2, 1}, {3, 3}}));
  EXPECT_EQ(Rows(m, e, 1, "k_first"), (M{{1, 4}}));
  EXPECT_EQ(Rows(m, e, 1, "k_second"), (M{{1, 5}}));
  EXPECT_EQ(Rows(m, e, 1, "v"), (M{{2, 6}, {3, 7}}));
  // Whole on one rank: both groups, each [q..., k..., v...].
  l["ranks"] = 1;
  l["meshes"]["m"] = json::array({json::array({"tp", 1})});
  l["placements"][0].erase("tp");
  Expansion one = Expand(m, ParseLayout(l, "m.json", m));
  EXPECT_EQ(Rows(m, one, 0, "q_first"), (M{{0, 0}, {1, 2}, {2, 8}, {3, 10}}));
  EXPECT_EQ(Rows(m, one, 0, "v"), (M{{0, 6}, {1, 7}, {2, 14}, {3, 15}}));
  std::vector<uint8_t> plan = testing::CompileJson(model, l, json::parse(R"({
    "format": "reshard.layout/1", "name": "hf", "model": "rope", "ranks": 1,
    "meshes": {"m": [["r", 1]]}, "placements": [{"match": "*", "mesh": "m"}]})"), testing::TinyCluster());
  EXPECT_TRUE(testing::ValidateBytes(plan).ok());
}

TEST(InterleaveParts, BlocksMustTakeEveryPartAndWholeGroups) {
  auto error = [](const json& l) {
    return testing::ErrorOf([&] {
      ModelSpec m = ParseModel(Model(), "model.json");
      Expand(m, ParseLayout(l, "infer.json", m));
    });
  };
  json l = Vllm();
  l["buffers"][0]["interleave"]["blocks"][0]["parts"] = 3;
  EXPECT_EQ(error(l), "infer.json: /buffers/0/interleave/blocks: the blocks take 5 parts, the rule has 4");
  l = Vllm();
  l["buffers"][0]["interleave"]["blocks"][0]["groups"] = 3;
  EXPECT_EQ(error(l), "infer.json: /buffers/0/interleave/blocks/0: a group of 'query' (8 rows) is not 3 equal groups");
  l = Vllm();
  l["buffers"][0]["interleave"]["blocks"] = json::array();
  EXPECT_EQ(error(l), "infer.json: /buffers/0/interleave/blocks: list at least one block");
}

}  // namespace
}  // namespace reshard
