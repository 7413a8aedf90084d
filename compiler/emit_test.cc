// Pass 5 (emit.cc): programs packed (schema 2) and read back by Plan::program.
#include <gtest/gtest.h>

#include <cstring>

#include "compiler/test.h"
#include "runtime/error.h"
#include "runtime/plan.h"

namespace reshard {
namespace {

TEST(Emit, ProgramsArePackedAndReadBackWhole) {
  // Schema 2: each rank's program is a zstd frame of its own FlatBuffer;
  // the plan's table keeps only the rank and its sides.
  std::vector<uint8_t> bytes =
      testing::CompileJson(testing::LoadSample("tiny-moe/model.json"), testing::LoadSample("tiny-moe/train.json"),
                           testing::LoadSample("tiny-moe/infer-ep.json"), testing::TinyCluster());
  Plan plan = Plan::from_bytes(bytes, "p.rsplan");
  EXPECT_EQ(plan.root().schema_version(), 2u);
  size_t steps = 0;
  for (uint32_t r : plan.active_ranks()) {
    const fb::Program* outer = plan.root().programs()->Get(r);
    ASSERT_NE(outer->packed(), nullptr) << "rank " << r;
    EXPECT_EQ(outer->steps(), nullptr);
    EXPECT_EQ(outer->buffers(), nullptr);
    const fb::Program& p = plan.program(r);
    EXPECT_EQ(p.rank(), r);
    EXPECT_EQ(p.src_rank(), outer->src_rank());
    EXPECT_EQ(p.dst_rank(), outer->dst_rank());
    EXPECT_EQ(p.packed(), nullptr);
    ASSERT_NE(p.buffers(), nullptr);
    steps += p.steps() ? p.steps()->size() : 0;
    EXPECT_EQ(&plan.program(r), &p);  // decompressed once, kept
  }
  EXPECT_GT(steps, 0u);
  ValidateReport v = testing::ValidateBytes(bytes);
  EXPECT_TRUE(v.ok()) << (v.errors.empty() ? "" : v.errors[0]);
}

TEST(Emit, ADamagedPackedProgramIsANamedError) {
  std::vector<uint8_t> good =
      testing::CompileJson(testing::LoadSample("tiny-dense/model.json"), testing::LoadSample("tiny-dense/train.json"),
                           testing::LoadSample("tiny-dense/infer.json"), testing::TinyCluster());
  const fb::Plan* root = fb::GetPlan(good.data());
  const uint32_t r = root->num_ranks() - 1;
  const flatbuffers::Vector<uint8_t>* packed = root->programs()->Get(r)->packed();
  ASSERT_NE(packed, nullptr);
  EXPECT_NO_THROW(Plan::from_bytes(good, "p.rsplan").program(r));
  const size_t at = packed->data() - good.data(), n = packed->size();
  const Plan ok = Plan::from_bytes(good, "p.rsplan");
  const fb::Program& want = ok.program(r);
  auto same = [&want](const fb::Program& got) {
    return got.steps()->size() == want.steps()->size() && got.regions()->size() == want.regions()->size() &&
           std::memcmp(got.steps()->data(), want.steps()->data(), want.steps()->size() * sizeof(fb::Step)) == 0 &&
           std::memcmp(got.regions()->data(), want.regions()->data(), want.regions()->size() * sizeof(fb::Region)) == 0;
  };
  // Every byte of the frame flipped: the rank's program is refused by name
  // (its checksum, its zstd header, or the FlatBuffer inside), or the flip
  // touched nothing the frame's content depends on; never read as another.
  size_t refused = 0;
  for (size_t i = 0; i < n; ++i) {
    std::vector<uint8_t> bytes = good;
    bytes[at + i] ^= 0x5a;
    Plan bad = Plan::from_bytes(bytes, "p.rsplan");
    try {
      EXPECT_TRUE(same(bad.program(r))) << "byte " << i << " of " << n;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("p.rsplan: rank " + std::to_string(r) + ": its packed program ", 0), 0u)
          << e.what();
      ++refused;
    }
  }
  EXPECT_GE(refused, n - 4);
}

}  // namespace
}  // namespace reshard
