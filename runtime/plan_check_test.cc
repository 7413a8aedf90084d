// Plans that, unchecked, would pass Plan::open and every rank's check and
// then make the runtime, `validate`, `show` or `run --local` read or write
// out of bounds or loop forever (cases 1 to 6), and the rest of the plan
// checks' bad-input catalogue (docs/plan-format.md, "What the checks
// guarantee"; docs/errors.md, "Plan refusals"). Every case asserts the full
// refusal, naming the rank and the step where there is one.
//
// RESHARD_WRITE_PLAN_REGRESSIONS=<dir> also writes every case's plan there
// (tests/fuzz/regressions/plan/ holds them for the fuzz harness).
#include "runtime/plan_check.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "runtime/error.h"
#include "runtime/plan.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using testing::BuildPlan;
using testing::MakeFragment;
using testing::MakeRegion;
using testing::MakeStep;
using testing::PlanSpec;
using testing::ProgramSpec;
using testing::QuantPath;
using testing::Shell;
using testing::StagingRegion;
using testing::TempDir;
using K = fb::StepKind;
using D = fb::Dtype;
using Q = fb::QuantKind;

void Keep(const std::string& name, const std::vector<uint8_t>& bytes) {
  const char* dir = std::getenv("RESHARD_WRITE_PLAN_REGRESSIONS");
  if (dir == nullptr) return;
  std::ofstream(std::string(dir) + "/" + name, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// The first refusal of opening the plan or checking any of its ranks; "" if none.
std::string Refusal(const std::string& name, const PlanSpec& spec) {
  std::vector<uint8_t> bytes = BuildPlan(spec);
  Keep(name, bytes);
  try {
    Plan plan = Plan::from_bytes(bytes, "p.rsplan");
    for (uint32_t r = 0; r < plan.num_ranks(); ++r) plan.program(r);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PlanCheckTest, TheBasePlansPass) {
  EXPECT_EQ(Refusal("ok-pack-and-direct", testing::PackAndDirectPlan()), "");
  EXPECT_EQ(Refusal("ok-forward", testing::ForwardPlan()), "");
  EXPECT_EQ(Refusal("ok-requantize", testing::QuantPlan(QuantPath::requantize)), "");
  EXPECT_EQ(Refusal("ok-sender-quantizes", testing::QuantPlan(QuantPath::sender_quantizes)), "");
  EXPECT_EQ(Refusal("ok-fp8-source", testing::QuantPlan(QuantPath::fp8_source)), "");
}

// Case 1: a zero-element region must not return early before its buffer
// index is checked: later code would read buffers()->Get(7).
TEST(PlanCheckTest, Case1EmptyRegionOnAMissingBuffer) {
  PlanSpec spec = testing::PackAndDirectPlan();
  ProgramSpec& p0 = spec.programs[0];
  const uint32_t bad = p0.Region(MakeRegion(7, 0, {0, 4}, {16, 1}));
  p0.steps[0] = MakeStep(K::pack, kNone, bad, kNone, 0, 0, D::bf16);
  EXPECT_EQ(Refusal("case1-empty-region-missing-buffer", spec),
            "p.rsplan: rank 0: step 0 (pack): src region (0,4):(16,1) has an empty mode 0");
}

// Case 2: a quant op over regions with an outer mode of size 0: the quantize
// loop would never end and write past the buffer.
TEST(PlanCheckTest, Case2QuantOpWithAnEmptyOuterMode) {
  PlanSpec spec = testing::QuantPlan(QuantPath::requantize);
  ProgramSpec& p1 = spec.programs[1];
  const uint32_t stage = p1.Region(StagingRegion(0, {0, 4, 8}, {32, 8, 1}));
  const uint32_t dst = p1.Region(MakeRegion(0, 0, {0, 2, 8}, {16, 8, 1}));
  const uint32_t scale = p1.Region(MakeRegion(1, 0, {0, 2, 2}, {4, 2, 1}));
  p1.steps[1] = MakeStep(K::unpack, kNone, stage, dst, 0, 16, D::bf16);
  p1.quant_ops[0] = testing::MakeQuant(1, Q::quantize, scale, {1, 0}, {2, 4});
  EXPECT_EQ(Refusal("case2-quant-empty-outer-mode", spec),
            "p.rsplan: rank 1: step 1 (unpack): src region (0,4,8):(32,8,1) has an empty mode 0");
}

// Case 3: elements times dtype size wraps: 16 bytes would be allocated for
// 2^62 + 4 fp32 elements and the synthetic fill write past them.
TEST(PlanCheckTest, Case3BufferBytesOverflow) {
  PlanSpec spec = testing::PackAndDirectPlan();
  spec.programs[1].buffers[0].shape = {(uint64_t{1} << 62) + 4};
  EXPECT_EQ(Refusal("case3-buffer-bytes-overflow", spec),
            "p.rsplan: rank 1: buffer 'w.cols' of shape [4611686018427387908] and fp32 holds more than 2^62 bytes");
}

// Case 4: the plan-wide tensor table, read by `run --local` and `validate`.
PlanSpec Scaled() { return testing::QuantPlan(QuantPath::requantize); }

TEST(PlanCheckTest, Case4TensorOfSevenDims) {
  PlanSpec spec = Scaled();
  spec.tensors[1].lo = {0, 0, 0, 0, 0, 0, 0};
  spec.tensors[1].hi = {1, 1, 1, 1, 1, 2, 2};
  spec.tensors[1].block = {1, 1, 1, 1, 1, 2, 4};
  EXPECT_EQ(Refusal("case4-seven-dims", spec), "p.rsplan: tensor 1 ('w#scale'): has 7 dims, at most 6 allowed");
}

TEST(PlanCheckTest, Case4BlockOfSevenDims) {
  PlanSpec spec = Scaled();
  spec.tensors[1].block = {1, 1, 1, 1, 1, 2, 4};
  EXPECT_EQ(Refusal("case4-seven-block-dims", spec),
            "p.rsplan: tensor 1 ('w#scale'): block [1,1,1,1,1,2,4] should have 2 dims");
}

TEST(PlanCheckTest, Case4BlockOfZero) {
  PlanSpec spec = Scaled();
  spec.tensors[1].block = {2, 0};
  EXPECT_EQ(Refusal("case4-block-zero", spec), "p.rsplan: tensor 1 ('w#scale'): block [2,0] is 0 in dim 1");
}

TEST(PlanCheckTest, Case4MissingBlock) {
  PlanSpec spec = Scaled();
  spec.tensors[1].block = {};
  EXPECT_EQ(Refusal("case4-missing-block", spec), "p.rsplan: tensor 1 ('w#scale'): block [] should have 2 dims");
}

TEST(PlanCheckTest, Case4MissingName) {
  PlanSpec spec = Scaled();
  spec.tensors[0].name = "";
  EXPECT_EQ(Refusal("case4-missing-name", spec), "p.rsplan: tensor 0 has no name");
}

TEST(PlanCheckTest, Case4ScaleOfOutOfRange) {
  PlanSpec spec = Scaled();
  spec.tensors[1].scale_of = 5;
  EXPECT_EQ(Refusal("case4-scale-of-out-of-range", spec),
            "p.rsplan: tensor 1 ('w#scale'): scale_of 5 out of range (the plan has 2 tensors)");
  spec.tensors[1].scale_of = -2;
  EXPECT_EQ(Refusal("case4-scale-of-negative", spec),
            "p.rsplan: tensor 1 ('w#scale'): scale_of -2 out of range (the plan has 2 tensors)");
  spec.tensors[1].scale_of = 1;
  EXPECT_EQ(Refusal("case4-scale-of-itself", spec), "p.rsplan: tensor 1 ('w#scale'): scale_of 1 is a scale tensor itself");
}

TEST(PlanCheckTest, Case4BoxShorterThanTheFragments) {
  PlanSpec spec = testing::PackAndDirectPlan();
  spec.tensors[0].lo = {0};
  spec.tensors[0].hi = {8};
  EXPECT_EQ(Refusal("case4-box-shorter-than-fragments", spec),
            "p.rsplan: rank 0: fragment 0: has 2 dims, tensor 'w' has 1");
  spec = Scaled();
  spec.tensors[0].lo = {0};
  spec.tensors[0].hi = {4};
  EXPECT_EQ(Refusal("case4-scaled-box-shorter", spec),
            "p.rsplan: tensor 1 ('w#scale'): has 2 dims, the tensor it scales 1");
  spec = Scaled();
  spec.tensors[0].hi = {4};
  EXPECT_EQ(Refusal("case4-lo-hi-differ", spec), "p.rsplan: tensor 0 ('w'): lo has 2 dims, hi 1");
}

TEST(PlanCheckTest, Case4HugeBlocks) {
  PlanSpec spec = Scaled();
  spec.tensors[1].block = {uint64_t{1} << 63, 4};
  EXPECT_EQ(Refusal("case4-huge-block", spec),
            "p.rsplan: tensor 1 ('w#scale'): box [0,0]..[2,2] holds more than the 1 blocks of 9223372036854775808 "
            "in dim 0 of tensor 'w'");
  // Blocks clipped to the tensor still span more than 2^32 elements.
  spec = Scaled();
  spec.tensors[0].hi = {uint64_t{1} << 17, uint64_t{1} << 17};
  spec.tensors[1].block = {uint64_t{1} << 17, uint64_t{1} << 17};
  spec.tensors[1].hi = {1, 1};
  EXPECT_EQ(Refusal("case4-block-over-2-32", spec),
            "p.rsplan: tensor 1 ('w#scale'): a block [131072,131072] spans 17179869184 elements, at most 2^32 are "
            "supported");
}

TEST(PlanCheckTest, Case4ScaleBoxAndDtype) {
  PlanSpec spec = Scaled();
  spec.tensors[1].dtype = D::bf16;
  EXPECT_EQ(Refusal("case4-scale-dtype", spec), "p.rsplan: tensor 1 ('w#scale'): scales are bf16, expected fp32 or e8m0");
  spec = Scaled();
  spec.tensors[1].side = 2;
  EXPECT_EQ(Refusal("case4-side", spec), "p.rsplan: tensor 1 ('w#scale'): side 2 is neither 0 (training) nor 1 (inference)");
}

TEST(PlanCheckTest, TensorBoxes) {
  PlanSpec spec = testing::PackAndDirectPlan();
  spec.tensors[0].lo = {0, 17};
  EXPECT_EQ(Refusal("tensor-hi-below-lo", spec), "p.rsplan: tensor 0 ('w'): box [0,17]..[8,16]: dim 1 has hi < lo");
  spec = testing::PackAndDirectPlan();
  spec.tensors[0].hi = {8, uint64_t{1} << 32};
  EXPECT_EQ(Refusal("tensor-beyond-2-32", spec),
            "p.rsplan: tensor 0 ('w'): box [0,0]..[8,4294967296]: dim 1 ends beyond 2^32 - 1 (coordinates are 32-bit)");
  spec = testing::PackAndDirectPlan();
  spec.tensors[0].lo = {0, 0, 0, 0};
  spec.tensors[0].hi = {1u << 31, 1u << 31, 1u << 31, 8};
  EXPECT_EQ(Refusal("tensor-volume", spec),
            "p.rsplan: tensor 0 ('w'): box [0,0,0,0]..[2147483648,2147483648,2147483648,8] has more than 2^63 elements");
}

// Case 5: an empty fragment on a buffer dim: hi - lo - 1 wraps, and
// `validate` and `run --local` would loop forever.
TEST(PlanCheckTest, Case5EmptyFragment) {
  PlanSpec spec = testing::PackAndDirectPlan();
  spec.programs[1].fragments[0] = MakeFragment(0, 0, 0, {0, 4}, {8, 4}, {8, 1}, 1, 0b10);
  EXPECT_EQ(Refusal("case5-empty-fragment", spec), "p.rsplan: rank 1: fragment 0: dim 1 [4, 4) is empty");
}

// Case 6: staging offsets not aligned to the wire dtype: a misaligned typed
// load on the CPU, a fault on a GPU.
TEST(PlanCheckTest, Case6MisalignedStaging) {
  PlanSpec spec = testing::PackAndDirectPlan();
  spec.programs[0].staging_bytes = 130;
  spec.programs[0].steps[0] = MakeStep(K::pack, kNone, 0, kNone, 1, 128, D::bf16);
  EXPECT_EQ(Refusal("case6-misaligned-pack", spec),
            "p.rsplan: rank 0: step 0 (pack): staging offset 1 is not a multiple of the 2 bytes of a bf16 element");
  spec = testing::PackAndDirectPlan();
  spec.programs[1].staging_bytes = 132;
  spec.programs[1].steps[2] = MakeStep(K::unpack, kNone, kNone, 0, 2, 128, D::bf16);
  spec.programs[1].steps[0] = MakeStep(K::recv, 0, kNone, kNone, 2, 128, D::bf16);
  EXPECT_EQ(Refusal("case6-misaligned-recv", spec), "");  // bf16 at byte 2: aligned
  spec.programs[1].buffers[0].dtype = D::fp32;
  spec.programs[1].steps[2] = MakeStep(K::unpack, kNone, kNone, 0, 2, 256, D::fp32);
  spec.programs[1].staging_bytes = 260;
  spec.programs[1].steps[0] = MakeStep(K::recv, 0, kNone, kNone, 2, 256, D::fp32);
  EXPECT_EQ(Refusal("case6-misaligned-unpack", spec),
            "p.rsplan: rank 1: step 0 (recv): staging offset 2 is not a multiple of the 4 bytes of a fp32 element");
}

TEST(PlanCheckTest, FragmentsStayInsideTheirTensorAndBuffers) {
  PlanSpec spec = testing::PackAndDirectPlan();
  spec.programs[1].fragments[0] = MakeFragment(0, 0, 0, {0, 4}, {8, 20}, {8, 1}, 1);
  EXPECT_EQ(Refusal("fragment-leaves-tensor", spec),
            "p.rsplan: rank 1: fragment 0: dim 1 [4, 20) leaves tensor 'w' [0, 16)");
  // Stride 0: all 128 elements of the box on one element of the buffer.
  spec = testing::PackAndDirectPlan();
  spec.programs[1].fragments[1] = MakeFragment(0, 1, 0, {0, 0}, {8, 16}, {0, 0}, 1);
  EXPECT_EQ(Refusal("fragment-more-than-buffer", spec),
            "p.rsplan: rank 1: fragment 1: has 128 elements, more than the 64 of the buffers it lies in");
  spec = testing::PackAndDirectPlan();
  spec.programs[1].fragments[1] = MakeFragment(0, 1, 0, {0, 0}, {4, 16}, {16, 1}, 1, 0b100);
  EXPECT_EQ(Refusal("fragment-buffer-dims", spec), "p.rsplan: rank 1: fragment 1: marks buffer dims beyond its 2 dims");
}

TEST(PlanCheckTest, RegionsHoldNoMoreThanTheirBuffers) {
  PlanSpec spec = testing::PackAndDirectPlan();
  ProgramSpec& p0 = spec.programs[0];
  // 2^64 elements (wraps to 0 in 64 bits) on one element.
  const uint32_t wide = p0.Region(MakeRegion(0, 0, {65536, 65536, 65536, 65536}, {0, 0, 0, 0}));
  p0.steps[0] = MakeStep(K::pack, kNone, wide, kNone, 0, 0, D::bf16);
  EXPECT_EQ(Refusal("region-elements-wrap", spec),
            "p.rsplan: rank 0: step 0 (pack): src region (65536,65536,65536,65536):(0,0,0,0) has more than 2^64 "
            "elements, more than the 128 of the buffers it lies in");
  spec = testing::ForwardPlan();
  ProgramSpec& p2 = spec.programs[2];
  const uint32_t stage = p2.Region(StagingRegion(0, {1024, 1024}, {0, 0}));
  p2.steps.back() = MakeStep(K::unpack, kNone, stage, 1, 0, 0, D::fp32);
  EXPECT_EQ(Refusal("staging-region-elements", spec),
            "p.rsplan: rank 2: step 3 (unpack): src staging region (1024,1024):(0,0) has 1048576 elements, more than "
            "the staging area holds");
}

// A forward step naming a src region (out of range, and forwards take none)
// must be refused: validate would read the region.
TEST(PlanCheckTest, StepsNameOnlyTheRegionsTheyTake) {
  PlanSpec spec = testing::ForwardPlan();
  spec.programs[2].steps[1] = MakeStep(K::forward, 3, 99, kNone, 0, 256, D::fp32, fb::Channel::nvlink);
  EXPECT_EQ(Refusal("finding-forward-with-src-region", spec),
            "p.rsplan: rank 2: step 1 (forward): names src region 99, which a forward step does not take");
  spec = testing::PackAndDirectPlan();
  spec.programs[0].steps[1] = MakeStep(K::send, 1, kNone, 0, 0, 128, D::bf16);
  EXPECT_EQ(Refusal("send-with-dst-region", spec),
            "p.rsplan: rank 0: step 1 (send): names dst region 0, which a send step does not take");
  spec = testing::PackAndDirectPlan();
  spec.programs[1].steps[0] = MakeStep(K::recv, 0, 0, kNone, 0, 128, D::bf16);
  EXPECT_EQ(Refusal("recv-with-src-region", spec),
            "p.rsplan: rank 1: step 0 (recv): names src region 0, which a recv step does not take");
}

TEST(PlanCheckTest, UnusedRegionsAreCheckedToo) {
  PlanSpec spec = testing::PackAndDirectPlan();
  spec.programs[0].Region(MakeRegion(3, 0, {4}, {1}));
  EXPECT_EQ(Refusal("unused-region", spec),
            "p.rsplan: rank 0: region 2: the region (4):(1) addresses buffer 3, the program binds 1 buffers");
}

TEST(PlanCheckTest, RoundBeginIsNeverEmpty) {
  PlanSpec spec = testing::PackAndDirectPlan();
  spec.programs[0].steps.clear();
  spec.programs[0].round_begin.clear();
  spec.programs[0].raw_rounds = true;
  EXPECT_EQ(Refusal("round-begin-empty", spec),
            "p.rsplan: rank 0: round_begin is empty, expected at least [0] (the program has 0 steps)");
}

// A buffer that holds values offset from the model's (Buffer.offset) is read
// and written only by steps that convert: never by a message straight from
// or into it, nor by a quant op, and only where its dtype carries arithmetic.
TEST(PlanCheckTest, OffsetBuffersAreConvertedOnTheWay) {
  PlanSpec recv = testing::PackAndDirectPlan();
  recv.programs[1].buffers[1].offset = -1;
  EXPECT_EQ(Refusal("offset-direct-recv", recv),
            "p.rsplan: rank 1: step 1 (recv): dst region is in buffer 'w.rows', which holds values offset from the "
            "model's; it is sent and received through staging");
  PlanSpec send = testing::PackAndDirectPlan();
  send.programs[0].buffers[0].offset = 1;
  EXPECT_EQ(Refusal("offset-direct-send", send),
            "p.rsplan: rank 0: step 2 (send): src region is in buffer 'w', which holds values offset from the "
            "model's; it is sent and received through staging");
  PlanSpec quant = testing::QuantPlan(QuantPath::sender_quantizes);
  quant.programs[0].buffers[0].offset = -1;
  EXPECT_EQ(Refusal("offset-quant-op", quant),
            "p.rsplan: rank 0: step 0 (pack): a quantize op on buffer 'w', which holds values offset from the "
            "model's (quant ops apply no offset)");
  PlanSpec fp8 = testing::QuantPlan(QuantPath::requantize);
  fp8.programs[1].buffers[0].offset = 1;
  EXPECT_EQ(Refusal("offset-fp8-buffer", fp8),
            "p.rsplan: rank 1: buffer 'w' of fp8_e4m3 has an offset; only bf16, fp16 and fp32 values carry one");
  // A region over several buffers (a kept stack dim) reads them all with one offset.
  PlanSpec span = testing::PackAndDirectPlan();
  ProgramSpec& p1 = span.programs[1];
  p1.buffers = {{"w.0", D::fp32, {4, 8}, -1}, {"w.1", D::fp32, {4, 8}, 0}};
  p1.fragments = {MakeFragment(0, 0, 0, {0, 4}, {4, 12}, {8, 1}, 1), MakeFragment(0, 1, 0, {4, 4}, {8, 12}, {8, 1}, 1)};
  p1.regions = {MakeRegion(0, 0, {2, 4, 8}, {1, 8, 1}, 1)};
  p1.steps = {MakeStep(K::recv, 0, kNone, kNone, 0, 128, D::bf16), MakeStep(K::unpack, kNone, kNone, 0, 0, 128, D::bf16)};
  EXPECT_EQ(Refusal("offset-region-spans-two", span),
            "p.rsplan: rank 1: step 1 (unpack): dst region (2,4,8):(b1,8,1) spans buffers 'w.0' and 'w.1' of "
            "different offsets");
}

// `validate`, `show`, `simulate` and `run --local` refuse a refused plan with
// the same message and a non-zero exit, before acting on any rank.
TEST(PlanCheckTest, EveryCommandRefusesARefusedPlan) {
  PlanSpec spec = testing::QuantPlan(QuantPath::requantize);
  ProgramSpec& p1 = spec.programs[1];
  const uint32_t stage = p1.Region(StagingRegion(0, {0, 4, 8}, {32, 8, 1}));
  const uint32_t dst = p1.Region(MakeRegion(0, 0, {0, 2, 8}, {16, 8, 1}));
  const uint32_t scale = p1.Region(MakeRegion(1, 0, {0, 2, 2}, {4, 2, 1}));
  p1.steps[1] = MakeStep(K::unpack, kNone, stage, dst, 0, 16, D::bf16);
  p1.quant_ops[0] = testing::MakeQuant(1, Q::quantize, scale, {1, 0}, {2, 4});
  TempDir dir;
  const std::string plan = dir.File("bad.rsplan");
  testing::WriteFile(plan, BuildPlan(spec));
  const std::string want = plan + ": rank 1: step 1 (unpack): src region (0,4,8):(32,8,1) has an empty mode 0";
  const std::string bin = RESHARD_BINARY;
  for (const std::string& cmd : {" validate " + plan, " show " + plan, " show " + plan + " --rank 1",
                                " simulate " + plan + " --cluster " + RESHARD_SOURCE_DIR + "/samples/clusters/dgx-h100.json",
                                " run " + plan + " --local --timeout 10"}) {
    testing::ShellResult r = Shell(bin + cmd);
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find(want), std::string::npos) << cmd << "\n" << r.out;
  }
}

}  // namespace
}  // namespace reshard
