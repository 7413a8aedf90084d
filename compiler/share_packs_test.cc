// One pack, many sends (share_packs.h) on hand-built rounds: which repeated
// packs are dropped, where their readers then read, and which are kept
// because dropping them could change a byte some step reads.
#include "compiler/share_packs.h"

#include <gtest/gtest.h>

namespace reshard {
namespace {

constexpr uint32_t kBuf = 0;

StridedRegion Contiguous(uint32_t buffer, uint64_t offset, int64_t n) {
  StridedRegion r;
  r.buffer = buffer;
  r.offset = offset;
  r.ndim = 1;
  r.shape[0] = n;
  r.stride[0] = 1;
  return r;
}

StridedRegion Rows(uint32_t buffer, uint64_t offset, int64_t rows, int64_t cols, int64_t row_stride) {
  StridedRegion r;
  r.buffer = buffer;
  r.offset = offset;
  r.ndim = 2;
  r.shape[0] = rows, r.shape[1] = cols;
  r.stride[0] = row_stride, r.stride[1] = 1;
  return r;
}

// One rank, one round; steps added by the helpers below.
struct OneRound {
  PlanIR ir;
  OneRound() {
    ir.ranks.resize(1);
    ir.ranks[0].round(0);
  }
  RankProgram& p() { return ir.ranks[0]; }
  Round& r() { return ir.ranks[0].rounds[0]; }
  // A plain pack of `n` bf16 elements of the buffer from `offset` (strided,
  // as packs are) to staging byte `at`.
  void Pack(uint64_t offset, uint64_t at, int64_t n = 1024) {
    Step s;
    s.kind = StepKind::pack;
    s.src = p().AddRegion(Rows(kBuf, offset, n / 32, 32, 64));
    s.staging = at, s.bytes = static_cast<uint64_t>(n) * 2;
    r().local.push_back(s);
  }
  // A block-scaled quantize of a 64x64 tile (blocks `block`) into FP8 values
  // at staging byte `at` and fp32 scales right after them.
  void Quantize(uint64_t offset, uint64_t at, uint32_t block = 32) {
    Step s;
    s.kind = StepKind::pack;
    s.wire = Dtype::fp8_e4m3;
    s.src = p().AddRegion(Rows(kBuf, offset, 64, 64, 128));
    s.dst = p().AddRegion(Rows(kStaging, at, 64, 64, 64));
    QuantOpIR q;
    q.kind = QuantKind::quantize;
    q.block = {block, block};
    const int64_t nb = 64 / block;
    q.scale = p().AddRegion(Rows(kStaging, (at + 4096) / 4, nb, nb, nb));
    s.quant = p().AddQuant(q);
    s.staging = at, s.bytes = 4096;
    r().local.push_back(s);
  }
  void Send(uint32_t peer, uint64_t at, uint64_t bytes) {
    Step s;
    s.kind = StepKind::send;
    s.peer = peer, s.staging = at, s.bytes = bytes;
    r().comm.push_back(s);
  }
  void Recv(uint32_t peer, uint64_t at, uint64_t bytes) {
    Step s;
    s.kind = StepKind::recv;
    s.peer = peer, s.staging = at, s.bytes = bytes;
    r().comm.push_back(s);
  }
  std::vector<uint64_t> SendOffsets() {
    std::vector<uint64_t> v;
    for (const Step& s : r().comm)
      if (s.kind == StepKind::send) v.push_back(s.staging);
    return v;
  }
};

TEST(SharePacksTest, RepeatedPackIsDroppedAndItsSendReadsTheFirst) {
  OneRound t;
  t.Pack(0, 0);
  t.Pack(0, 2048);
  t.Send(1, 0, 2048);
  t.Send(2, 2048, 2048);
  const SharedPacks s = SharePacks(t.ir);
  EXPECT_EQ(s.packs, 1u);
  EXPECT_EQ(s.bytes, 2048u);
  EXPECT_EQ(s.quant_packs, 0u);
  ASSERT_EQ(t.r().local.size(), 1u);
  EXPECT_EQ(t.r().local[0].staging, 0u);
  EXPECT_EQ(t.SendOffsets(), (std::vector<uint64_t>{0, 0}));
}

TEST(SharePacksTest, DifferentSourcesAreNotRepeats) {
  OneRound t;
  t.Pack(0, 0);
  t.Pack(32, 2048);  // the next 32 columns of the same rows
  t.Send(1, 0, 2048);
  t.Send(2, 2048, 2048);
  EXPECT_EQ(SharePacks(t.ir).packs, 0u);
  EXPECT_EQ(t.r().local.size(), 2u);
  EXPECT_EQ(t.SendOffsets(), (std::vector<uint64_t>{0, 2048}));
}

// Two receivers each get one message of the same two pieces, laid out alike:
// the second message is sent from the first one's bytes.
TEST(SharePacksTest, MessageOfSeveralRepeatsMovesWhole) {
  OneRound t;
  t.Pack(0, 0);
  t.Pack(32, 2048);
  t.Pack(0, 4096);
  t.Pack(32, 6144);
  t.Send(1, 0, 4096);
  t.Send(2, 4096, 4096);
  EXPECT_EQ(SharePacks(t.ir).packs, 2u);
  EXPECT_EQ(t.r().local.size(), 2u);
  EXPECT_EQ(t.SendOffsets(), (std::vector<uint64_t>{0, 0}));
}

// The second message holds a repeat and bytes of its own: it must stay whole
// where it is, so the repeat is packed again (nothing is written after the
// first copy, so only the check of what the message holds can tell).
TEST(SharePacksTest, MessageMixingARepeatWithOtherBytesKeepsIt) {
  OneRound t;
  t.Pack(0, 0);
  t.Pack(0, 8192);
  t.Pack(32, 10240);
  t.Send(1, 0, 2048);
  t.Send(2, 8192, 4096);
  EXPECT_EQ(SharePacks(t.ir).packs, 0u);
  EXPECT_EQ(t.r().local.size(), 3u);
  EXPECT_EQ(t.SendOffsets(), (std::vector<uint64_t>{0, 8192}));
}

// Repeats laid out in another order than their first copies: no single move
// serves the message.
TEST(SharePacksTest, RepeatsInAnotherOrderAreKept) {
  OneRound t;
  t.Pack(0, 0);
  t.Pack(32, 2048);
  t.Pack(32, 4096);
  t.Pack(0, 6144);
  t.Send(1, 0, 4096);
  t.Send(2, 4096, 4096);
  EXPECT_EQ(SharePacks(t.ir).packs, 0u);
  EXPECT_EQ(t.SendOffsets(), (std::vector<uint64_t>{0, 4096}));
}

TEST(SharePacksTest, RepeatReadThroughARegionIsKept) {
  OneRound t;
  t.Pack(0, 0);
  t.Pack(0, 2048);
  t.Send(1, 0, 2048);
  Step u;  // a local unpack reading the repeat's bytes through a staging region
  u.kind = StepKind::unpack;
  u.src = t.p().AddRegion(Contiguous(kStaging, 1024, 1024));
  u.dst = t.p().AddRegion(Contiguous(1, 0, 1024));
  t.r().unpack.push_back(u);
  EXPECT_EQ(SharePacks(t.ir).packs, 0u);
  EXPECT_EQ(t.r().local.size(), 2u);
}

TEST(SharePacksTest, FirstCopyOverwrittenInTheRoundIsNotShared) {
  OneRound t;
  t.Pack(0, 0);
  t.Pack(0, 2048);
  t.Send(1, 0, 2048);
  t.Send(2, 2048, 2048);
  t.Recv(3, 1024, 256);  // lands inside the first copy
  EXPECT_EQ(SharePacks(t.ir).packs, 0u);
  EXPECT_EQ(t.SendOffsets(), (std::vector<uint64_t>{0, 2048}));
}

// Block-scaled: the FP8 values and their scales, sent as one message, are
// quantized once for both receivers.
TEST(SharePacksTest, QuantizeRepeatsShareValuesAndScales) {
  OneRound t;
  t.Quantize(0, 0);
  t.Quantize(0, 8192);
  t.Send(1, 0, 4096 + 16);
  t.Send(2, 8192, 4096 + 16);
  const SharedPacks s = SharePacks(t.ir);
  EXPECT_EQ(s.packs, 1u);
  EXPECT_EQ(s.quant_packs, 1u);
  EXPECT_EQ(s.bytes, 4096u + 16);
  ASSERT_EQ(t.r().local.size(), 1u);
  EXPECT_EQ(t.SendOffsets(), (std::vector<uint64_t>{0, 0}));
}

TEST(SharePacksTest, QuantizeWithOtherBlocksIsNotARepeat) {
  OneRound t;
  t.Quantize(0, 0, 32);
  t.Quantize(0, 8192, 64);
  t.Send(1, 0, 4096 + 16);
  t.Send(2, 8192, 4096 + 4);
  EXPECT_EQ(SharePacks(t.ir).packs, 0u);
  EXPECT_EQ(t.r().local.size(), 2u);
}

// Repeats in different rounds are left alone (a round's staging lives for
// one round after it only).
TEST(SharePacksTest, RepeatsInOtherRoundsAreKept) {
  OneRound t;
  t.Pack(0, 0);
  t.Send(1, 0, 2048);
  Round& next = t.p().round(1);
  next = t.r();
  EXPECT_EQ(SharePacks(t.ir).packs, 0u);
  EXPECT_EQ(t.p().rounds[1].local.size(), 1u);
}

}  // namespace
}  // namespace reshard
