// Colocated clusters (inference rank i on the GPU of training rank i): what a
// GPU already holds is copied there, never sent, and names both frameworks
// use on one GPU (HF names on an FSDP2 trainer and in vLLM) get a side each
// in the plan, train:NAME and infer:NAME, with nothing renamed by the user.
#include <gtest/gtest.h>

#include <set>

#include "compiler/init_test_util.h"
#include "compiler/test.h"
#include "runtime/plan.h"

namespace reshard {
namespace {

using nlohmann::json;

json Colocated() {
  json c = testing::TinyCluster(4);
  c["placement"] = "colocated";
  return c;
}

// A tiny Qwen3 trained under FSDP2 (HF names, dim-0 chunks) on 4 GPUs and
// served by vLLM TP2 x DP2 (fused qkv_proj / gate_up_proj, HF names for the
// norms and o_proj) on the same 4.
struct Specs {
  json model, train, infer;
};
Specs Qwen3(const std::string& train, const std::string& infer) {
  const init::Result r = init::fixtures::Gen(init::fixtures::Tiny("qwen3"), train, infer);
  return {init::fixtures::File(r, "model.json"), init::fixtures::File(r, "train.json"),
          init::fixtures::File(r, "infer.json")};
}

std::set<std::string> Names(const Plan& plan, uint32_t rank) {
  std::set<std::string> out;
  const fb::Program& p = plan.program(rank);
  for (const fb::Buffer* b : *p.buffers()) out.insert(b->name()->str());
  return out;
}

TEST(Colocated, NamesBothSidesUseGetASideEach) {
  const Specs s = Qwen3("fsdp2:dp_shard=4,master=bf16", "vllm:tp=2,dp=2");
  std::vector<uint8_t> bytes = testing::CompileJson(s.model, s.train, s.infer, Colocated());
  ValidateReport v = testing::ValidateBytes(bytes);
  EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
  Plan plan = Plan::from_bytes(bytes, "p.rsplan");
  const std::set<std::string> n = Names(plan, 0);
  // Both hold model.norm.weight (FSDP2 its chunk, vLLM all of it); vLLM's fused qkv_proj is its own.
  EXPECT_TRUE(n.count("train:model.norm.weight"));
  EXPECT_TRUE(n.count("infer:model.norm.weight"));
  EXPECT_FALSE(n.count("model.norm.weight"));
  EXPECT_TRUE(n.count("model.layers.0.self_attn.qkv_proj.weight"));
  EXPECT_TRUE(n.count("model.layers.0.self_attn.q_proj.weight"));  // FSDP2's, which vLLM does not name
}

TEST(Colocated, WhatAGpuHoldsIsCopiedNotSent) {
  // Megatron TP2 x DP2 and vLLM TP2 x DP2 on the same 4 GPUs: every GPU holds
  // exactly its inference shard already (same TP cut), so nothing crosses a link.
  const Specs s = Qwen3("megatron:tp=2,dp=2", "vllm:tp=2,dp=2");
  std::vector<uint8_t> bytes = testing::CompileJson(s.model, s.train, s.infer, Colocated());
  EXPECT_TRUE(testing::ValidateBytes(bytes).ok());
  Plan plan = Plan::from_bytes(bytes, "p.rsplan");
  // Each TP shard has two replicas (DP 2); the one on the receiver's own GPU
  // is taken (before: 425,984 bytes over NVLink from the other replica).
  EXPECT_EQ(plan.root().total_net_bytes(), 0u);
  EXPECT_EQ(plan.root().total_nvlink_bytes(), 0u);
}

TEST(Colocated, GatherCopiesWhatAGpuHoldsToo) {
  // The gather baseline on the same GPUs: each GPU's own replica covers its
  // whole inference shard, so it copies and nothing is gathered or chained.
  const Specs s = Qwen3("megatron:tp=2,dp=2", "vllm:tp=2,dp=2");
  std::vector<uint8_t> bytes = testing::CompileJson(s.model, s.train, s.infer, Colocated(), "gather");
  ValidateReport v = testing::ValidateBytes(bytes);
  EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
  Plan plan = Plan::from_bytes(bytes, "p.rsplan");
  EXPECT_EQ(plan.root().total_net_bytes(), 0u);
  EXPECT_EQ(plan.root().total_nvlink_bytes(), 0u);
}

TEST(Colocated, GatherOwnsWhereTheChunkIsNeeded) {
  // TP2 training into TP1 inference on the same 2 GPUs: GPU 0 serves rank 0
  // and holds half of every TP-split tensor. The owner that gathers a chunk
  // is a GPU that needs it, so only the other half crosses: at most half of
  // the TP-split bytes, where an owner that does not need the chunk would
  // also send it whole down the chain.
  const Specs s = Qwen3("megatron:tp=2", "vllm:tp=1");
  json c = testing::TinyCluster(2);
  c["placement"] = "colocated";
  std::vector<uint8_t> gather = testing::CompileJson(s.model, s.train, s.infer, c, "gather");
  std::vector<uint8_t> direct = testing::CompileJson(s.model, s.train, s.infer, c, "direct");
  ValidateReport v = testing::ValidateBytes(gather);
  EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
  Plan g = Plan::from_bytes(gather, "g.rsplan"), d = Plan::from_bytes(direct, "d.rsplan");
  EXPECT_GT(d.root().total_nvlink_bytes(), 0u);
  // Every byte GPU 0 lacks comes from GPU 1, in both strategies.
  EXPECT_EQ(g.root().total_nvlink_bytes() + g.root().total_net_bytes(), d.root().total_nvlink_bytes());
}

}  // namespace
}  // namespace reshard
