// CPU tests of the device copy path: which copies become memcpy, memcpy2d or
// kernel launches, and the kernel's own per-group code run on the host against
// CopyRegion on random regions, every byte compared.
#include "runtime/cuda/region_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/quant.h"

namespace reshard::cuda {
namespace {

using D = fb::Dtype;

// Host memory of one side: `count` buffers of `bytes` each (16-byte aligned
// plus `misalign` bytes) and the pointer table a RegionView indexes.
struct Memory {
  std::vector<std::unique_ptr<char[]>> storage;
  std::vector<char*> ptrs;
  size_t bytes = 0;

  Memory(size_t count, size_t bytes_each, size_t misalign = 0) : bytes(bytes_each) {
    for (size_t i = 0; i < count; ++i) {
      storage.emplace_back(new char[bytes_each + 32]);
      char* p = storage.back().get();
      p += (16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 + misalign;
      ptrs.push_back(p);
    }
  }
  void Fill(std::mt19937_64& rng) {
    for (char* p : ptrs) {
      for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<char>(rng());
    }
  }
  void Poison() {
    for (char* p : ptrs) std::memset(p, 0x7d, bytes);
  }
  std::vector<char> Bytes() const {
    std::vector<char> out;
    for (char* p : ptrs) out.insert(out.end(), p, p + bytes);
    return out;
  }
  void Restore(const std::vector<char>& b) {
    for (size_t i = 0; i < ptrs.size(); ++i) std::memcpy(ptrs[i], b.data() + i * bytes, bytes);
  }
};

RegionView View(Memory& m, uint64_t offset, std::vector<uint64_t> shape, std::vector<uint64_t> stride, D dtype,
                uint8_t buffer_modes = 0) {
  return ViewOver(m.ptrs.data(), offset, shape, stride, dtype, buffer_modes);
}

// Copies with CopyRegion and with the device plan run on the host from the
// same poisoned destination; every byte must agree, and the result must not
// be all poison.
CopyPlan ExpectSameAsCpu(const RegionView& src, Memory& dst_mem, const RegionView& dst, bool memcpy2d = false) {
  dst_mem.Poison();
  const std::vector<char> poisoned = dst_mem.Bytes();
  CopyRegion(src, dst);
  const std::vector<char> want = dst_mem.Bytes();
  EXPECT_NE(want, poisoned);
  dst_mem.Restore(poisoned);
  CopyPlan plan = PlanCopy(src, dst, memcpy2d);
  RunOnHost(plan);
  const std::vector<char> got = dst_mem.Bytes();
  size_t wrong = 0;
  for (size_t i = 0; i < want.size(); ++i) wrong += want[i] != got[i];
  EXPECT_EQ(wrong, 0u) << "of " << want.size() << " bytes, plan " << CopyKindName(plan.kind);
  return plan;
}

TEST(RegionPlanTest, ContiguousSameDtypeIsOneMemcpy) {
  std::mt19937_64 rng(1);
  Memory a(1, 4096), b(1, 4096);
  a.Fill(rng);
  CopyPlan p = ExpectSameAsCpu(View(a, 8, {4, 16}, {16, 1}, D::bf16), b, View(b, 0, {64}, {1}, D::bf16));
  EXPECT_EQ(p.kind, CopyKind::kMemcpy);
  EXPECT_EQ(p.width, 128u);
  EXPECT_EQ(p.src, a.ptrs[0] + 16);
}

TEST(RegionPlanTest, RowsOfOneDtypeAreOneMemcpy2DWhenAsked) {
  std::mt19937_64 rng(2);
  Memory a(1, 8192), b(1, 8192);
  a.Fill(rng);
  // Columns 4..12 of an [8,16] fp32 matrix into a contiguous [8,8].
  CopyPlan p = ExpectSameAsCpu(View(a, 4, {8, 8}, {16, 1}, D::fp32), b, View(b, 0, {64}, {1}, D::fp32), true);
  EXPECT_EQ(p.kind, CopyKind::kMemcpy2D);
  EXPECT_EQ(p.height, 8u);
  EXPECT_EQ(p.width, 32u);
  EXPECT_EQ(p.spitch, 64u);
  EXPECT_EQ(p.dpitch, 32u);
  // Strided on both sides, with another pitch.
  p = ExpectSameAsCpu(View(a, 4, {8, 8}, {16, 1}, D::fp32), b, View(b, 2, {8, 8}, {24, 1}, D::fp32), true);
  EXPECT_EQ(p.kind, CopyKind::kMemcpy2D);
  EXPECT_EQ(p.dpitch, 96u);
  // By default the same rows go through the copy kernel.
  p = ExpectSameAsCpu(View(a, 4, {8, 8}, {16, 1}, D::fp32), b, View(b, 2, {8, 8}, {24, 1}, D::fp32));
  EXPECT_EQ(p.kind, CopyKind::kKernel);
  EXPECT_EQ(p.launches.at(0).vec, 2);  // offsets 4 and 2 fp32: 8-byte groups
  // Contiguous copies stay one memcpy.
  EXPECT_EQ(PlanCopy(View(a, 0, {64}, {1}, D::fp32), View(b, 0, {8, 8}, {8, 1}, D::fp32)).kind, CopyKind::kMemcpy);
}

TEST(RegionPlanTest, ConversionTransposeAndBufferModesAreKernels) {
  std::mt19937_64 rng(3);
  Memory a(1, 8192), b(1, 8192);
  a.Fill(rng);
  CopyPlan p = ExpectSameAsCpu(View(a, 4, {8, 8}, {16, 1}, D::bf16), b, View(b, 0, {64}, {1}, D::fp32));
  EXPECT_EQ(p.kind, CopyKind::kKernel);
  ASSERT_EQ(p.launches.size(), 1u);
  EXPECT_EQ(p.launches[0].vec, 4);  // 8-byte loads, 16-byte stores
  p = ExpectSameAsCpu(View(a, 0, {16, 8}, {1, 16}, D::fp16), b, View(b, 0, {16, 8}, {8, 1}, D::fp16));
  EXPECT_EQ(p.kind, CopyKind::kKernel);
  EXPECT_EQ(p.launches[0].vec, 1);  // transposed: no run of two
  p = ExpectSameAsCpu(View(a, 0, {256}, {1}, D::bf16), b, View(b, 0, {256}, {1}, D::bf16));
  EXPECT_EQ(p.kind, CopyKind::kMemcpy);
}

TEST(RegionPlanTest, MisalignedBaseNarrowsTheVector) {
  std::mt19937_64 rng(4);
  Memory a(1, 4096), b(1, 4096, 2);  // b's buffer is 2 bytes off 16
  a.Fill(rng);
  CopyPlan p = ExpectSameAsCpu(View(a, 0, {32, 8}, {16, 1}, D::fp32), b, View(b, 0, {256}, {1}, D::bf16));
  ASSERT_EQ(p.kind, CopyKind::kKernel);
  EXPECT_EQ(p.launches[0].vec, 1);
  Memory c(1, 4096, 4);  // 4 bytes off: pairs of bf16 still align
  p = ExpectSameAsCpu(View(a, 0, {32, 8}, {16, 1}, D::fp32), c, View(c, 0, {256}, {1}, D::bf16));
  EXPECT_EQ(p.launches[0].vec, 2);
}

TEST(RegionPlanTest, ManyBuffersSplitIntoLaunchesOfAtMostMaxSlots) {
  std::mt19937_64 rng(5);
  // 200 expert buffers of [4, 32] bf16; rows 1..3 of each into staging.
  Memory experts(200, 4 * 32 * 2), staging(1, 200 * 2 * 32 * 2);
  experts.Fill(rng);
  RegionView src = View(experts, 32, {200, 2, 32}, {1, 32, 1}, D::bf16, 0b001);
  CopyPlan p = ExpectSameAsCpu(src, staging, View(staging, 0, {200 * 64}, {1}, D::bf16));
  ASSERT_EQ(p.kind, CopyKind::kKernel);
  EXPECT_GT(p.launches.size(), 3u);
  for (const CopyLaunch& l : p.launches) {
    EXPECT_LE((l.begin + l.count - 1) / l.src.block - l.src.first_block + 1, static_cast<uint64_t>(kMaxSlots));
  }
  // And back, converting, through the innermost mode selecting buffers (one
  // element per buffer run).
  Memory back(200, 4 * 32 * 4);
  RegionView inner = View(back, 5, {64, 200}, {1, 1}, D::fp32, 0b10);
  p = ExpectSameAsCpu(View(staging, 0, {64, 200}, {1, 64}, D::bf16), back, inner);
  ASSERT_EQ(p.kind, CopyKind::kKernel);
  EXPECT_EQ(p.launches[0].vec, 1);
}

// Random boxes of 1..4 dims stored in random dim orders with padding, copied
// between two such layouts with every pair of dtypes.
TEST(RegionPlanTest, RandomLayoutsMatchCopyRegion) {
  std::mt19937_64 rng(6);
  const D dtypes[] = {D::bf16, D::fp16, D::fp32};
  int kinds[4] = {0, 0, 0, 0};
  for (int iter = 0; iter < 300; ++iter) {
    const int ndim = 1 + static_cast<int>(rng() % 4);
    std::vector<uint64_t> box(ndim);
    for (auto& n : box) n = 1 + rng() % (ndim <= 2 ? 40 : 9);
    if (rng() % 3 == 0) box[ndim - 1] = 8 * (1 + rng() % 6);  // vector-friendly inner dims
    auto layout = [&](Memory** mem, D dtype, std::vector<std::unique_ptr<Memory>>& keep) {
      std::vector<int> order(ndim);
      std::iota(order.begin(), order.end(), 0);
      if (rng() % 2) std::shuffle(order.begin(), order.end(), rng);
      std::vector<uint64_t> stride(ndim);
      uint64_t s = 1;
      for (int i = ndim - 1; i >= 0; --i) {
        stride[order[i]] = s;
        s *= box[order[i]] + (rng() % 3 == 0 ? rng() % 5 : 0);
      }
      const uint64_t offset = rng() % 2 ? 0 : rng() % 9;
      keep.push_back(std::make_unique<Memory>(1, (s + offset + 1) * DtypeSize(dtype)));
      *mem = keep.back().get();
      return View(**mem, offset, box, stride, dtype);
    };
    std::vector<std::unique_ptr<Memory>> keep;
    Memory *sm = nullptr, *dm = nullptr;
    const D sd = dtypes[rng() % 3], dd = dtypes[rng() % 3];
    RegionView src = layout(&sm, sd, keep);
    RegionView dst = layout(&dm, dd, keep);
    sm->Fill(rng);
    CopyPlan p = ExpectSameAsCpu(src, *dm, dst);
    if (PlanCopy(src, dst, true).kind == CopyKind::kMemcpy2D) {
      EXPECT_EQ(p.kind, CopyKind::kKernel);
      p = ExpectSameAsCpu(src, *dm, dst, true);
    }
    ++kinds[static_cast<int>(p.kind)];
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "iteration " << iter;
      return;
    }
  }
  // All three ways show up.
  EXPECT_GT(kinds[static_cast<int>(CopyKind::kMemcpy)], 0);
  EXPECT_GT(kinds[static_cast<int>(CopyKind::kMemcpy2D)], 0);
  EXPECT_GT(kinds[static_cast<int>(CopyKind::kKernel)], 0);
}

// A transform (a buffer's offset, kernels.h TransformRegion) is always a
// kernel, never a memcpy, and its launches compute what the CPU kernel does,
// bit for bit, on random regions, dtypes and offsets (values any bits:
// NaNs, infinities and subnormals included).
TEST(RegionPlanTest, TransformLaunchesMatchTransformRegion) {
  std::mt19937_64 rng(11);
  const D dtypes[] = {D::bf16, D::fp16, D::fp32};
  const float offsets[] = {0, -1, 1, 0.5f, -3.25f};
  for (int iter = 0; iter < 200; ++iter) {
    const uint64_t rows = 1 + rng() % 9, cols = 1 + rng() % 40;
    const D sd = dtypes[rng() % 3], dd = dtypes[rng() % 3];
    Offsets o;
    o.from = offsets[rng() % 5];
    o.to = offsets[rng() % 5];
    o.wire = dtypes[rng() % 3];
    Memory sm(1, rows * cols * DtypeSize(sd)), dm(1, rows * (cols + 3) * DtypeSize(dd));
    sm.Fill(rng);
    const RegionView src = View(sm, 0, {rows, cols}, {cols, 1}, sd);
    // The destination transposed or padded, at random.
    const RegionView dst = rng() % 2 ? View(dm, 0, {rows, cols}, {1, rows}, dd) : View(dm, 0, {rows, cols}, {cols + 3, 1}, dd);
    dm.Poison();
    const std::vector<char> poisoned = dm.Bytes();
    TransformRegion(src, dst, o);
    const std::vector<char> want = dm.Bytes();
    dm.Restore(poisoned);
    const CopyPlan plan = PlanTransform(src, dst, o);
    EXPECT_EQ(plan.kind, CopyKind::kKernel);
    RunOnHost(plan);
    EXPECT_EQ(dm.Bytes(), want) << "iteration " << iter;
    if (::testing::Test::HasFailure()) return;
  }
  Memory m(1, 64);
  EXPECT_THROW(PlanTransform(View(m, 0, {8}, {1}, D::fp8_e4m3), View(m, 0, {8}, {1}, D::bf16), Offsets{1, 0, D::bf16}),
               Error);
}

// Views of 2^32 elements or more keep 64-bit index math; smaller ones run it
// in 32 bits. Both must address what the row-major unravel says (addresses
// only: nothing is read or written, so no memory of that size is needed).
TEST(RegionPlanTest, IndexMathIsNarrowOnlyBelowTwoToThe32Elements) {
  alignas(16) static char base_s[16], base_d[16];
  char* const s_ptrs[1] = {base_s};
  char* const d_ptrs[1] = {base_d};
  struct Case {
    std::vector<uint64_t> shape, stride;
    uint32_t narrow;
  };
  const Case cases[] = {{{65536, 65535}, {131072, 2}, 1}, {{65536, 65536}, {131072, 2}, 0}, {{3, 1u << 31}, {1ull << 33, 2}, 0}};
  for (const Case& c : cases) {
    // bf16 -> fp32 with a strided source: always the kernel.
    const RegionView src = ViewOver(s_ptrs, 8, c.shape, c.stride, D::bf16);
    const uint64_t total = c.shape[0] * c.shape[1];
    const RegionView dst = ViewOver(d_ptrs, 0, {total}, {1}, D::fp32);
    const CopyPlan p = PlanCopy(src, dst);
    ASSERT_EQ(p.kind, CopyKind::kKernel);
    ASSERT_EQ(p.launches.size(), 1u);
    const Side& side = p.launches[0].src;
    EXPECT_EQ(side.narrow, c.narrow) << c.shape[0] << "x" << c.shape[1];
    EXPECT_EQ(p.launches[0].dst.narrow, c.narrow);
    for (uint64_t i : {uint64_t{0}, uint64_t{1}, c.shape[1] - 1, c.shape[1], total / 2 + 7, total - 1}) {
      const uint64_t want = 2 * (8 + (i / c.shape[1]) * c.stride[0] + (i % c.shape[1]) * c.stride[1]);
      EXPECT_EQ(static_cast<uint64_t>(ElementAddress(side, i, 2) - base_s), want) << "element " << i;
      EXPECT_EQ(static_cast<uint64_t>(ElementAddress(p.launches[0].dst, i, 4) - base_d), 4 * i) << "element " << i;
    }
  }
}

TEST(RegionPlanTest, MismatchedCountsAndFp8ConversionsAreRefused) {
  Memory a(1, 256), b(1, 256);
  try {
    PlanCopy(View(a, 0, {8}, {1}, D::fp32), View(b, 0, {9}, {1}, D::fp32));
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "region copy of 8 elements into 9 elements");
  }
  try {
    PlanCopy(View(a, 0, {8}, {1}, D::fp8_e4m3), View(b, 0, {8}, {1}, D::bf16));
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "no CUDA copy converts fp8_e4m3 to bf16 (quant ops do)");
  }
  EXPECT_EQ(PlanCopy(View(a, 0, {8}, {1}, D::fp8_e4m3), View(b, 0, {8}, {1}, D::fp8_e4m3)).kind, CopyKind::kMemcpy);
  EXPECT_EQ(PlanCopy(View(a, 0, {4, 2}, {1, 4}, D::e8m0), View(b, 0, {4, 2}, {2, 1}, D::e8m0)).kind, CopyKind::kKernel);
  EXPECT_EQ(PlanCopy(View(a, 0, {0}, {1}, D::fp32), View(b, 0, {0}, {1}, D::fp32)).kind, CopyKind::kNone);
}

// The quant kernels' code run on the host against the CPU reference
// (QuantRegion): 3 layers in 3 buffers (a buffer mode) x 2 experts, 10 x 12
// values in blocks of 4x8 (partial at the edges); the destination keeps rows
// 3..9, cols 8..12.
TEST(RegionPlanTest, QuantLaunchesMatchTheCpuReference) {
  std::mt19937_64 rng(7);
  for (D scale_dtype : {D::fp32, D::e8m0}) {
    const size_t ss = DtypeSize(scale_dtype);
    Memory src(3, 2 * 10 * 12 * 2), q_cpu(3, 2 * 7 * 4), q_gpu(3, 2 * 7 * 4);
    Memory s_cpu(3, 2 * 3 * 2 * ss), s_gpu(3, 2 * 3 * 2 * ss);
    std::vector<uint16_t> vals(3 * 2 * 10 * 12);
    for (size_t b = 0; b < 3; ++b) {
      for (size_t i = 0; i < 2 * 10 * 12; ++i) {
        const float f = std::ldexp(static_cast<float>(rng() % 2001) - 1000.0f, static_cast<int>(rng() % 20) - 12);
        const uint16_t h = FloatToBf16(f);
        std::memcpy(src.ptrs[b] + 2 * i, &h, 2);
      }
    }
    for (Memory* m : {&s_cpu, &s_gpu}) m->Poison();
    for (Memory* m : {&q_cpu, &q_gpu})  // FP8 NaN: never the quantization of a finite value
      for (char* p : m->ptrs) std::memset(p, 0x7f, m->bytes);
    QuantArgs a;
    a.kind = fb::QuantKind::quantize;
    a.src = View(src, 0, {3, 2, 10, 12}, {1, 120, 12, 1}, D::bf16, 1);
    a.block[0] = 4, a.block[1] = 8;
    a.origin[0] = 3, a.origin[1] = 8;
    auto quantize = [&](Memory& q, Memory& sc) {
      a.dst = View(q, 0, {3, 2, 7, 4}, {1, 28, 4, 1}, D::fp8_e4m3, 1);
      a.scale = View(sc, 0, {3, 2, 3, 2}, {1, 6, 2, 1}, scale_dtype, 1);
    };
    quantize(q_cpu, s_cpu);
    QuantRegion(a);
    quantize(q_gpu, s_gpu);
    const std::vector<QuantLaunch> launches = PlanQuant(a);
    ASSERT_EQ(launches.size(), 1u);
    EXPECT_EQ(launches[0].outer, 6u);
    RunQuantOnHost(launches);
    EXPECT_EQ(q_gpu.Bytes(), q_cpu.Bytes());
    EXPECT_EQ(s_gpu.Bytes(), s_cpu.Bytes());
    const std::vector<char> q = q_cpu.Bytes();
    EXPECT_EQ(std::count(q.begin(), q.end(), 0x7f), 0);  // every kept value written
    // And back: dequantize the kept 7x4 values with the scales of blocks rows 0..3, col 1.
    Memory d_cpu(3, 2 * 7 * 4 * 4), d_gpu(3, 2 * 7 * 4 * 4);
    QuantArgs d;
    d.kind = fb::QuantKind::dequantize;
    d.src = View(q_cpu, 0, {3, 2, 7, 4}, {1, 28, 4, 1}, D::fp8_e4m3, 1);
    d.scale = View(s_cpu, 1, {3, 2, 3, 1}, {1, 6, 2, 1}, scale_dtype, 1);
    d.block[0] = 4, d.block[1] = 8;
    d.origin[0] = 3, d.origin[1] = 0;
    d.dst = View(d_cpu, 0, {3, 2, 7, 4}, {1, 28, 4, 1}, D::fp32, 1);
    QuantRegion(d);
    d.dst = View(d_gpu, 0, {3, 2, 7, 4}, {1, 28, 4, 1}, D::fp32, 1);
    RunQuantOnHost(PlanQuant(d));
    EXPECT_EQ(d_gpu.Bytes(), d_cpu.Bytes());
  }
}

// The amax kinds' launches against the CPU reference: partial amaxes of a
// part that starts inside the grid (outer mode of 3 buffers), the scales of
// the largest of two grids, and values quantized with those scales.
TEST(RegionPlanTest, AmaxLaunchesMatchTheReference) {
  std::mt19937 rng(11);
  for (D scale_dtype : {D::fp32, D::e8m0}) {
    const size_t ss = DtypeSize(scale_dtype);
    Memory part(3, 9 * 10 * 2), values(3, 9 * 10 * 2);
    for (Memory* m : {&part, &values})
      for (size_t b = 0; b < 3; ++b)
        for (size_t i = 0; i < 9 * 10; ++i) {
          const float f = std::ldexp(static_cast<float>(rng() % 2001) - 1000.0f, static_cast<int>(rng() % 20) - 12);
          const uint16_t h = FloatToBf16(f);
          std::memcpy(m->ptrs[b] + 2 * i, &h, 2);
        }
    // Grids of 3x3 blocks of 4x8 per buffer; the part is rows 2..11, cols 5..15 of the grid's 12x24.
    Memory g_cpu(3, 2 * 9 * 4), g_gpu(3, 2 * 9 * 4);
    for (Memory* m : {&g_cpu, &g_gpu}) m->Poison();
    QuantArgs a;
    a.kind = fb::QuantKind::amax;
    a.src = View(part, 0, {3, 9, 10}, {1, 10, 1}, D::bf16, 1);
    a.block[0] = 4, a.block[1] = 8;
    a.origin[0] = 2, a.origin[1] = 5;
    for (int g = 0; g < 2; ++g) {  // the same part into both grids, the second one shifted by a block col
      a.origin[1] = g == 0 ? 5 : 13;
      a.dst = View(g_cpu, g * 9, {3, 3, 3}, {1, 3, 1}, D::fp32, 1);
      QuantRegion(a);
      a.dst = View(g_gpu, g * 9, {3, 3, 3}, {1, 3, 1}, D::fp32, 1);
      RunQuantOnHost(PlanQuant(a));
    }
    EXPECT_EQ(g_gpu.Bytes(), g_cpu.Bytes());
    Memory s_cpu(3, 9 * ss), s_gpu(3, 9 * ss);
    for (Memory* m : {&s_cpu, &s_gpu}) m->Poison();
    QuantArgs s;
    s.kind = fb::QuantKind::scale_from_amax;
    s.src = View(g_cpu, 0, {2, 3, 3, 3}, {9, 1, 3, 1}, D::fp32, 2);
    s.block[0] = 4, s.block[1] = 8;
    s.dst = View(s_cpu, 0, {3, 3, 3}, {1, 3, 1}, scale_dtype, 1);
    QuantRegion(s);
    s.dst = View(s_gpu, 0, {3, 3, 3}, {1, 3, 1}, scale_dtype, 1);
    RunQuantOnHost(PlanQuant(s));
    EXPECT_EQ(s_gpu.Bytes(), s_cpu.Bytes());
    Memory q_cpu(3, 9 * 10), q_gpu(3, 9 * 10);
    QuantArgs z;
    z.kind = fb::QuantKind::quantize_scaled;
    z.src = View(values, 0, {3, 9, 10}, {1, 10, 1}, D::bf16, 1);
    z.scale = View(s_cpu, 0, {3, 3, 2}, {1, 3, 1}, scale_dtype, 1);
    z.block[0] = 4, z.block[1] = 8;
    z.origin[0] = 2, z.origin[1] = 5;
    z.dst = View(q_cpu, 0, {3, 9, 10}, {1, 10, 1}, D::fp8_e4m3, 1);
    QuantRegion(z);
    z.dst = View(q_gpu, 0, {3, 9, 10}, {1, 10, 1}, D::fp8_e4m3, 1);
    RunQuantOnHost(PlanQuant(z));
    EXPECT_EQ(q_gpu.Bytes(), q_cpu.Bytes());
  }
}

TEST(RegionPlanTest, LaunchShapeCoversEveryGroupWithinTheBlockCap) {
  EXPECT_EQ(ShapeFor(1).blocks, 1u);
  EXPECT_EQ(ShapeFor(256).blocks, 1u);
  EXPECT_EQ(ShapeFor(257).blocks, 2u);
  EXPECT_EQ(ShapeFor(uint64_t{1} << 40).blocks, kMaxBlocks);
  EXPECT_EQ(ShapeFor(1000).threads, kThreadsPerBlock);
}

}  // namespace
}  // namespace reshard::cuda
