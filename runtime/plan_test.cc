#include "runtime/plan.h"

#include <gtest/gtest.h>

#include "runtime/error.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using testing::BuildPlan;
using testing::MakeRegion;
using testing::MakeStep;
using testing::PlanSpec;
using testing::ProgramSpec;
using testing::StagingRegion;
using testing::TempDir;
using testing::WriteFile;
using K = fb::StepKind;
using D = fb::Dtype;

// Two ranks: rank 0 packs a 4x8 block of its 8x8 fp32 buffer 'x' and sends
// it; rank 1 receives and unpacks into 'y'.
PlanSpec TwoRankPlan() {
  PlanSpec spec;
  spec.tensors.push_back({"w", D::fp32, {0, 0}, {8, 8}});
  ProgramSpec p0;
  p0.rank = 0;
  p0.buffers.push_back({"x", D::fp32, {8, 8}});
  p0.staging_bytes = 128;
  uint32_t src = p0.Region(MakeRegion(0, 32, {4, 8}, {8, 1}));
  p0.Step(MakeStep(K::pack, kNone, src, kNone, 0, 128, D::fp32));
  p0.Step(MakeStep(K::send, 1, kNone, kNone, 0, 128, D::fp32));
  ProgramSpec p1;
  p1.rank = 1;
  p1.buffers.push_back({"y", D::fp32, {4, 8}});
  p1.staging_bytes = 128;
  uint32_t dst = p1.Region(MakeRegion(0, 0, {4, 8}, {8, 1}));
  p1.Step(MakeStep(K::recv, 0, kNone, kNone, 0, 128, D::fp32));
  p1.Step(MakeStep(K::unpack, kNone, kNone, dst, 0, 128, D::fp32));
  spec.programs = {p0, p1};
  return spec;
}

std::string OpenError(const std::vector<uint8_t>& bytes) {
  try {
    Plan::from_bytes(bytes, "p.rsplan");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string ProgramError(const PlanSpec& spec, uint32_t rank) {
  Plan plan = Plan::from_bytes(BuildPlan(spec), "p.rsplan");
  try {
    plan.program(rank);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PlanTest, OpensAValidPlanFromAFile) {
  TempDir dir;
  std::vector<uint8_t> bytes = BuildPlan(TwoRankPlan());
  WriteFile(dir.File("p.rsplan"), bytes);
  Plan plan = Plan::open(dir.File("p.rsplan"));
  EXPECT_EQ(plan.num_ranks(), 2u);
  EXPECT_EQ(plan.size_bytes(), bytes.size());
  EXPECT_EQ(plan.path(), dir.File("p.rsplan"));
  EXPECT_EQ(plan.root().model()->str(), "test-model");
  EXPECT_EQ(plan.program(1).steps()->size(), 2u);
  EXPECT_EQ(plan.program(1).steps()->size(), 2u);  // cached
  Plan moved = std::move(plan);
  EXPECT_EQ(moved.program(0).rank(), 0u);
}

TEST(PlanTest, RefusesAMissingFile) {
  TempDir dir;
  try {
    Plan::open(dir.File("nope.rsplan"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), dir.File("nope.rsplan") + ": cannot open: No such file or directory");
  }
}

TEST(PlanTest, RefusesATinyFile) {
  TempDir dir;
  WriteFile(dir.File("plan.rsplan"), {1, 2, 3});
  try {
    Plan::open(dir.File("plan.rsplan"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), dir.File("plan.rsplan") + ": file is 3 bytes, too small to be a plan");
  }
  EXPECT_EQ(OpenError({}), "p.rsplan: file is 0 bytes, too small to be a plan");
}

TEST(PlanTest, RefusesAWrongIdentifier) {
  std::vector<uint8_t> bytes = BuildPlan(TwoRankPlan());
  std::memcpy(bytes.data() + 4, "XY\x01Z", 4);
  EXPECT_EQ(OpenError(bytes), "p.rsplan: not a reshard plan (file identifier is 'XY\\x01Z', expected 'RSPL')");
}

TEST(PlanTest, RefusesAnotherSchemaVersion) {
  PlanSpec spec = TwoRankPlan();
  spec.schema_version = 4;
  EXPECT_EQ(OpenError(BuildPlan(spec)), "p.rsplan: schema version 4, this reshard reads versions 1 to 3");
  spec.schema_version = 0;
  EXPECT_EQ(OpenError(BuildPlan(spec)), "p.rsplan: schema version 0, this reshard reads versions 1 to 3");
}

TEST(PlanTest, ReadsVersionOnePlans) {
  // Plans written before packed programs (schema 1) hold every program in place.
  PlanSpec spec = TwoRankPlan();
  spec.schema_version = 1;
  Plan plan = Plan::from_bytes(BuildPlan(spec), "p.rsplan");
  EXPECT_EQ(plan.program(1).steps()->size(), 2u);
  EXPECT_EQ(plan.active_ranks().size(), 2u);
}

TEST(PlanTest, RefusesATruncatedFile) {
  std::vector<uint8_t> bytes = BuildPlan(TwoRankPlan());
  bytes.resize(bytes.size() / 2);
  EXPECT_EQ(OpenError(bytes), "p.rsplan: the file is damaged or truncated (flatbuffers verification failed)");
}

TEST(PlanTest, RefusesProgramCountMismatch) {
  PlanSpec spec = TwoRankPlan();
  spec.num_ranks = 3;
  EXPECT_EQ(OpenError(BuildPlan(spec)), "p.rsplan: the plan has 3 ranks but 2 programs");
}

// Every single-byte corruption is either harmless or reported as an Error,
// by open() or by program(); none crashes or reads out of bounds.
TEST(PlanTest, FlippedBytesNeverCrash) {
  const std::vector<uint8_t> good = BuildPlan(TwoRankPlan());
  int rejected = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t mask : {0x01, 0x80, 0xff}) {
      std::vector<uint8_t> bytes = good;
      bytes[i] ^= mask;
      try {
        Plan plan = Plan::from_bytes(bytes, "p.rsplan");
        for (uint32_t r = 0; r < plan.num_ranks(); ++r) plan.program(r);
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("p.rsplan: ", 0), 0u) << e.what();
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST(PlanTest, RankOutOfRange) {
  EXPECT_EQ(ProgramError(TwoRankPlan(), 2), "p.rsplan: rank 2 out of range (the plan has 2 ranks)");
}

TEST(PlanTest, RegionExceedsBuffer) {
  PlanSpec spec = TwoRankPlan();
  spec.programs[1].regions[0] = MakeRegion(0, 96, {4, 8}, {8, 1});
  spec.programs[1].buffers[0].shape = {8, 8};
  EXPECT_EQ(ProgramError(spec, 1),
            "p.rsplan: rank 1: step 1 (unpack): dst region (4,8):(8,1) at offset 96 exceeds buffer 'y' of 64 elements");
}

TEST(PlanTest, RegionAddressesMissingBuffer) {
  PlanSpec spec = TwoRankPlan();
  spec.programs[0].regions[0] = MakeRegion(0, 0, {2, 4, 8}, {1, 8, 1}, 0b001);
  spec.programs[0].steps[0] = MakeStep(K::pack, kNone, 0, kNone, 0, 256, D::fp32);
  spec.programs[0].staging_bytes = 256;
  EXPECT_EQ(ProgramError(spec, 0),
            "p.rsplan: rank 0: step 0 (pack): src region (2,4,8):(b1,8,1) addresses buffer 1, the program binds 1 "
            "buffers");
}

TEST(PlanTest, StagingRangeOutOfBounds) {
  PlanSpec spec = TwoRankPlan();
  spec.programs[1].steps[0] = MakeStep(K::recv, 0, kNone, kNone, 64, 128, D::fp32);
  EXPECT_EQ(ProgramError(spec, 1),
            "p.rsplan: rank 1: step 0 (recv): staging range [64, 192) exceeds the 128 staging bytes");
}

TEST(PlanTest, StagingRegionOutOfBounds) {
  PlanSpec spec = TwoRankPlan();
  uint32_t s = spec.programs[1].Region(StagingRegion(8, {4, 8}, {8, 1}));
  spec.programs[1].steps[1] = MakeStep(K::unpack, kNone, s, 0, 0, 128, D::fp32);
  EXPECT_EQ(ProgramError(spec, 1),
            "p.rsplan: rank 1: step 1 (unpack): src staging region (4,8):(8,1) at offset 8 ends at byte 160, beyond "
            "the 128 staging bytes");
}

TEST(PlanTest, PeerOutOfRange) {
  PlanSpec spec = TwoRankPlan();
  spec.programs[0].steps[1] = MakeStep(K::send, 7, kNone, kNone, 0, 128, D::fp32);
  EXPECT_EQ(ProgramError(spec, 0), "p.rsplan: rank 0: step 1 (send): peer 7 out of range (the plan has 2 ranks)");
}

TEST(PlanTest, RegionIndexOutOfRange) {
  PlanSpec spec = TwoRankPlan();
  spec.programs[0].steps[0] = MakeStep(K::pack, kNone, 5, kNone, 0, 128, D::fp32);
  EXPECT_EQ(ProgramError(spec, 0),
            "p.rsplan: rank 0: step 0 (pack): src region 5 out of range (the program has 1 regions)");
}

TEST(PlanTest, PackByteCountMismatch) {
  PlanSpec spec = TwoRankPlan();
  spec.programs[0].steps[0] = MakeStep(K::pack, kNone, 0, kNone, 0, 100, D::bf16);
  EXPECT_EQ(ProgramError(spec, 0),
            "p.rsplan: rank 0: step 0 (pack): src region (4,8):(8,1) holds 64 bytes of bf16, the step moves 100");
}

TEST(PlanTest, DirectSendMustBeContiguousAndOfWireDtype) {
  PlanSpec spec = TwoRankPlan();
  spec.programs[0].Region(MakeRegion(0, 0, {4, 4}, {8, 1}));
  spec.programs[0].steps[1] = MakeStep(K::send, 1, 1, kNone, 0, 64, D::fp32);
  EXPECT_EQ(ProgramError(spec, 0), "p.rsplan: rank 0: step 1 (send): src region (4,4):(8,1) is not contiguous in one buffer");
  spec.programs[0].regions[1] = MakeRegion(0, 0, {4, 8}, {8, 1});
  spec.programs[0].steps[1] = MakeStep(K::send, 1, 1, kNone, 0, 64, D::bf16);
  EXPECT_EQ(ProgramError(spec, 0),
            "p.rsplan: rank 0: step 1 (send): src region is in buffer 'x' of fp32, the wire dtype is bf16");
}

TEST(PlanTest, DependenciesAreNotSupportedYet) {
  PlanSpec spec = TwoRankPlan();
  spec.programs[0].steps[1] = MakeStep(K::send, 1, kNone, kNone, 0, 128, D::fp32, fb::Channel::net, 0);
  EXPECT_EQ(ProgramError(spec, 0),
            "p.rsplan: rank 0: step 1 (send): dep 0 is not supported yet (must be 0xFFFFFFFF)");
}

TEST(PlanTest, RoundsMustCoverTheSteps) {
  PlanSpec spec = TwoRankPlan();
  spec.programs[1].raw_rounds = true;
  spec.programs[1].round_begin = {0, 1};
  EXPECT_EQ(ProgramError(spec, 1), "p.rsplan: rank 1: round_begin ends at 1, expected the step count 2");
  spec.programs[1].round_begin = {0, 2, 1, 2};
  EXPECT_EQ(ProgramError(spec, 1), "p.rsplan: rank 1: round_begin[2] = 1 is below round_begin[1] = 2");
  spec.programs[1].round_begin = {1, 2};
  EXPECT_EQ(ProgramError(spec, 1), "p.rsplan: rank 1: round_begin[0] is 1, expected 0");
}

TEST(PlanTest, DuplicateBufferNames) {
  PlanSpec spec = TwoRankPlan();
  spec.programs[1].buffers.push_back({"y", D::fp32, {4}});
  EXPECT_EQ(ProgramError(spec, 1), "p.rsplan: rank 1: buffer 'y' is listed twice");
}

TEST(PlanTest, FragmentOutsideItsBuffer) {
  PlanSpec spec = TwoRankPlan();
  spec.programs[1].fragments.push_back(testing::MakeFragment(0, 0, 8, {0, 0}, {4, 8}, {8, 1}, 1));
  EXPECT_EQ(ProgramError(spec, 1), "p.rsplan: rank 1: fragment 0: at offset 8 exceeds buffer 'y' of 32 elements");
  spec.programs[1].fragments[0] = testing::MakeFragment(3, 0, 0, {0, 0}, {4, 8}, {8, 1}, 1);
  EXPECT_EQ(ProgramError(spec, 1), "p.rsplan: rank 1: fragment 0: tensor 3 out of range (the plan has 1 tensors)");
}

TEST(PlanTest, FormatsRegionsInCuteNotation) {
  EXPECT_EQ(FormatRegion(MakeRegion(0, 0, {4, 16, 458752}, {16, 1, 1}, 0b011)), "(4,16,458752):(b16,b1,1)");
  EXPECT_EQ(FormatRegion(MakeRegion(0, 5, {4, 8}, {8, 1})), "(4,8):(8,1)");
}

TEST(PlanTest, DtypeNamesAndSizes) {
  EXPECT_EQ(DtypeSize(D::bf16), 2u);
  EXPECT_EQ(DtypeSize(D::fp32), 4u);
  EXPECT_EQ(DtypeSize(D::fp8_e4m3), 1u);
  EXPECT_STREQ(DtypeName(D::fp16), "fp16");
  EXPECT_STREQ(DtypeName(static_cast<D>(9)), "dtype(9)");
}

}  // namespace
}  // namespace reshard
