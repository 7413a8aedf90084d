// One launch of the strided copy kernel, and the per-element work of that
// kernel. Host and device share this header: the CUDA kernel (copy_kernels.cu)
// calls CopyGroup for its threads, and the CPU tests call it for every group to
// check the index math against CopyRegion without a GPU. Plain C++ (no
// flatbuffers, no CUDA headers), so nvcc compiles it cheaply.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "runtime/float_bits.h"

namespace reshard::cuda {

/// Buffers one launch may address per side; a region over more is split into
/// several launches (region_plan.h). Keeps the launch's parameters near 1 KiB.
constexpr int kMaxSlots = 64;

/// One side of a copy as the kernel sees it: the row-major element index i
/// (mode 0 outermost) lives at `slot[i / block - first_block]` plus
/// (offset + sum idx_k * stride_k) elements. Modes that select buffers have
/// stride 0 here: they only change the slot, once every `block` elements.
struct Side {
  uint64_t offset = 0;
  uint64_t shape[4] = {1, 1, 1, 1};
  int64_t stride[4] = {0, 0, 0, 0};
  int32_t ndim = 1;
  uint64_t block = 1;        // elements that share one buffer
  uint64_t first_block = 0;  // begin / block
  /// 1 when the view has fewer than 2^32 elements: its index math then runs
  /// in 32 bits (a 64-bit division costs a GPU several times as much).
  uint32_t narrow = 0;
  char* slot[kMaxSlots] = {};
};

/// Dtypes as the kernels template them (values of fb::Dtype); `byte` stands
/// for fp8_e4m3 and e8m0, which plain copies move unchanged (quant ops convert
/// them: quant_launch.h).
enum class Elem : uint8_t { bf16 = 0, fp16 = 1, fp32 = 2, byte = 3 };

/// Elements [begin, begin + count) of src copied to the same indices of dst,
/// `vec` consecutive elements per thread (begin and count are multiples of it).
struct CopyLaunch {
  Side src, dst;
  Elem src_type = Elem::fp32, dst_type = Elem::fp32;
  uint64_t begin = 0, count = 0;
  int32_t vec = 1;
  /// 1: each element goes through the model's values on the way
  /// (kernels.h TransformRegion): x -> wire(x - from) where from != 0, then
  /// dst(that + to). 0: a plain copy.
  uint32_t transform = 0;
  Elem wire = Elem::fp32;
  float from = 0, to = 0;
};

/// Byte address of element `i` of a side, elements of `esize` bytes. The
/// unravel mirrors the CPU kernels' row-major pairing (kernels.h).
template <typename I>
RESHARD_HD inline char* ElementAddressIn(const Side& s, I i, uint32_t esize) {
  char* base = s.slot[i / static_cast<I>(s.block) - static_cast<I>(s.first_block)];
  int64_t off = static_cast<int64_t>(s.offset);
  for (int k = s.ndim - 1; k >= 0; --k) {
    const I n = static_cast<I>(s.shape[k]);
    off += static_cast<int64_t>(i % n) * s.stride[k];
    i /= n;
  }
  return base + off * static_cast<int64_t>(esize);
}

RESHARD_HD inline char* ElementAddress(const Side& s, uint64_t i, uint32_t esize) {
  return s.narrow ? ElementAddressIn<uint32_t>(s, static_cast<uint32_t>(i), esize) : ElementAddressIn<uint64_t>(s, i, esize);
}

struct Bf16 {
  uint16_t bits;
};
struct Fp16 {
  uint16_t bits;
};

RESHARD_HD inline float ToFloat(Bf16 x) { return Bf16ToFloat(x.bits); }
RESHARD_HD inline float ToFloat(Fp16 x) { return Fp16ToFloat(x.bits); }
RESHARD_HD inline float ToFloat(float x) { return x; }
template <typename D>
RESHARD_HD inline D FromFloat(float f);
template <>
RESHARD_HD inline Bf16 FromFloat<Bf16>(float f) {
  return Bf16{FloatToBf16(f)};
}
template <>
RESHARD_HD inline Fp16 FromFloat<Fp16>(float f) {
  return Fp16{FloatToFp16(f)};
}
template <>
RESHARD_HD inline float FromFloat<float>(float f) {
  return f;
}

// Equal dtypes copy bits (NaN payloads included), as the CPU's memcpy does.
template <typename S, typename D>
RESHARD_HD inline D ConvertElement(S s) {
  if constexpr (sizeof(S) == sizeof(D) && (sizeof(S) == 4 || std::is_same_v<S, D>)) {
    D d;
    std::memcpy(&d, &s, sizeof d);
    return d;
  } else {
    return FromFloat<D>(ToFloat(s));
  }
}

/// `f` rounded to a dtype's precision and back (the wire of a transform).
RESHARD_HD inline float RoundTo(Elem e, float f) {
  switch (e) {
    case Elem::bf16: return Bf16ToFloat(FloatToBf16(f));
    case Elem::fp16: return Fp16ToFloat(FloatToFp16(f));
    default: return f;
  }
}

/// One element through a launch's transform (CopyLaunch::transform).
template <typename S, typename D>
RESHARD_HD inline D TransformElement(S s, const CopyLaunch& l) {
  if constexpr (std::is_same_v<S, uint8_t> || std::is_same_v<D, uint8_t>) {
    return ConvertElement<S, D>(s);  // never planned: fp8 and e8m0 take no offset (plan_check)
  } else {
    float x = ToFloat(s);
    if (l.from != 0) x = RoundTo(l.wire, x - l.from);
    return FromFloat<D>(x + l.to);
  }
}

/// V elements of T, aligned as one load or store (16 bytes at most).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

/// Copies group `g` of a launch: elements begin + g*V ... + V - 1. With V > 1
/// the planner guarantees that a group is V consecutive, aligned elements on
/// both sides, so it moves as one wide load and one wide store.
template <typename S, typename D, int V>
RESHARD_HD inline void CopyGroup(const CopyLaunch& l, uint64_t g) {
  const uint64_t i = l.begin + g * V;
  const char* sp = ElementAddress(l.src, i, sizeof(S));
  char* dp = ElementAddress(l.dst, i, sizeof(D));
  Pack<S, V> in;
  Pack<D, V> out;
#if defined(__CUDA_ARCH__)
  in = *reinterpret_cast<const Pack<S, V>*>(sp);
#else
  std::memcpy(&in, sp, sizeof in);
#endif
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < V; ++k) out.v[k] = l.transform ? TransformElement<S, D>(in.v[k], l) : ConvertElement<S, D>(in.v[k]);
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<Pack<D, V>*>(dp) = out;
#else
  std::memcpy(dp, &out, sizeof out);
#endif
}

namespace detail {

template <typename S, typename D, typename Fn>
void DispatchVec(int vec, Fn&& fn) {
  switch (vec) {
    case 8:
      if constexpr (sizeof(S) == 2 && sizeof(D) == 2) return fn.template operator()<S, D, 8>();
      break;
    case 4:
      return fn.template operator()<S, D, 4>();
    case 2:
      return fn.template operator()<S, D, 2>();
    default:
      break;
  }
  fn.template operator()<S, D, 1>();
}

template <typename S, typename Fn>
void DispatchDst(Elem d, int vec, Fn&& fn) {
  switch (d) {
    case Elem::bf16:
      return DispatchVec<S, Bf16>(vec, fn);
    case Elem::fp16:
      return DispatchVec<S, Fp16>(vec, fn);
    default:
      return DispatchVec<S, float>(vec, fn);
  }
}

}  // namespace detail

/// Calls fn.template operator()<S, D, V>() with the element types and vector
/// width of a launch: one table of the instantiations for the device and the
/// host. Widths the planner never picks (8 with a 4-byte side) fall back to 1.
template <typename Fn>
void DispatchCopy(const CopyLaunch& l, Fn&& fn) {
  switch (l.src_type) {
    case Elem::byte:  // PlanCopy pairs bytes with bytes only
      return detail::DispatchVec<uint8_t, uint8_t>(l.vec, fn);
    case Elem::bf16:
      return detail::DispatchDst<Bf16>(l.dst_type, l.vec, fn);
    case Elem::fp16:
      return detail::DispatchDst<Fp16>(l.dst_type, l.vec, fn);
    default:
      return detail::DispatchDst<float>(l.dst_type, l.vec, fn);
  }
}

}  // namespace reshard::cuda
