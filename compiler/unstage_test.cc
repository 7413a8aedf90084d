// Unstage (compiler/route_unstage.cc): where a GPU's HBM, not its links,
// sets the refit's pace, a staged piece that spans layer buffers goes as one
// message per layer - unstaged where each layer's slice is contiguous on
// both ends, staged at one end only where it is contiguous on the other -
// and the plan still delivers every element (`run --local`). Where the
// links bind, nothing changes.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "compiler/init_test_util.h"
#include "compiler/test.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using nlohmann::json;

// A small Qwen3-MoE whose attention is wide enough for layer slices of at
// least kMinDirectSlice (q_proj 4096 x 2048: 2 MiB of each layer per GPU
// under FSDP2 on 8), trained and served on the same 8 GPUs.
struct Specs {
  json model, train, infer;
};
Specs Wide(const std::string& train) {
  json config = init::fixtures::Tiny("qwen3_moe");
  config.update({{"hidden_size", 2048}, {"num_hidden_layers", 2}, {"num_attention_heads", 16}, {"head_dim", 128},
                 {"num_key_value_heads", 4}, {"vocab_size", 256}, {"moe_intermediate_size", 64}});
  const init::Result r = init::fixtures::Gen(config, train, "vllm:tp=2,dp=4");
  return {init::fixtures::File(r, "model.json"), init::fixtures::File(r, "train.json"),
          init::fixtures::File(r, "infer.json")};
}

// Colocated on one NVLink domain; HBM at `hbm_GBps` (H100: 3350; at 20 GB/s
// the GPUs' copies, packs and unpacks take longer than NVLink's bytes).
json Colocated(double hbm_GBps) {
  json c = testing::TinyCluster(8);
  c["placement"] = "colocated";
  c["hbm_GBps"] = hbm_GBps;
  return c;
}

// The plan's messages by form: each send paired with its receive (the k-th
// message from a to b on both ends), by whether each end is a buffer or staging.
struct Forms {
  int both_staged = 0, both_direct = 0, packed_only = 0, unpacked_only = 0;
  int packed_only_sources = 0;  // distinct (rank, round, staging offset) the packed-only messages are sent from
  uint64_t pack_bytes = 0, unpack_bytes = 0;
};
Forms FormsOf(const std::vector<uint8_t>& bytes) {
  Plan plan = Plan::from_bytes(bytes, "p.rsplan");
  struct Send {
    bool direct;
    std::tuple<uint32_t, uint32_t, uint64_t> from;  // rank, round, staging offset
  };
  std::map<std::pair<uint32_t, uint32_t>, std::vector<Send>> sends;
  std::map<std::pair<uint32_t, uint32_t>, std::vector<bool>> received_direct;
  Forms f;
  for (uint32_t g = 0; g < plan.num_ranks(); ++g) {
    const fb::Program& p = plan.program(g);
    uint32_t round = 0;
    for (uint32_t i = 0; i < p.steps()->size(); ++i) {
      while (round + 1 < p.round_begin()->size() && p.round_begin()->Get(round + 1) <= i) ++round;
      const fb::Step* s = p.steps()->Get(i);
      if (s->kind() == fb::StepKind::send) sends[{g, s->peer()}].push_back({s->src() != kNone, {g, round, s->staging()}});
      if (s->kind() == fb::StepKind::recv) received_direct[{s->peer(), g}].push_back(s->dst() != kNone);
      if (s->kind() == fb::StepKind::pack) f.pack_bytes += s->bytes();
      if (s->kind() == fb::StepKind::unpack) f.unpack_bytes += s->bytes();
    }
  }
  std::set<std::tuple<uint32_t, uint32_t, uint64_t>> packed_only_from;
  for (const auto& [pair, out] : sends) {
    const std::vector<bool>& recvs = received_direct[pair];
    EXPECT_EQ(out.size(), recvs.size()) << pair.first << " -> " << pair.second;
    for (size_t k = 0; k < std::min(out.size(), recvs.size()); ++k) {
      if (out[k].direct && recvs[k]) ++f.both_direct;
      if (!out[k].direct && !recvs[k]) ++f.both_staged;
      if (!out[k].direct && recvs[k]) ++f.packed_only, packed_only_from.insert(out[k].from);
      if (out[k].direct && !recvs[k]) ++f.unpacked_only;
    }
  }
  f.packed_only_sources = static_cast<int>(packed_only_from.size());
  return f;
}

// Runs the plan over Gloo, one process per GPU, and checks every destination element.
void ExpectExact(const std::vector<uint8_t>& bytes) {
  testing::TempDir dir;
  testing::WriteFile(dir.File("p.rsplan"), bytes);
  const std::string cmd = std::string(RESHARD_BINARY) + " run " + dir.File("p.rsplan") + " --local --json";
  testing::ShellResult run = testing::Shell("(" + cmd + " 2>/dev/null)");  // stdout only: the JSON
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json j = json::parse(run.out);
  EXPECT_GT(j["checked"].get<uint64_t>(), 90000000u) << run.out;
  EXPECT_EQ(j["wrong"].get<uint64_t>(), 0u) << run.out;
}

// FSDP2 holds dim-0 chunks of each layer's weights, vLLM TP2 the halves of
// the fused qkv_proj (rows) and of o_proj (columns). With HBM binding, each
// layer's q/k/v chunk goes straight from buffer to buffer, and o_proj's
// chunk (half of each row: strided at the sender, one run at the receiver)
// is packed once and received straight into the buffers of every rank that
// holds that half.
TEST(Unstage, WhereHbmBindsLayersGoStraightFromFsdp2Chunks) {
  const Specs s = Wide("fsdp2:dp_shard=8,master=bf16");
  const std::vector<uint8_t> slow = testing::CompileJson(s.model, s.train, s.infer, Colocated(20));
  const std::vector<uint8_t> fast = testing::CompileJson(s.model, s.train, s.infer, Colocated(3350));
  for (const auto* bytes : {&slow, &fast}) {
    ValidateReport v = testing::ValidateBytes(*bytes);
    EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
  }
  const Forms f = FormsOf(slow), g = FormsOf(fast);
  EXPECT_GT(f.both_direct, g.both_direct);
  EXPECT_GT(f.packed_only, 0);
  // Each o_proj slice is packed once for all the ranks of a TP group that
  // want it (3 or 4 of the 8: one pack, several messages).
  EXPECT_GE(f.packed_only, 3 * f.packed_only_sources);
  // Links bind on the fast GPUs: every message stays as it was, whole.
  EXPECT_EQ(g.packed_only + g.unpacked_only, 0);
  EXPECT_LT(f.pack_bytes * 3, g.pack_bytes);
  EXPECT_LT(f.unpack_bytes * 10, g.unpack_bytes);
  ExpectExact(slow);
}

// Megatron TP4 holds o_proj's column quarters (one run each); vLLM TP2 its
// column halves, where a quarter is strided: sent straight from the buffer,
// received into staging and unpacked there.
TEST(Unstage, WhereHbmBindsQuartersGoStraightFromMegatronBuffers) {
  const Specs s = Wide("megatron:tp=4,dp=2");
  const std::vector<uint8_t> slow = testing::CompileJson(s.model, s.train, s.infer, Colocated(20));
  ValidateReport v = testing::ValidateBytes(slow);
  EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
  const Forms f = FormsOf(slow);
  EXPECT_GT(f.unpacked_only, 0);
  EXPECT_GT(f.both_direct, 0);
  ExpectExact(slow);
}

}  // namespace
}  // namespace reshard
