#include "runtime/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "compiler/test.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/gloo_transport.h"
#include "runtime/synthetic.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using D = fb::Dtype;

TEST(E4m3Test, EncodesByHand) {
  EXPECT_EQ(FloatToE4m3(1.0f), 0x38);
  EXPECT_EQ(FloatToE4m3(-1.0f), 0xb8);
  EXPECT_EQ(FloatToE4m3(0.0f), 0x00);
  EXPECT_EQ(FloatToE4m3(-0.0f), 0x80);
  EXPECT_EQ(FloatToE4m3(448.0f), 0x7e);
  EXPECT_EQ(FloatToE4m3(0x1p-6f), 0x08);   // smallest normal
  EXPECT_EQ(FloatToE4m3(144.0f), 0x71);    // 1.125 * 2^7
}

TEST(E4m3Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToE4m3(1.0625f), 0x38);   // tie between 1 and 1.125: even mantissa 0
  EXPECT_EQ(FloatToE4m3(1.1875f), 0x3a);   // tie between 1.125 and 1.25: even mantissa 2
  EXPECT_EQ(FloatToE4m3(1.07f), 0x39);     // above the tie
  EXPECT_EQ(FloatToE4m3(149.333f), 0x71);  // 144 is nearer than 160
  EXPECT_EQ(FloatToE4m3(0x1.ep-7f), 0x08); // 0.9375 * 2^-6 rounds up into the normals
}

TEST(E4m3Test, SaturatesAndKeepsNan) {
  EXPECT_EQ(FloatToE4m3(464.0f), 0x7e);    // would round to 512 without saturation
  EXPECT_EQ(FloatToE4m3(1e30f), 0x7e);
  EXPECT_EQ(FloatToE4m3(INFINITY), 0x7e);
  EXPECT_EQ(FloatToE4m3(-INFINITY), 0xfe);
  EXPECT_EQ(FloatToE4m3(NAN), 0x7f);
  EXPECT_EQ(FloatToE4m3(-NAN) & 0x7f, 0x7f);
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xff)));
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0xfe), -448.0f);
}

TEST(E4m3Test, Subnormals) {
  EXPECT_EQ(FloatToE4m3(0x1p-9f), 0x01);        // smallest subnormal
  EXPECT_EQ(FloatToE4m3(0x1p-10f), 0x00);       // tie between 0 and 2^-9: even is 0
  EXPECT_EQ(FloatToE4m3(0x1.8p-9f), 0x02);      // tie between 1 and 2 units: even is 2
  EXPECT_EQ(FloatToE4m3(0x1.4p-9f), 0x01);      // 1.25 units
  EXPECT_EQ(FloatToE4m3(-7 * 0x1p-9f), 0x87);   // largest subnormal, negative
  EXPECT_EQ(FloatToE4m3(1e-30f), 0x00);
  EXPECT_EQ(E4m3ToFloat(0x01), 0x1p-9f);
  EXPECT_EQ(E4m3ToFloat(0x07), 7 * 0x1p-9f);
  // Every finite code point survives a round trip.
  for (int q = 0; q < 256; ++q) {
    if ((q & 0x7f) == 0x7f) continue;
    EXPECT_EQ(FloatToE4m3(E4m3ToFloat(static_cast<uint8_t>(q))), q) << q;
  }
}

TEST(ScaleTest, Fp32AndE8m0ByHand) {
  EXPECT_EQ(ScaleFromAmax(448.0f, false), 1.0f);
  EXPECT_EQ(ScaleFromAmax(3.0f, false), 3.0f / 448.0f);
  EXPECT_EQ(ScaleFromAmax(0.0f, false), 1.0f);         // zero block
  EXPECT_EQ(ScaleFromAmax(1e-45f, false), 1.0f);       // amax / 448 underflows
  EXPECT_EQ(ScaleFromAmax(3.0f, true), 0x1p-7f);       // floor(log2 3) - 8
  EXPECT_EQ(ScaleFromAmax(448.0f, true), 1.0f);
  EXPECT_EQ(ScaleFromAmax(500.0f, true), 1.0f);        // 500 then saturates to 448
  EXPECT_EQ(ScaleFromAmax(512.0f, true), 2.0f);
  EXPECT_EQ(ScaleFromAmax(0.0f, true), 1.0f);
  EXPECT_EQ(ScaleFromAmax(0x1p-140f, true), 0x1p-127f);  // clamped, float subnormal amax
  EXPECT_EQ(ScaleBits(0x1p-7f, true), 120u);
  EXPECT_EQ(ScaleBits(0x1p-127f, true), 0u);
  EXPECT_EQ(E8m0ToFloat(120), 0x1p-7f);
  EXPECT_EQ(E8m0ToFloat(0), 0x1p-127f);
  EXPECT_TRUE(std::isnan(E8m0ToFloat(0xff)));
  EXPECT_EQ(FloorLog2(0x1p-140f), -140);
  EXPECT_EQ(FloorLog2(0x1p-149f), -149);
  EXPECT_EQ(AmaxStep(AmaxStep(AmaxStep(0, NAN), -INFINITY), -2.0f), 2.0f);
}

// Memory for one view in quant form, row-major.
struct Mem {
  std::vector<char> bytes;
  char* base[1];
  RegionView view;
  Mem(D dtype, std::vector<uint64_t> shape) {
    uint64_t n = 1;
    for (uint64_t s : shape) n *= s;
    bytes.assign(n * DtypeSize(dtype), 0);
    base[0] = bytes.data();
    view.buffers = base;
    view.ndim = static_cast<int>(shape.size());
    uint64_t stride = 1;
    for (int k = view.ndim - 1; k >= 0; --k) view.shape[k] = shape[k], view.stride[k] = stride, stride *= shape[k];
    view.dtype = dtype;
  }
  void SetBf16(const std::vector<float>& v) {
    for (size_t i = 0; i < v.size(); ++i) StoreFromFloat(bytes.data() + 2 * i, D::bf16, v[i]);
  }
  uint8_t Byte(size_t i) const { return static_cast<uint8_t>(bytes[i]); }
  float Fp32(size_t i) const {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  }
  float Bf16(size_t i) const { return LoadAsFloat(bytes.data() + 2 * i, D::bf16); }
};

TEST(QuantRegionTest, Fp32BlockScalesWithZeroBlockNanAndInfinity) {
  // 2x4 values, blocks of 2x2: the left block {1, -2, 3, 0.5}, the right one zeros but a NaN and -inf.
  Mem src(D::bf16, {2, 4}), dst(D::fp8_e4m3, {2, 4}), scale(D::fp32, {1, 2});
  src.SetBf16({1, -2, 0, NAN, 3, 0.5f, -INFINITY, 0});
  QuantArgs a;
  a.kind = fb::QuantKind::quantize;
  a.src = src.view, a.dst = dst.view, a.scale = scale.view;
  a.block[0] = 2, a.block[1] = 2;
  QuantRegion(a);
  EXPECT_EQ(scale.Fp32(0), 3.0f / 448.0f);
  EXPECT_EQ(scale.Fp32(1), 1.0f);  // nothing finite but zeros
  // 1/s = 149.3 -> 144; -2/s = -298.7 -> -288; 3/s = 448; 0.5/s = 74.7 -> 72.
  EXPECT_EQ(dst.Byte(0), 0x71);
  EXPECT_EQ(dst.Byte(1), 0xf9);
  EXPECT_EQ(dst.Byte(4), 0x7e);
  EXPECT_EQ(dst.Byte(5), 0x69);
  EXPECT_EQ(dst.Byte(2), 0x00);
  EXPECT_EQ(dst.Byte(3), 0x7f);  // NaN stays NaN
  EXPECT_EQ(dst.Byte(6), 0xfe);  // -inf saturates
  EXPECT_EQ(dst.Byte(7), 0x00);
  // Back: q * s rounded to bf16.
  Mem back(D::bf16, {2, 4});
  QuantArgs d;
  d.kind = fb::QuantKind::dequantize;
  d.src = dst.view, d.dst = back.view, d.scale = scale.view;
  d.block[0] = 2, d.block[1] = 2;
  QuantRegion(d);
  EXPECT_EQ(back.Bf16(0), Bf16ToFloat(FloatToBf16(144.0f * (3.0f / 448.0f))));
  EXPECT_EQ(back.Bf16(4), 3.0f);
  EXPECT_TRUE(std::isnan(back.Bf16(3)));
  EXPECT_EQ(back.Bf16(6), -448.0f);
}

TEST(QuantRegionTest, Mxfp8E8m0ScalesAndSaturation) {
  // Blocks of 1x2 (MXFP8 uses 1x32; the rule is the same).
  Mem src(D::bf16, {1, 6}), dst(D::fp8_e4m3, {1, 6}), scale(D::e8m0, {1, 3});
  src.SetBf16({1, -2, 3, 0.5f, 500, 1});
  QuantArgs a;
  a.src = src.view, a.dst = dst.view, a.scale = scale.view;
  a.block[0] = 1, a.block[1] = 2;
  QuantRegion(a);
  EXPECT_EQ(scale.Byte(0), 127 - 8 + 1);  // amax 2: 2^(1-8)
  EXPECT_EQ(scale.Byte(1), 127 - 8 + 1);  // amax 3: floor(log2 3) = 1
  EXPECT_EQ(scale.Byte(2), 127);          // amax 500: 2^0
  EXPECT_EQ(dst.Byte(0), 0x70);           // 1 * 2^7 = 128
  EXPECT_EQ(dst.Byte(1), 0xf8);           // -256
  EXPECT_EQ(dst.Byte(2), 0x7c);           // 384
  EXPECT_EQ(dst.Byte(3), 0x68);           // 64
  EXPECT_EQ(dst.Byte(4), 0x7e);           // 500 saturates to 448
  EXPECT_EQ(dst.Byte(5), 0x38);           // 1
}

TEST(QuantRegionTest, PerChannelAndPerTensorAreBlockShapes) {
  Mem src(D::bf16, {2, 3});
  src.SetBf16({1, 2, 4, -8, 0, 0});
  {
    Mem dst(D::fp8_e4m3, {2, 3}), scale(D::fp32, {2, 1});
    QuantArgs a;
    a.src = src.view, a.dst = dst.view, a.scale = scale.view;
    a.block[0] = 1, a.block[1] = 3;  // one scale per output channel (row)
    QuantRegion(a);
    EXPECT_EQ(scale.Fp32(0), 4.0f / 448.0f);
    EXPECT_EQ(scale.Fp32(1), 8.0f / 448.0f);
    EXPECT_EQ(dst.Byte(2), 0x7e);
    EXPECT_EQ(dst.Byte(3), 0xfe);
  }
  {
    Mem dst(D::fp8_e4m3, {2, 3}), scale(D::fp32, {1, 1});
    QuantArgs a;
    a.src = src.view, a.dst = dst.view, a.scale = scale.view;
    a.block[0] = 2, a.block[1] = 3;  // one scale for the tensor
    QuantRegion(a);
    EXPECT_EQ(scale.Fp32(0), 8.0f / 448.0f);
    EXPECT_EQ(dst.Byte(3), 0xfe);
    EXPECT_EQ(dst.Byte(2), FloatToE4m3(4.0f / (8.0f / 448.0f)));  // 224
    EXPECT_EQ(dst.Byte(2), 0x76);
  }
}

// The amax path: a row of 6 values per channel (block 1x6) split at col 4
// between two senders. Each sender's partial amaxes, the receiver's scales of
// their maximum, and its values quantized with them equal the whole row
// quantized at once.
TEST(QuantRegionTest, PartialAmaxesThenScaledQuantizeEqualTheWholeBlock) {
  Mem whole(D::bf16, {2, 6});
  const std::vector<float> v = {1, -2, 0, NAN, 3, 0.5f, -8, 0, 0, 0, 2, -INFINITY};
  whole.SetBf16(v);
  Mem ref_q(D::fp8_e4m3, {2, 6}), ref_s(D::fp32, {2, 1});
  QuantArgs ref;
  ref.src = whole.view, ref.dst = ref_q.view, ref.scale = ref_s.view;
  ref.block[0] = 1, ref.block[1] = 6;
  QuantRegion(ref);
  // Sender 0 holds cols 0..4, sender 1 cols 4..6 (origin 4 within the block).
  Mem left(D::bf16, {2, 4}), right(D::bf16, {2, 2});
  left.SetBf16({1, -2, 0, NAN, -8, 0, 0, 0});
  right.SetBf16({3, 0.5f, 2, -INFINITY});
  Mem grids(D::fp32, {2, 2, 1});  // two grids of 2x1 block amaxes
  for (int g = 0; g < 2; ++g) {
    Mem& part = g == 0 ? left : right;
    QuantArgs a;
    a.kind = fb::QuantKind::amax;
    a.src = part.view;
    a.dst = grids.view;
    a.dst.ndim = 2;
    a.dst.shape[0] = 2, a.dst.shape[1] = 1, a.dst.stride[0] = 1, a.dst.stride[1] = 1;
    a.dst.offset = 2 * g;
    a.origin[1] = g == 0 ? 0 : 4;
    a.block[0] = 1, a.block[1] = 6;
    QuantRegion(a);
  }
  EXPECT_EQ(grids.Fp32(0), 2.0f);  // |-2|, the NaN ignored
  EXPECT_EQ(grids.Fp32(1), 8.0f);
  EXPECT_EQ(grids.Fp32(2), 3.0f);
  EXPECT_EQ(grids.Fp32(3), 2.0f);  // -inf does not count
  Mem scale(D::fp32, {2, 1});
  QuantArgs s;
  s.kind = fb::QuantKind::scale_from_amax;
  s.src = grids.view;
  s.dst = scale.view;
  s.block[0] = 1, s.block[1] = 6;
  QuantRegion(s);
  EXPECT_EQ(scale.Fp32(0), ref_s.Fp32(0));
  EXPECT_EQ(scale.Fp32(1), ref_s.Fp32(1));
  EXPECT_EQ(scale.Fp32(0), 3.0f / 448.0f);
  // The receiver needs cols 2..6 of both rows: origin 2 within the block.
  Mem need(D::bf16, {2, 4}), q(D::fp8_e4m3, {2, 4});
  need.SetBf16({0, NAN, 3, 0.5f, 0, 0, 2, -INFINITY});
  QuantArgs z;
  z.kind = fb::QuantKind::quantize_scaled;
  z.src = need.view, z.dst = q.view, z.scale = scale.view;
  z.origin[1] = 2;
  z.block[0] = 1, z.block[1] = 6;
  QuantRegion(z);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(q.Byte(r * 4 + c), ref_q.Byte(r * 6 + 2 + c)) << r << "," << c;
}

TEST(QuantRegionTest, AmaxGridsStartBeforeTheirPartAndE8m0ScalesOfZeroGrids) {
  // Blocks of 1x2 (MXFP8's rule, shorter); the part is cols 3..6 of a 6-col grid of 3 blocks:
  // block 0 gets nothing (0), block 1 col 3, block 2 cols 4..5.
  Mem part(D::bf16, {1, 3}), grid(D::fp32, {1, 3});
  part.SetBf16({-5, 1, 0.25f});
  QuantArgs a;
  a.kind = fb::QuantKind::amax;
  a.src = part.view, a.dst = grid.view;
  a.origin[1] = 3;
  a.block[0] = 1, a.block[1] = 2;
  QuantRegion(a);
  EXPECT_EQ(grid.Fp32(0), 0.0f);
  EXPECT_EQ(grid.Fp32(1), 5.0f);
  EXPECT_EQ(grid.Fp32(2), 1.0f);
  // One grid all zeros and the other from above: e8m0 scales of the maxima; a block no grid saw is zero: scale 1.
  Mem grids(D::fp32, {2, 1, 3}), scale(D::e8m0, {1, 3});
  std::memcpy(grids.bytes.data() + 12, grid.bytes.data(), 12);
  QuantArgs s;
  s.kind = fb::QuantKind::scale_from_amax;
  s.src = grids.view, s.dst = scale.view;
  s.block[0] = 1, s.block[1] = 2;
  QuantRegion(s);
  EXPECT_EQ(scale.Byte(0), 127);          // amax 0: scale 1
  EXPECT_EQ(scale.Byte(1), 127 - 8 + 2);  // amax 5: 2^(2-8)
  EXPECT_EQ(scale.Byte(2), 127 - 8 + 0);  // amax 1: 2^-8
}

TEST(QuantRegionTest, AmaxKindsRefuseMismatchedShapes) {
  Mem part(D::bf16, {2, 4}), grid(D::fp32, {2, 1}), fp8(D::fp8_e4m3, {2, 4});
  QuantArgs a;
  a.kind = fb::QuantKind::amax;
  a.src = part.view, a.dst = grid.view;
  a.origin[1] = 3;
  a.block[0] = 1, a.block[1] = 4;  // cols 3..7 reach a second block the grid lacks
  EXPECT_THROW(CheckQuantArgs(a), Error);
  a.origin[1] = 0;
  EXPECT_NO_THROW(CheckQuantArgs(a));
  a.dst = fp8.view;  // amaxes are fp32
  EXPECT_THROW(CheckQuantArgs(a), Error);
  QuantArgs s;
  s.kind = fb::QuantKind::scale_from_amax;
  s.src = grid.view, s.dst = grid.view;  // no leading mode of grids
  s.block[0] = 1, s.block[1] = 4;
  EXPECT_THROW(CheckQuantArgs(s), Error);
  Mem scale(D::fp32, {2, 1});
  QuantArgs z;
  z.kind = fb::QuantKind::quantize_scaled;
  z.src = part.view, z.dst = fp8.view, z.scale = scale.view;
  z.block[0] = 1, z.block[1] = 4;
  EXPECT_NO_THROW(CheckQuantArgs(z));
  z.origin[1] = 1;  // cols 1..5 of a 4-col block: two blocks per row, the scale has one
  EXPECT_THROW(CheckQuantArgs(z), Error);
}

TEST(QuantRegionTest, QuantizeKeepsASubBoxOfWholeBlocks) {
  // A destination that holds rows 1..3, cols 2..4 of a 3x4 block cover (blocks 2x2,
  // the last block row partial at the tensor edge) still gets every block's scale.
  Mem src(D::fp32, {3, 4});
  for (int i = 0; i < 12; ++i) StoreFromFloat(src.bytes.data() + 4 * i, D::fp32, static_cast<float>(i + 1));
  Mem dst(D::fp8_e4m3, {2, 2}), scale(D::fp32, {2, 2});
  QuantArgs a;
  a.src = src.view, a.dst = dst.view, a.scale = scale.view;
  a.block[0] = 2, a.block[1] = 2;
  a.origin[0] = 1, a.origin[1] = 2;
  QuantRegion(a);
  EXPECT_EQ(scale.Fp32(0), 6.0f / 448.0f);   // {1,2,5,6}
  EXPECT_EQ(scale.Fp32(1), 8.0f / 448.0f);   // {3,4,7,8}
  EXPECT_EQ(scale.Fp32(2), 10.0f / 448.0f);  // {9,10}
  EXPECT_EQ(scale.Fp32(3), 12.0f / 448.0f);  // {11,12}
  EXPECT_EQ(dst.Byte(0), FloatToE4m3(7.0f / (8.0f / 448.0f)));
  EXPECT_EQ(dst.Byte(1), 0x7e);  // 8 is its block's amax
  EXPECT_EQ(dst.Byte(2), FloatToE4m3(11.0f / (12.0f / 448.0f)));
  EXPECT_EQ(dst.Byte(3), 0x7e);
  // Dequantizing that sub-box: its first element sits at (1, 0) of block (0, 1).
  Mem back(D::fp32, {2, 2}), sub_scale(D::fp32, {2, 1});
  std::memcpy(sub_scale.bytes.data(), scale.bytes.data() + 4, 4);
  std::memcpy(sub_scale.bytes.data() + 4, scale.bytes.data() + 12, 4);
  QuantArgs d;
  d.kind = fb::QuantKind::dequantize;
  d.src = dst.view, d.dst = back.view, d.scale = sub_scale.view;
  d.block[0] = 2, d.block[1] = 2;
  d.origin[0] = 1, d.origin[1] = 0;
  QuantRegion(d);
  EXPECT_EQ(back.Fp32(1), 8.0f);
  EXPECT_EQ(back.Fp32(3), 12.0f);
  EXPECT_EQ(back.Fp32(0), E4m3ToFloat(dst.Byte(0)) * (8.0f / 448.0f));
}

TEST(QuantRegionTest, ShapeErrors) {
  Mem src(D::bf16, {2, 4}), dst(D::fp8_e4m3, {2, 4}), scale(D::fp32, {1, 1});
  QuantArgs a;
  a.src = src.view, a.dst = dst.view, a.scale = scale.view;
  a.block[0] = 2, a.block[1] = 2;
  try {
    QuantRegion(a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "quantize: scale (1,1) should have 1x2 blocks of 2x2 for src (2,4)");
  }
  a.scale = Mem(D::bf16, {1, 2}).view;
  try {
    CheckQuantArgs(a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "quantize: scales are fp32 or e8m0, not bf16");
  }
  a.scale = scale.view;
  a.dst = src.view;
  try {
    CheckQuantArgs(a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "quantize: dst is bf16, expected fp8_e4m3");
  }
}

}  // namespace
}  // namespace reshard

namespace reshard {
namespace {

using testing::QuantPath;

// Runs both ranks of a quant plan over Gloo; per rank "" or what was wrong.
std::vector<testing::RankOutcome> RunQuantPlan(const std::vector<uint8_t>& bytes) {
  testing::TempDir dir;
  return testing::RunRanks(2, [&](int rank) -> std::string {
    Plan plan = Plan::from_bytes(bytes, "q.rsplan");
    GlooOptions options;
    options.store_dir = dir.path();
    options.timeout = std::chrono::milliseconds(20000);
    GlooTransport transport(static_cast<uint32_t>(rank), 2, options);
    SyntheticRun run = RunSynthetic(plan, static_cast<uint32_t>(rank), transport);
    std::string msg = run.check.wrong ? std::to_string(run.check.wrong) + " wrong of " + std::to_string(run.check.checked) : "";
    for (const WrongElement& w : run.check.first) msg.append("\n").append(FormatWrong(w));
    if (msg.empty() && rank == 1) return "checked " + std::to_string(run.check.checked);
    return msg;
  });
}

TEST(QuantGlooTest, EveryPathMatchesTheReferenceQuantization) {
  // Rank 1 checks its 16 values and, when quantized, the 4 scales of the two block rows it touches.
  for (auto [path, checked] : {std::pair{QuantPath::requantize, 20}, std::pair{QuantPath::sender_quantizes, 20},
                               std::pair{QuantPath::fp8_source, 16}}) {
    auto out = RunQuantPlan(testing::BuildPlan(testing::QuantPlan(path)));
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].exit_code, 0) << out[0].message;
    EXPECT_EQ(out[0].message, "");
    EXPECT_EQ(out[1].exit_code, 1) << out[1].message;  // RunRanks: a message means exit 1
    EXPECT_EQ(out[1].message, "checked " + std::to_string(checked)) << static_cast<int>(path);
  }
}

TEST(QuantGlooTest, AWrongOriginIsCaughtElementForElement) {
  testing::PlanSpec spec = testing::QuantPlan(QuantPath::requantize);
  fb::QuantOp& op = spec.programs[1].quant_ops[0];
  op = testing::MakeQuant(op.step(), op.kind(), op.scale(), {2, 0}, {2, 4});  // rows 2..4 instead of 1..3
  auto out = RunQuantPlan(testing::BuildPlan(spec));
  EXPECT_NE(out[1].message.find(" wrong of 20\ntensor 'w' [1,0] in buffer 'w': expected "), std::string::npos)
      << out[1].message;
}

// The error opening rank `rank`'s program of a plan, or "(opened)".
std::string OpenError(std::vector<uint8_t> bytes, uint32_t rank) {
  Plan plan = Plan::from_bytes(std::move(bytes), "q.rsplan");
  try {
    plan.program(rank);
  } catch (const Error& e) {
    return e.what();
  }
  return "(opened)";
}

TEST(QuantPlanTest, BadQuantOpsAreRefusedOnOpen) {
  testing::PlanSpec spec = testing::QuantPlan(QuantPath::requantize);
  spec.programs[1].quant_ops[0] =
      testing::MakeQuant(1, fb::QuantKind::quantize, spec.programs[1].quant_ops[0].scale(), {1, 0}, {4, 4});
  EXPECT_EQ(OpenError(testing::BuildPlan(spec), 1),
            "q.rsplan: rank 1: step 1 (unpack): quantize: scale (2,2) should have 1x2 blocks of 4x4 for src (4,8)");
  spec = testing::QuantPlan(QuantPath::requantize);
  spec.programs[1].quant_ops[0] =
      testing::MakeQuant(0, fb::QuantKind::quantize, spec.programs[1].quant_ops[0].scale(), {1, 0}, {2, 4});
  EXPECT_EQ(OpenError(testing::BuildPlan(spec), 1),
            "q.rsplan: rank 1: step 0 (recv): has a quant op, which only pack, unpack and copy steps take");
  spec = testing::QuantPlan(QuantPath::requantize);
  spec.programs[1].quant_ops.clear();
  EXPECT_EQ(OpenError(testing::BuildPlan(spec), 1),
            "q.rsplan: rank 1: step 1 (unpack): converts bf16 to fp8_e4m3 without a quant op "
            "(quantized buffers are read and written by quantize and dequantize steps)");
}

// The amax kinds are checked on open like the others: where they may run,
// which regions they name. Mutations of a compiled plan whose split blocks
// take the amax path (tiny-dense into per-channel FP8 down_proj, training TP2
// cutting its columns).
TEST(QuantPlanTest, BadAmaxOpsAreRefusedOnOpen) {
  nlohmann::json infer = testing::LoadSample("tiny-dense/infer.json");
  infer["buffers"].push_back(nlohmann::json::parse(R"({"name": "model.layers.{layer}.mlp.down_proj.weight",
      "tensor": "model.layers.{layer}.mlp.down_proj.weight", "quant": {"format": "fp8_e4m3", "scale": "channel",
      "scale_name": "model.layers.{layer}.mlp.down_proj.weight_scale"}})"));
  const CompileInputs in = ParseInputs(testing::LoadSample("tiny-dense/model.json"),
                                       testing::LoadSample("tiny-dense/train.json"), infer,
                                       testing::LoadSample("clusters/dgx-h100.json"));
  const PlanIR good = BuildPlan(in, CompileOptions{});
  // The first step of `rank` with a quant op of `kind`, and its op.
  auto find = [](PlanIR& ir, uint32_t rank, QuantKind kind) -> std::pair<Step*, QuantOpIR*> {
    for (Round& r : ir.ranks[rank].rounds)
      for (std::vector<Step>* v : {&r.local, &r.unpack})
        for (Step& st : *v)
          if (st.quant >= 0 && ir.ranks[rank].quant_ops[st.quant].kind == kind)
            return {&st, &ir.ranks[rank].quant_ops[st.quant]};
    return {nullptr, nullptr};
  };
  auto refused = [&](const PlanIR& ir, uint32_t rank) { return OpenError(EmitPlan(in, ir), rank); };
  ASSERT_EQ(refused(good, 8), "(opened)");
  ASSERT_EQ(refused(good, 0), "(opened)");
  struct Mutation {
    uint32_t rank;   // 0: a training rank (sends amaxes), 8: an inference rank (takes scales)
    QuantKind kind;  // the first step with an op of this kind is changed
    std::function<void(RankProgram&, Step&, QuantOpIR&)> change;
    const char* error;
  };
  const Mutation cases[] = {
      {0, QuantKind::amax, [](RankProgram&, Step&, QuantOpIR& q) { q.kind = QuantKind::scale_from_amax; },
       "a scale_from_amax op on a pack step"},
      {0, QuantKind::amax, [](RankProgram&, Step& st, QuantOpIR& q) { q.scale = st.src; },
       "an amax op takes no scale region"},
      {8, QuantKind::quantize_scaled, [](RankProgram&, Step&, QuantOpIR& q) { q.scale = kNoRegion; },
       "the quantize_scaled op has no scale region"},
      {8, QuantKind::scale_from_amax, [](RankProgram&, Step& st, QuantOpIR&) { st.wire = Dtype::bf16; },
       "amaxes are fp32, the step's wire is bf16"},
      {8, QuantKind::scale_from_amax, [](RankProgram& p, Step& st, QuantOpIR&) { p.regions[st.src].ndim -= 1; },
       "scale_from_amax: src"},  // the grids' leading mode dropped
  };
  for (const Mutation& m : cases) {
    PlanIR ir = good;
    auto [step, op] = find(ir, m.rank, m.kind);
    ASSERT_NE(step, nullptr) << m.error;
    m.change(ir.ranks[m.rank], *step, *op);
    const std::string why = refused(ir, m.rank);
    EXPECT_NE(why.find(m.error), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace reshard
