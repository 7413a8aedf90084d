#include "runtime/session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/synthetic.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using testing::BuildPlan;
using testing::MakeFragment;
using testing::MakeRegion;
using testing::MakeStep;
using testing::PlanSpec;
using testing::ProgramSpec;
using testing::StagingRegion;
using K = fb::StepKind;
using D = fb::Dtype;

using testing::NoTransport;

// One rank: tensor v fp32 [8,16] in 'v'; a transposed fp16 copy 'vt' [16,8]
// written by a copy step, and bf16 'half' [8,8] = columns 4..12 written by
// pack into staging (as fp32) then unpack.
PlanSpec LocalPlan() {
  PlanSpec spec;
  spec.tensors.push_back({"v", D::fp32, {0, 0}, {8, 16}});
  ProgramSpec p;
  p.rank = 0;
  p.buffers = {{"v", D::fp32, {8, 16}}, {"vt", D::fp16, {16, 8}}, {"half", D::bf16, {8, 8}}};
  p.fragments.push_back(MakeFragment(0, 0, 0, {0, 0}, {8, 16}, {16, 1}, 0));
  p.fragments.push_back(MakeFragment(0, 1, 0, {0, 0}, {8, 16}, {1, 8}, 1));
  p.fragments.push_back(MakeFragment(0, 2, 0, {0, 4}, {8, 12}, {8, 1}, 1));
  p.staging_bytes = 256;
  uint32_t transposed = p.Region(MakeRegion(0, 0, {16, 8}, {1, 16}));
  uint32_t vt = p.Region(MakeRegion(1, 0, {16, 8}, {8, 1}));
  uint32_t block = p.Region(MakeRegion(0, 4, {8, 8}, {16, 1}));
  uint32_t half = p.Region(MakeRegion(2, 0, {8, 8}, {8, 1}));
  p.Step(MakeStep(K::copy, kNone, transposed, vt, 0, 0, D::fp32));
  p.Step(MakeStep(K::pack, kNone, block, kNone, 0, 256, D::fp32));
  p.Step(MakeStep(K::unpack, kNone, kNone, half, 0, 256, D::fp32));
  spec.programs = {p};
  return spec;
}

std::string BindError(Session& s, const std::string& name, D dtype, std::vector<uint64_t> shape) {
  static char memory[1024];
  try {
    s.bind(name, memory, dtype, std::move(shape));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SessionTest, BindingErrors) {
  Plan plan = Plan::from_bytes(BuildPlan(LocalPlan()), "p.rsplan");
  NoTransport t(0, 1);
  Session s(plan, 0, t);
  EXPECT_EQ(s.staging_bytes(), 256u);
  EXPECT_EQ(BindError(s, "vx", D::fp32, {8, 16}), "rank 0: the plan has no buffer 'vx' for this rank (did you mean 'v'?)");
  EXPECT_EQ(BindError(s, "decoder.layers.0.weight", D::fp32, {8, 16}),
            "rank 0: the plan has no buffer 'decoder.layers.0.weight' for this rank");
  EXPECT_EQ(BindError(s, "v", D::fp32, {16, 8}), "rank 0: buffer 'v' is bound with shape [16,8], the plan expects [8,16]");
  EXPECT_EQ(BindError(s, "v", D::bf16, {8, 16}), "rank 0: buffer 'v' is bound with dtype bf16, the plan expects fp32");
  EXPECT_EQ(BindError(s, "v", D::fp32, {8, 16}), "");
  try {
    s.run();
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 0: 2 of 3 buffers are not bound: 'vt', 'half'");
  }
  // The failed run ended the transport's use: the next one says so.
  EXPECT_EQ(BindError(s, "vt", D::fp16, {16, 8}), "");
  try {
    s.run();
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "rank 0: this transport failed in run 1 (rank 0: 2 of 3 buffers are not bound: 'vt', 'half' (nothing "
                 "was sent)); its connections are closed: make a new transport, and a session on it, for the next "
                 "refit");
  }
  NoTransport fresh(0, 1);
  Session again(plan, 0, fresh);
  EXPECT_EQ(BindError(again, "v", D::fp32, {8, 16}), "");
  EXPECT_EQ(BindError(again, "vt", D::fp16, {16, 8}), "");
  try {
    again.run();
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 0: buffer 'half' is not bound");
  }
}

// Two destination buffers in one memory would each overwrite the other's
// weights: the second binding is refused, naming both; rebinding a buffer
// to its own memory, and sources sharing memory, are fine.
TEST(SessionTest, DestinationsMustNotOverlap) {
  Plan plan = Plan::from_bytes(BuildPlan(LocalPlan()), "p.rsplan");
  NoTransport t(0, 1);
  Session s(plan, 0, t);
  alignas(64) static char memory[4096];
  s.bind("vt", memory, D::fp16, {16, 8});  // bytes [0, 256)
  s.bind("vt", memory, D::fp16, {16, 8});  // again: its own memory
  char buf[160];
  std::snprintf(buf, sizeof buf, "[0x%zx, 0x%zx) that overlaps buffer 'vt' [0x%zx, 0x%zx)",
                reinterpret_cast<size_t>(memory + 128), reinterpret_cast<size_t>(memory + 256),
                reinterpret_cast<size_t>(memory), reinterpret_cast<size_t>(memory + 256));
  EXPECT_EQ(BindError(s, "half", D::bf16, {8, 8}), "");  // the static buffer of BindError: elsewhere
  try {
    s.bind("half", memory + 128, D::bf16, {8, 8});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank 0: buffer 'half' is bound to memory " + std::string(buf) +
                                         ": both are destinations, so each would overwrite the other's weights; "
                                         "bind each to its own tensor");
  }
  s.bind("half", memory + 256, D::bf16, {8, 8});  // just after: fine
  s.bind("v", memory, D::fp32, {8, 16});          // a source over destinations: not checked here
  s.bind("vt", memory + 512, D::fp16, {16, 8});   // moved: its old memory is free again
  s.bind("half", memory + 128, D::bf16, {8, 8});
}

TEST(SessionTest, OneSessionPerTransport) {
  Plan plan = Plan::from_bytes(BuildPlan(LocalPlan()), "p.rsplan");
  NoTransport t(0, 1);
  {
    Session first(plan, 0, t);
    try {
      Session second(plan, 0, t);
      FAIL();
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(),
                   "rank 0: this transport already serves a session: one session per transport at a time (a second "
                   "one would take the first one's messages); close the other session first (Session.close()), or "
                   "make a new transport");
    }
  }
  Session after(plan, 0, t);  // the first one gave it back
  EXPECT_EQ(after.rank(), 0u);
}

TEST(SessionTest, TransportMustMatch) {
  Plan plan = Plan::from_bytes(BuildPlan(LocalPlan()), "p.rsplan");
  NoTransport wrong_size(0, 2), wrong_rank(1, 1);
  try {
    Session s(plan, 0, wrong_size);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "rank 0: the transport connects 2 ranks, the plan has 1 ranks (a transport connects every plan rank, "
                 "or only the active ones: Plan.active_ranks)");
  }
  try {
    Session s(plan, 0, wrong_rank);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 0: the transport says it is rank 1 of 1");
  }
}

TEST(SessionTest, RefusesConversionsWithoutKernels) {
  PlanSpec spec = LocalPlan();
  spec.programs[0].buffers[2].dtype = D::fp8_e4m3;
  spec.programs[0].steps[2] = MakeStep(K::unpack, kNone, kNone, 3, 0, 256, D::fp32);
  spec.programs[0].buffers[2].shape = {8, 8};
  Plan plan = Plan::from_bytes(BuildPlan(spec), "p.rsplan");
  NoTransport t(0, 1);
  try {
    Session s(plan, 0, t);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "p.rsplan: rank 0: step 2 (unpack): converts fp32 to fp8_e4m3 without a quant op (quantized buffers "
                 "are read and written by quantize and dequantize steps)");
  }
}

TEST(SessionTest, CopyPackUnpackOnOneRank) {
  Plan plan = Plan::from_bytes(BuildPlan(LocalPlan()), "p.rsplan");
  NoTransport t(0, 1);
  SyntheticRun run = RunSynthetic(plan, 0, t);
  EXPECT_EQ(run.check.checked, 128u + 64u);
  EXPECT_EQ(run.check.wrong, 0u) << (run.check.first.empty() ? "" : FormatWrong(run.check.first[0]));
  EXPECT_EQ(run.stats.steps, 3u);
  EXPECT_EQ(run.stats.rounds.size(), 1u);
  EXPECT_EQ(run.stats.rounds[0].bytes_local, 16u * 8 * 2 + 256 + 8 * 8 * 2);
}

TEST(SessionTest, CheckReportsWrongElements) {
  PlanSpec spec = LocalPlan();
  // Copy the untransposed block: most of 'vt' gets the wrong elements.
  spec.programs[0].regions[0] = MakeRegion(0, 0, {16, 8}, {8, 1});
  Plan plan = Plan::from_bytes(BuildPlan(spec), "p.rsplan");
  NoTransport t(0, 1);
  SyntheticRun run = RunSynthetic(plan, 0, t, 2);
  EXPECT_EQ(run.check.checked, 192u);
  EXPECT_GT(run.check.wrong, 100u);
  ASSERT_EQ(run.check.first.size(), 2u);
  const WrongElement& w = run.check.first[0];
  EXPECT_EQ(w.tensor, "v");
  EXPECT_EQ(w.buffer, "vt");
  EXPECT_EQ(w.coord, (std::vector<uint64_t>{0, 1}));
  // v[0][1] belongs at vt[1][0] = element 8, which the row-major copy filled with v[0][8].
  uint16_t want = FloatToFp16(SyntheticValue(0, 1, D::fp32));
  uint16_t got = FloatToFp16(SyntheticValue(0, 8, D::fp32));
  EXPECT_EQ(w.expected_bits, want);
  EXPECT_EQ(w.got_bits, got);
  char expect[200];
  std::snprintf(expect, sizeof expect, "tensor 'v' [0,1] in buffer 'vt': expected %.9g (0x%04x), got %.9g (0x%04x)",
                Fp16ToFloat(want), want, Fp16ToFloat(got), got);
  EXPECT_EQ(FormatWrong(w), expect);
}

TEST(SyntheticTest, ValuesAreFiniteAndDistinct) {
  for (D d : {D::bf16, D::fp16, D::fp32}) {
    std::set<uint32_t> seen;
    for (uint64_t i = 0; i < 4096; ++i) {
      float f = SyntheticValue(3, i, d);
      ASSERT_TRUE(std::isfinite(f)) << DtypeName(d) << " " << i;
      seen.insert(SyntheticBits(3, i, d));
    }
    EXPECT_GT(seen.size(), d == D::fp32 ? 4090u : d == D::fp16 ? 3900u : 3000u) << DtypeName(d);
    EXPECT_NE(SyntheticBits(3, 0, d), SyntheticBits(4, 0, d));
  }
}

}  // namespace
}  // namespace reshard
