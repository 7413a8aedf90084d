#include "runtime/cuda/region_plan.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/quant.h"

namespace reshard::cuda {
namespace {

Elem ElemOf(fb::Dtype d) {
  switch (d) {
    case fb::Dtype::bf16:
      return Elem::bf16;
    case fb::Dtype::fp16:
      return Elem::fp16;
    case fb::Dtype::fp32:
      return Elem::fp32;
    case fb::Dtype::fp8_e4m3:
    case fb::Dtype::e8m0:
      return Elem::byte;
    default:
      throw Error(std::string("no CUDA kernel moves ") + DtypeName(d));
  }
}

// A simplified view without buffer modes, as rows: `height` rows of `width`
// elements, `pitch` elements apart. False when it is no such thing.
bool AsRows(const RegionView& v, uint64_t width, uint64_t* height, uint64_t* pitch) {
  if (v.buffer_modes != 0) return false;
  if (v.ndim == 1 && v.stride[0] == 1) {
    if (width == 0 || v.shape[0] % width != 0) return false;
    *height = v.shape[0] / width;
    *pitch = width;
    return true;
  }
  if (v.ndim == 2 && v.stride[1] == 1 && v.shape[1] == width && v.stride[0] >= width) {
    *height = v.shape[0];
    *pitch = v.stride[0];
    return true;
  }
  return false;
}

char* Base(const RegionView& v) { return v.buffers[v.buffer] + v.offset * DtypeSize(v.dtype); }

// Elements that share one buffer: the product of the modes inside the
// innermost mode that selects buffers (all of them without such a mode).
uint64_t BlockOf(const RegionView& v, uint64_t total) {
  if (v.buffer_modes == 0) return total;
  uint64_t block = 1;
  for (int k = v.ndim - 1; k >= 0 && !(v.buffer_modes & (1u << k)); --k) block *= v.shape[k];
  return block;
}

// Whether groups of `vec` consecutive elements are consecutive in memory and
// start `vec` elements into the buffer (the base pointers are checked apart).
bool Vectorizes(const RegionView& v, int vec) {
  const int inner = v.ndim - 1;
  if (vec == 1) return true;
  if ((v.buffer_modes & (1u << inner)) || v.stride[inner] != 1 || v.shape[inner] % vec != 0) return false;
  if (v.offset % vec != 0) return false;
  for (int k = 0; k < inner; ++k) {
    if (!(v.buffer_modes & (1u << k)) && v.stride[k] % vec != 0) return false;
  }
  return true;
}

// The buffer holding row-major element `i` of a view.
char* BufferOf(const RegionView& v, uint64_t i) {
  uint64_t buf = v.buffer;
  for (int k = v.ndim - 1; k >= 0; --k) {
    const uint64_t c = i % v.shape[k];
    i /= v.shape[k];
    if (v.buffer_modes & (1u << k)) buf += c * v.stride[k];
  }
  return v.buffers[buf];
}

// Fills the side of a launch over [begin, begin + count); false when a buffer
// is not aligned for `vec`-element loads.
bool FillSide(const RegionView& v, uint64_t block, uint64_t begin, uint64_t count, int vec, Side* side) {
  side->offset = v.offset;
  side->ndim = v.ndim;
  for (int k = 0; k < 4; ++k) {
    side->shape[k] = k < v.ndim ? v.shape[k] : 1;
    side->stride[k] = k < v.ndim && !(v.buffer_modes & (1u << k)) ? static_cast<int64_t>(v.stride[k]) : 0;
  }
  side->block = block;
  side->first_block = begin / block;
  uint64_t elements = 1;
  for (int k = 0; k < v.ndim; ++k) elements *= v.shape[k];
  side->narrow = elements <= UINT32_MAX ? 1 : 0;
  const uint64_t last_block = (begin + count - 1) / block;
  const size_t align = static_cast<size_t>(vec) * DtypeSize(v.dtype);
  for (uint64_t q = side->first_block; q <= last_block; ++q) {
    char* p = BufferOf(v, q * block);
    if (reinterpret_cast<uintptr_t>(p) % align != 0) return false;
    side->slot[q - side->first_block] = p;
  }
  return true;
}

bool PlanKernel(const RegionView& s, const RegionView& d, uint64_t total, int vec, CopyPlan* plan) {
  if (!Vectorizes(s, vec) || !Vectorizes(d, vec)) return false;
  const uint64_t sblock = BlockOf(s, total), dblock = BlockOf(d, total);
  // A range of n elements touches at most n / block + 2 blocks of a side.
  uint64_t chunk = total;
  if (s.buffer_modes) chunk = std::min(chunk, (kMaxSlots - 2) * sblock);
  if (d.buffer_modes) chunk = std::min(chunk, (kMaxSlots - 2) * dblock);
  chunk = std::max<uint64_t>(chunk / vec * vec, vec);
  plan->launches.clear();
  for (uint64_t begin = 0; begin < total; begin += chunk) {
    CopyLaunch l;
    l.src_type = ElemOf(s.dtype);
    l.dst_type = ElemOf(d.dtype);
    l.begin = begin;
    l.count = std::min(chunk, total - begin);
    l.vec = vec;
    if (!FillSide(s, sblock, l.begin, l.count, vec, &l.src) || !FillSide(d, dblock, l.begin, l.count, vec, &l.dst)) {
      return false;
    }
    plan->launches.push_back(l);
  }
  plan->kind = CopyKind::kKernel;
  return true;
}

}  // namespace

const char* CopyKindName(CopyKind k) {
  switch (k) {
    case CopyKind::kNone:
      return "none";
    case CopyKind::kMemcpy:
      return "memcpy";
    case CopyKind::kMemcpy2D:
      return "memcpy2d";
    default:
      return "kernel";
  }
}

CopyPlan PlanCopy(const RegionView& src_in, const RegionView& dst_in, bool memcpy2d) {
  const uint64_t total = ViewElements(src_in);
  if (total != ViewElements(dst_in)) {
    throw Error("region copy of " + std::to_string(total) + " elements into " +
                std::to_string(ViewElements(dst_in)) + " elements");
  }
  if ((ElemOf(src_in.dtype) == Elem::byte || ElemOf(dst_in.dtype) == Elem::byte) && src_in.dtype != dst_in.dtype) {
    throw Error(std::string("no CUDA copy converts ") + DtypeName(src_in.dtype) + " to " + DtypeName(dst_in.dtype) +
                " (quant ops do)");
  }
  CopyPlan plan;
  if (total == 0) return plan;
  const RegionView s = Simplify(src_in), d = Simplify(dst_in);
  const size_t es = DtypeSize(s.dtype);
  if (s.dtype == d.dtype && s.buffer_modes == 0 && d.buffer_modes == 0) {
    // Rows as wide as the inner mode of whichever side has one; a side that is
    // contiguous is cut into rows of that width.
    const uint64_t width = s.ndim == 2 ? s.shape[1] : d.ndim == 2 ? d.shape[1] : total;
    uint64_t sh = 0, sp = 0, dh = 0, dp = 0;
    // cudaMemcpy2DAsync takes pitches below 2^31 bytes (cudaDevAttrMaxPitch).
    constexpr uint64_t kMaxPitch = (uint64_t{1} << 31) - 1;
    if (AsRows(s, width, &sh, &sp) && AsRows(d, width, &dh, &dp) && sh == dh && (sh == 1 || std::max(sp, dp) * es <= kMaxPitch)) {
      plan.src = Base(s);
      plan.dst = Base(d);
      plan.width = width * es;
      plan.height = sh;
      plan.spitch = sp * es;
      plan.dpitch = dp * es;
      plan.kind = sh == 1 || (sp == width && dp == width) ? CopyKind::kMemcpy : CopyKind::kMemcpy2D;
      if (plan.kind == CopyKind::kMemcpy) {
        plan.width = total * es;
        plan.height = 1;
        plan.spitch = plan.dpitch = plan.width;
      }
      if (plan.kind == CopyKind::kMemcpy || memcpy2d) return plan;
      plan = CopyPlan();
    }
  }
  const int widest = static_cast<int>(std::max(es, DtypeSize(d.dtype)));
  for (int vec = 16 / widest; vec >= 1; vec /= 2) {
    if (PlanKernel(s, d, total, vec, &plan)) return plan;
  }
  throw Error("no launch plan for a region copy");  // vec 1 always plans
}

CopyPlan PlanTransform(const RegionView& src_in, const RegionView& dst_in, const Offsets& o) {
  const uint64_t total = ViewElements(src_in);
  if (total != ViewElements(dst_in)) {
    throw Error("region transform of " + std::to_string(total) + " elements into " +
                std::to_string(ViewElements(dst_in)) + " elements");
  }
  for (fb::Dtype t : {src_in.dtype, dst_in.dtype, o.wire}) {
    if (ElemOf(t) == Elem::byte) throw Error(std::string("no CUDA copy adds an offset to ") + DtypeName(t) + " values");
  }
  CopyPlan plan;
  if (total == 0) return plan;
  const RegionView s = Simplify(src_in), d = Simplify(dst_in);
  const int widest = static_cast<int>(std::max(DtypeSize(s.dtype), DtypeSize(d.dtype)));
  for (int vec = 16 / widest; vec >= 1; vec /= 2) {
    if (!PlanKernel(s, d, total, vec, &plan)) continue;
    for (CopyLaunch& l : plan.launches) {
      l.transform = 1;
      l.wire = ElemOf(o.wire);
      l.from = o.from;
      l.to = o.to;
    }
    return plan;
  }
  throw Error("no launch plan for a region transform");  // vec 1 always plans
}

std::vector<QuantLaunch> PlanQuant(const QuantArgs& a) {
  CheckQuantArgs(a);
  QuantLaunch proto;
  // The views each side of the launch reads, with their modes (outer...,
  // rows, cols); scale_from_amax's src drops its leading mode of grids.
  RegionView src = a.src;
  const RegionView* views[3] = {&src, &a.dst, &a.scale};
  int sides = 3;
  switch (a.kind) {
    case fb::QuantKind::dequantize:
      proto.mode = QuantMode::dequantize;
      break;
    case fb::QuantKind::quantize:
      proto.mode = QuantMode::quantize;
      break;
    case fb::QuantKind::amax:
      proto.mode = QuantMode::amax, sides = 2;
      break;
    case fb::QuantKind::quantize_scaled:
      proto.mode = QuantMode::quantize_scaled;
      break;
    case fb::QuantKind::scale_from_amax:
      proto.mode = QuantMode::scale_from_amax;
      if (a.src.buffer_modes & 1u) throw Error("quant op: the grids of a scale_from_amax must not select buffers");
      proto.parts = static_cast<uint32_t>(a.src.shape[0]);
      proto.part_stride = static_cast<int64_t>(a.src.stride[0]);
      src.ndim = a.src.ndim - 1;
      src.buffer_modes = a.src.buffer_modes >> 1;
      for (int k = 0; k < src.ndim; ++k) src.shape[k] = a.src.shape[k + 1], src.stride[k] = a.src.stride[k + 1];
      views[1] = &a.scale, views[2] = &a.dst;  // no FP8 side: the grids' scales go to `scale`
      sides = 3;
      break;
  }
  const int n = src.ndim, outer = n - 2;
  for (int v = 0; v < sides; ++v) {
    if (views[v]->ndim == 0) continue;
    if (views[v]->buffer_modes >> outer) throw Error("quant op: rows and cols of a region must not select buffers");
  }
  const bool quantize =
      proto.mode == QuantMode::quantize || proto.mode == QuantMode::quantize_scaled || proto.mode == QuantMode::amax;
  proto.wide = proto.mode == QuantMode::scale_from_amax ? Elem::fp32 : ElemOf(quantize ? a.src.dtype : a.dst.dtype);
  proto.e8m0 = (proto.mode == QuantMode::scale_from_amax ? a.dst.dtype : a.scale.dtype) == fb::Dtype::e8m0;
  proto.rows = src.shape[n - 2];
  proto.cols = src.shape[n - 1];
  if (proto.mode != QuantMode::scale_from_amax) {
    proto.dst_rows = a.dst.shape[n - 2];
    proto.dst_cols = a.dst.shape[n - 1];
  }
  for (int k = 0; k < 2; ++k) proto.origin[k] = a.origin[k], proto.block[k] = a.block[k];
  QuantSide* slots[3] = {&proto.src, &proto.dst, &proto.scale};
  for (int v = 0; v < sides; ++v) {
    if (views[v]->ndim == 0) continue;
    slots[v]->row_stride = static_cast<int64_t>(views[v]->stride[n - 2]);
    slots[v]->col_stride = static_cast<int64_t>(views[v]->stride[n - 1]);
  }
  uint64_t combos = 1;
  for (int k = 0; k < outer; ++k) combos *= src.shape[k];
  std::vector<QuantLaunch> out;
  uint64_t idx[4] = {0, 0, 0, 0};
  for (uint64_t c = 0; c < combos; ++c) {
    if (c % kMaxSlots == 0) {
      out.push_back(proto);
      out.back().outer = 0;
    }
    QuantLaunch& l = out.back();
    for (int v = 0; v < sides; ++v) {
      const RegionView& view = *views[v];
      if (view.ndim == 0) continue;
      uint64_t buf = view.buffer, off = view.offset;
      for (int k = 0; k < outer; ++k) (view.buffer_modes >> k & 1 ? buf : off) += idx[k] * view.stride[k];
      QuantSide& side = v == 0 ? l.src : v == 1 ? l.dst : l.scale;
      side.base[l.outer] = view.buffers[buf] + off * DtypeSize(view.dtype);
    }
    ++l.outer;
    for (int k = outer - 1; k >= 0 && ++idx[k] == src.shape[k]; --k) idx[k] = 0;
  }
  return out;
}

void RunQuantOnHost(const std::vector<QuantLaunch>& launches) {
  for (const QuantLaunch& l : launches) {
    const uint64_t elements = l.outer * l.rows * l.cols;
    switch (l.mode) {
      case QuantMode::dequantize:
        for (uint64_t i = 0; i < elements; ++i) DequantElement(l, i);
        continue;
      case QuantMode::quantize_scaled:
        for (uint64_t i = 0; i < elements; ++i) QuantizeScaledElement(l, i);
        continue;
      case QuantMode::scale_from_amax:
        for (uint64_t i = 0; i < elements; ++i) ScaleFromAmaxElement(l, i);
        continue;
      case QuantMode::amax: {
        const uint64_t blocks = l.outer * l.dst_rows * l.dst_cols;
        for (uint64_t b = 0; b < blocks; ++b) StoreAmax(l, b, BlockAmax(l, b, 0, 1));
        continue;
      }
      case QuantMode::quantize:
        break;
    }
    const uint64_t blocks = l.outer * BlockRows(l) * BlockCols(l);
    for (uint64_t b = 0; b < blocks; ++b) {
      uint32_t o;
      uint64_t r, c, br, bc;
      const float s = ScaleFromAmax(BlockAmax(l, b, 0, 1), l.e8m0);
      BlockCoords(l, b, o, br, bc);
      StoreScale(l, o, br, bc, s);
      for (uint64_t k = 0; BlockElement(l, b, k, o, r, c); ++k) QuantizeBlockElement(l, o, r, c, s);
    }
  }
}

LaunchShape ShapeFor(uint64_t groups) {
  LaunchShape shape;
  shape.threads = kThreadsPerBlock;
  const uint64_t blocks = (groups + kThreadsPerBlock - 1) / kThreadsPerBlock;
  shape.blocks = static_cast<uint32_t>(std::clamp<uint64_t>(blocks, 1, kMaxBlocks));
  return shape;
}

RegionView ViewOver(char* const* buffers, uint64_t offset, const std::vector<uint64_t>& shape,
                    const std::vector<uint64_t>& stride, fb::Dtype dtype, uint8_t buffer_modes) {
  RegionView v;
  v.buffers = buffers;
  v.offset = offset;
  v.ndim = static_cast<int>(std::min<size_t>(shape.size(), 4));
  for (int k = 0; k < v.ndim; ++k) {
    v.shape[k] = shape[k];
    v.stride[k] = stride[k];
  }
  v.buffer_modes = buffer_modes;
  v.dtype = dtype;
  return v;
}

void RunOnHost(const CopyPlan& plan) {
  switch (plan.kind) {
    case CopyKind::kNone:
      return;
    case CopyKind::kMemcpy:
    case CopyKind::kMemcpy2D:
      for (size_t r = 0; r < plan.height; ++r) {
        std::memmove(plan.dst + r * plan.dpitch, plan.src + r * plan.spitch, plan.width);
      }
      return;
    case CopyKind::kKernel:
      for (const CopyLaunch& l : plan.launches) {
        DispatchCopy(l, [&]<typename S, typename D, int V>() {
          for (uint64_t g = 0; g < l.count / V; ++g) CopyGroup<S, D, V>(l, g);
        });
      }
      return;
  }
}

}  // namespace reshard::cuda
