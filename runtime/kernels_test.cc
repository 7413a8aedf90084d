#include "runtime/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/dtype.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using D = fb::Dtype;

// The element address of row-major index i of a (not simplified) view.
char* Address(const RegionView& v, uint64_t i) {
  uint64_t buf = v.buffer, off = v.offset;
  for (int k = v.ndim - 1; k >= 0; --k) {
    uint64_t c = i % v.shape[k];
    i /= v.shape[k];
    if (v.buffer_modes & (1u << k)) {
      buf += c * v.stride[k];
    } else {
      off += c * v.stride[k];
    }
  }
  return v.buffers[buf] + off * DtypeSize(v.dtype);
}

void NaiveCopy(const RegionView& src, const RegionView& dst) {
  for (uint64_t i = 0; i < ViewElements(src); ++i) {
    StoreFromFloat(Address(dst, i), dst.dtype, LoadAsFloat(Address(src, i), src.dtype));
  }
}

TEST(DtypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f807fffu)), 0x3f80);  // below the tie
  EXPECT_EQ(FloatToBf16(BitsFloat(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds to infinity
  EXPECT_EQ(FloatToBf16(BitsFloat(0xff800000u)), 0xff80);  // -inf
  EXPECT_EQ(FloatToBf16(BitsFloat(0x80000000u)), 0x8000);  // -0
  EXPECT_EQ(FloatToBf16(BitsFloat(0x00018000u)), 0x0002);  // subnormal tie, odd rounds up
  uint16_t nan = FloatToBf16(BitsFloat(0x7f800001u));      // a NaN whose payload would round away
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan)));
}

TEST(DtypeTest, Fp16RoundsToNearestEven) {
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);                // tie with odd max: infinity
  EXPECT_EQ(FloatToFp16(1e10f), 0x7c00);
  EXPECT_EQ(FloatToFp16(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);   // smallest subnormal
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);   // tie: rounds to even zero
  EXPECT_EQ(FloatToFp16(std::ldexp(3.0f, -26)), 0x0001);   // above the tie
  EXPECT_EQ(FloatToFp16(std::ldexp(3.0f, -25)), 0x0002);   // 1.5 ulp tie: odd rounds up
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -14)), 0x0400);   // smallest normal
  EXPECT_EQ(FloatToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToFp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFp16(NAN) & 0x7c00, 0x7c00);
  EXPECT_NE(FloatToFp16(NAN) & 0x03ff, 0);
}

TEST(DtypeTest, EveryHalfValueRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) << h;
      continue;
    }
    ASSERT_EQ(FloatToFp16(f), h) << h;
    float b = Bf16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(b)) {
      ASSERT_EQ(FloatToBf16(b), h) << h;
    }
  }
}

#ifdef __FLT16_MAX__
TEST(DtypeTest, Fp16MatchesTheCompilersConversion) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    // Exponents around the fp16 range, random mantissas and signs.
    uint32_t bits = (rng() & 0x807fffffu) | ((100u + rng() % 50) << 23);
    float f = BitsFloat(bits);
    _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    ASSERT_EQ(FloatToFp16(f), want) << std::hex << bits;
  }
}
#endif

TEST(KernelsTest, SimplifyMergesContiguousModes) {
  char* base[1] = {nullptr};
  RegionView v = ViewOf(testing::MakeRegion(0, 3, {4, 1, 8}, {8, 77, 1}), base, D::fp32);
  RegionView s = Simplify(v);
  EXPECT_EQ(s.ndim, 1);
  EXPECT_EQ(s.shape[0], 32u);
  EXPECT_EQ(s.stride[0], 1u);
  EXPECT_EQ(s.offset, 3u);
  RegionView b = Simplify(ViewOf(testing::MakeRegion(0, 0, {2, 4, 8}, {1, 16, 1}, 0b001), base, D::fp32));
  EXPECT_EQ(b.ndim, 3);
  EXPECT_EQ(b.buffer_modes, 0b001);
}

struct Arena {
  std::vector<std::vector<char>> memory;
  std::vector<char*> ptrs;
  Arena(int n, size_t bytes, std::mt19937& rng) {
    for (int i = 0; i < n; ++i) {
      memory.emplace_back(bytes);
      for (char& c : memory.back()) c = static_cast<char>(rng());
      ptrs.push_back(memory.back().data());
    }
  }
};

// A random view of `n` elements laid out as a permuted, padded dense box in
// one of `nbuf` buffers, some outer mode possibly selecting the buffer.
RegionView RandomView(std::mt19937& rng, const std::vector<uint64_t>& shape, int nbuf, char* const* buffers, D dtype,
                      uint64_t* footprint) {
  RegionView v;
  v.buffers = buffers;
  v.ndim = static_cast<int>(shape.size());
  std::vector<int> order(shape.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
  std::shuffle(order.begin(), order.end(), rng);
  uint64_t stride = 1;
  int buffer_mode = -1;
  if (nbuf > 1) {
    for (int k = 0; k < v.ndim; ++k) {
      if (shape[k] <= static_cast<uint64_t>(nbuf)) buffer_mode = k;
    }
  }
  for (int k : order) {
    v.shape[k] = shape[k];
    if (k == buffer_mode) {
      v.stride[k] = 1;
      v.buffer_modes |= 1u << k;
      continue;
    }
    v.stride[k] = stride;
    stride *= shape[k] + (rng() % 3 == 0 ? rng() % 3 : 0);  // padding
  }
  v.offset = rng() % 5;
  v.dtype = dtype;
  *footprint = (v.offset + stride + 8) * 4;
  return v;
}

TEST(KernelsTest, MatchesNaiveCopyOnRandomRegions) {
  std::mt19937 rng(1234);
  const D dtypes[] = {D::bf16, D::fp16, D::fp32};
  for (int iter = 0; iter < 600; ++iter) {
    int ndim = 1 + static_cast<int>(rng() % 4);
    std::vector<uint64_t> shape(ndim);
    for (auto& s : shape) s = 1 + rng() % 7;
    if (rng() % 4 == 0) shape.back() = 1 + rng() % 200;
    D sd = dtypes[rng() % 3], dd = dtypes[rng() % 3];
    int snb = 1 + static_cast<int>(rng() % 3), dnb = 1 + static_cast<int>(rng() % 3);
    std::vector<char*> sp(snb), dp(dnb);
    uint64_t sfoot, dfoot;
    RegionView src = RandomView(rng, shape, snb, sp.data(), sd, &sfoot);
    // The destination may see the same elements in another shape: flatten it sometimes.
    std::vector<uint64_t> dshape = shape;
    if (rng() % 3 == 0) {
      uint64_t n = 1;
      for (auto s : shape) n *= s;
      dshape = {n};
    }
    RegionView dst = RandomView(rng, dshape, dnb, dp.data(), dd, &dfoot);
    Arena sa(snb, sfoot, rng), da(dnb, dfoot, rng), na(dnb, dfoot, rng);
    // Source values: finite, so that conversions compare bit for bit.
    for (auto& m : sa.memory) {
      for (size_t i = 0; i + 4 <= m.size(); i += 2) {
        float f = std::ldexp(static_cast<float>(static_cast<int32_t>(rng() % 2000001) - 1000000), -12);
        if (sd == D::fp32) {
          if (i % 4 == 0) std::memcpy(&m[i], &f, 4);
        } else {
          StoreFromFloat(&m[i], sd, f);
        }
      }
    }
    na.memory = da.memory;
    for (int b = 0; b < dnb; ++b) na.ptrs[b] = na.memory[b].data();
    for (int b = 0; b < snb; ++b) sp[b] = sa.ptrs[b];
    for (int b = 0; b < dnb; ++b) dp[b] = da.ptrs[b];
    CopyRegion(src, dst);
    RegionView ndst = dst;
    ndst.buffers = na.ptrs.data();
    NaiveCopy(src, ndst);
    for (int b = 0; b < dnb; ++b) ASSERT_EQ(da.memory[b], na.memory[b]) << "iteration " << iter;
  }
}

// Copies of 4 MiB and more stream their contiguous runs (non-temporal
// stores): runs of every length mod 64 bytes, at every alignment of source
// and destination, land exactly, and nothing around them is touched.
TEST(KernelsTest, LargeStridedCopiesStreamExactly) {
  std::mt19937 rng(99);
  for (uint32_t run : {4093u, 4096u, 4127u, 33u}) {
    const uint32_t rows = static_cast<uint32_t>((5ull << 20) / 2 / run + 1);  // over 4 MiB of bf16 in all
    for (uint64_t misalign : {0u, 1u, 7u}) {
      const uint32_t sstride = run + 61, dstride = run + 3;
      std::vector<uint16_t> src(rows * sstride + 16), dst(rows * dstride + 16), want;
      for (auto& x : src) x = static_cast<uint16_t>(rng());
      for (auto& x : dst) x = static_cast<uint16_t>(rng());
      want = dst;
      for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t c = 0; c < run; ++c) want[misalign + r * dstride + c] = src[misalign + 5 + r * sstride + c];
      char* sb[1] = {reinterpret_cast<char*>(src.data())};
      char* db[1] = {reinterpret_cast<char*>(dst.data())};
      CopyRegion(ViewOf(testing::MakeRegion(0, misalign + 5, {rows, run}, {sstride, 1}), sb, D::bf16),
                 ViewOf(testing::MakeRegion(0, misalign, {rows, run}, {dstride, 1}), db, D::bf16));
      ASSERT_EQ(dst, want) << "run " << run << ", misaligned by " << misalign << " elements";
    }
  }
}

TEST(KernelsTest, RejectsMismatchedCounts) {
  char* base[1] = {nullptr};
  try {
    CopyRegion(ContiguousView(base, 0, 4, D::fp32), ContiguousView(base, 0, 5, D::fp32));
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "region copy of 4 elements into 5 elements");
  }
}

// TransformRegion: with no offsets it is CopyRegion, bit for bit (finite
// values); a pack
// that subtracts an offset (wire bf16) and an unpack that adds it back give
// every value the wire holds exactly what it was; and the offset is applied
// in fp32 before one rounding per end (Megatron's w - 1 of a gamma near 1).
TEST(KernelsTest, TransformRegionGoesThroughTheModelsValues) {
  std::mt19937_64 rng(3);
  std::vector<uint16_t> src(256), a(256), b(256);
  for (uint16_t& x : src) {  // finite values: a NaN's payload is not kept through fp32 arithmetic
    do x = static_cast<uint16_t>(rng());
    while ((x & 0x7f80) == 0x7f80);
  }
  char* sp[1] = {reinterpret_cast<char*>(src.data())};
  char* ap[1] = {reinterpret_cast<char*>(a.data())};
  char* bp[1] = {reinterpret_cast<char*>(b.data())};
  CopyRegion(ContiguousView(sp, 0, 256, D::bf16), ContiguousView(ap, 0, 256, D::bf16));
  TransformRegion(ContiguousView(sp, 0, 256, D::bf16), ContiguousView(bp, 0, 256, D::bf16), Offsets{0, 0, D::bf16});
  EXPECT_EQ(a, b);
  // Values in [-2, 2) in steps of 2^-6: x - 1 and x + 1 are exact in bf16.
  for (size_t i = 0; i < src.size(); ++i) src[i] = FloatToBf16(static_cast<float>(static_cast<int>(i) - 128) / 64);
  TransformRegion(ContiguousView(sp, 0, 256, D::bf16), ContiguousView(ap, 0, 256, D::bf16), Offsets{-1, 0, D::bf16});
  TransformRegion(ContiguousView(ap, 0, 256, D::bf16), ContiguousView(bp, 0, 256, D::bf16), Offsets{0, -1, D::bf16});
  EXPECT_EQ(b, src);
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(Bf16ToFloat(a[i]), Bf16ToFloat(src[i]) + 1) << i;
  // A local copy does both at once: fp32 0.25 held as 0.25 - 1, into an
  // fp32 buffer held as 0.25 + 2, through a bf16 wire.
  float x = -0.75f, y = 0;
  char* xp[1] = {reinterpret_cast<char*>(&x)};
  char* yp[1] = {reinterpret_cast<char*>(&y)};
  TransformRegion(ContiguousView(xp, 0, 1, D::fp32), ContiguousView(yp, 0, 1, D::fp32), Offsets{-1, 2, D::bf16});
  EXPECT_EQ(y, 2.25f);
  // 1 + 2^-9 (a gamma just above 1) held as 2^-9: the wire (bf16) rounds 1 + 2^-9 to 1.
  x = 1.0f / 512;
  TransformRegion(ContiguousView(xp, 0, 1, D::fp32), ContiguousView(yp, 0, 1, D::fp32), Offsets{-1, 0, D::bf16});
  EXPECT_EQ(y, 1.0f);
  try {
    TransformRegion(ContiguousView(xp, 0, 1, D::fp8_e4m3), ContiguousView(yp, 0, 1, D::fp32), Offsets{1, 0, D::bf16});
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "no CPU kernel adds an offset to fp8_e4m3 values");
  }
}

}  // namespace
}  // namespace reshard
