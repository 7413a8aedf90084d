#include "runtime/kernels.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/modes.h"
#include "runtime/quant.h"

namespace reshard {
namespace {

// Converts n elements from `s` (stride ss elements) to `d` (stride ds elements).
using InnerFn = void (*)(const char* s, int64_t ss, char* d, int64_t ds, uint64_t n);

template <typename T>
void SameCopy(const char* s, int64_t ss, char* d, int64_t ds, uint64_t n) {
  if (ss == 1 && ds == 1) {
    std::memcpy(d, s, n * sizeof(T));
    return;
  }
  const T* sp = reinterpret_cast<const T*>(s);
  T* dp = reinterpret_cast<T*>(d);
  for (uint64_t i = 0; i < n; ++i) dp[i * ds] = sp[i * ss];
}

template <fb::Dtype S, fb::Dtype D>
void Convert(const char* s, int64_t ss, char* d, int64_t ds, uint64_t n) {
  constexpr size_t kS = S == fb::Dtype::fp32 ? 4 : 2;
  constexpr size_t kD = D == fb::Dtype::fp32 ? 4 : 2;
  for (uint64_t i = 0; i < n; ++i) {
    StoreFromFloat(d + i * ds * kD, D, LoadAsFloat(s + i * ss * kS, S));
  }
}

// Copies n bytes with non-temporal stores where the CPU has them: a large
// pack or unpack writes memory nobody reads soon (staging goes out over the
// wire from DRAM; a weight waits for the next forward pass), and streaming
// stores skip reading each destination line first. glibc's memcpy does the
// same only for single copies larger than a share of the last-level cache,
// never for a strided region's runs of a few KiB, where streaming stores
// make a large strided copy markedly faster (docs/benchmarks.md, Runtime,
// row b, measures the packs). The caller fences (StreamFence) once the copy
// is done.
void StreamBytes(char* d, const char* s, size_t n) {
#if defined(__SSE2__)
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  head = std::min(head, n);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, n - i);
#else
  std::memcpy(d, s, n);
#endif
}

// Orders the streaming stores before anything the caller does next (a send
// of the staging, another thread's read).
void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Copies at least this large stream their contiguous runs.
constexpr uint64_t kStreamBytes = 4ull << 20;

InnerFn Pick(fb::Dtype s, fb::Dtype d) {
  using fb::Dtype;
  if (s == d) {
    switch (DtypeSize(s)) {
      case 4: return SameCopy<uint32_t>;
      case 2: return SameCopy<uint16_t>;
      default: return SameCopy<uint8_t>;  // fp8 values, e8m0 scales: moved, never converted here
    }
  }
  if (s == Dtype::bf16 && d == Dtype::fp16) return Convert<Dtype::bf16, Dtype::fp16>;
  if (s == Dtype::bf16 && d == Dtype::fp32) return Convert<Dtype::bf16, Dtype::fp32>;
  if (s == Dtype::fp16 && d == Dtype::bf16) return Convert<Dtype::fp16, Dtype::bf16>;
  if (s == Dtype::fp16 && d == Dtype::fp32) return Convert<Dtype::fp16, Dtype::fp32>;
  if (s == Dtype::fp32 && d == Dtype::bf16) return Convert<Dtype::fp32, Dtype::bf16>;
  if (s == Dtype::fp32 && d == Dtype::fp16) return Convert<Dtype::fp32, Dtype::fp16>;
  throw Error(std::string("no CPU kernel converts ") + DtypeName(s) + " to " + DtypeName(d));
}

// Walks a simplified view in runs of its innermost mode.
struct Cursor {
  const RegionView& v;
  size_t esize;
  int inner;            // index of the innermost mode
  uint64_t idx[4] = {0, 0, 0, 0};
  uint64_t pos = 0;     // position within the innermost mode
  uint64_t len;         // its extent
  int64_t step;         // its stride (0 when it selects buffers: runs are 1 element)
  char* base = nullptr; // address of (idx..., 0)

  explicit Cursor(const RegionView& view) : v(view), esize(DtypeSize(view.dtype)), inner(view.ndim - 1) {
    bool inner_is_buffer = view.buffer_modes & (1u << inner);
    len = inner_is_buffer ? 1 : v.shape[inner];
    step = inner_is_buffer ? 0 : static_cast<int64_t>(v.stride[inner]);
    Locate();
  }

  // Outer modes advance per run; when the innermost mode selects buffers,
  // every element is a run of its own and mode `inner` counts like an outer one.
  int last_outer() const { return (v.buffer_modes & (1u << inner)) ? inner : inner - 1; }

  void Locate() {
    uint64_t buf = v.buffer, off = v.offset;
    for (int k = 0; k <= last_outer(); ++k) {
      if (v.buffer_modes & (1u << k)) {
        buf += idx[k] * v.stride[k];
      } else {
        off += idx[k] * v.stride[k];
      }
    }
    base = v.buffers[buf] + off * esize;
  }

  char* ptr() const { return base + static_cast<int64_t>(pos) * step * static_cast<int64_t>(esize); }
  uint64_t remaining() const { return len - pos; }

  void Advance(uint64_t n) {
    pos += n;
    if (pos < len) return;
    pos = 0;
    for (int k = last_outer(); k >= 0; --k) {
      if (++idx[k] < v.shape[k]) break;
      idx[k] = 0;
    }
    Locate();
  }
};

}  // namespace

RegionView ViewOf(const fb::Region& r, char* const* buffers, fb::Dtype dtype) {
  RegionView v;
  v.buffers = buffers;
  v.buffer = r.buffer() == kNone ? 0 : r.buffer();
  v.offset = r.offset();
  v.ndim = std::min<int>(r.ndim(), 4);
  for (int k = 0; k < v.ndim; ++k) {
    v.shape[k] = r.shape()->Get(k);
    v.stride[k] = r.stride()->Get(k);
  }
  v.buffer_modes = r.buffer() == kNone ? 0 : r.buffer_modes();
  v.dtype = dtype;
  return v;
}

RegionView ContiguousView(char* const* base, uint64_t offset, uint64_t elements, fb::Dtype dtype) {
  RegionView v;
  v.buffers = base;
  v.offset = offset;
  v.ndim = 1;
  v.shape[0] = elements;
  v.stride[0] = 1;
  v.dtype = dtype;
  return v;
}

uint64_t ViewElements(const RegionView& v) {
  uint64_t n = 1;
  for (int k = 0; k < v.ndim; ++k) n *= v.shape[k];
  return n;
}

RegionView Simplify(const RegionView& v) {
  RegionView out = v;
  uint32_t modes = 0;
  out.ndim = CoalesceModes<uint64_t>(v.ndim, v.shape, v.stride, v.buffer_modes, UINT64_MAX, out.shape, out.stride,
                                     &modes);
  out.buffer_modes = static_cast<uint8_t>(modes);
  for (int k = out.ndim; k < 4; ++k) {
    out.shape[k] = 1;
    out.stride[k] = 0;
  }
  return out;
}

void CopyRegion(const RegionView& src_in, const RegionView& dst_in) {
  const uint64_t total = ViewElements(src_in);
  if (total != ViewElements(dst_in)) {
    throw Error("region copy of " + std::to_string(total) + " elements into " +
                std::to_string(ViewElements(dst_in)) + " elements");
  }
  if (total == 0) return;
  InnerFn fn = Pick(src_in.dtype, dst_in.dtype);
  RegionView src = Simplify(src_in), dst = Simplify(dst_in);
  Cursor s(src), d(dst);
  const size_t esize = DtypeSize(dst.dtype);
  const bool stream = src.dtype == dst.dtype && total * esize >= kStreamBytes;
  for (uint64_t done = 0; done < total;) {
    uint64_t n = std::min(s.remaining(), d.remaining());
    if (stream && s.step == 1 && d.step == 1) {
      StreamBytes(d.ptr(), s.ptr(), n * esize);
    } else {
      fn(s.ptr(), s.step, d.ptr(), d.step, n);
    }
    done += n;
    if (done == total) break;
    s.Advance(n);
    d.Advance(n);
  }
  if (stream) StreamFence();
}

void TransformRegion(const RegionView& src_in, const RegionView& dst_in, const Offsets& o) {
  const uint64_t total = ViewElements(src_in);
  if (total != ViewElements(dst_in)) {
    throw Error("region transform of " + std::to_string(total) + " elements into " +
                std::to_string(ViewElements(dst_in)) + " elements");
  }
  for (fb::Dtype d : {src_in.dtype, dst_in.dtype, o.wire}) {
    if (!KernelSupports(d)) throw Error(std::string("no CPU kernel adds an offset to ") + DtypeName(d) + " values");
  }
  if (total == 0) return;
  RegionView src = Simplify(src_in), dst = Simplify(dst_in);
  Cursor s(src), d(dst);
  const size_t ss = DtypeSize(src.dtype), ds = DtypeSize(dst.dtype);
  for (uint64_t done = 0; done < total;) {
    const uint64_t n = std::min(s.remaining(), d.remaining());
    const char* sp = s.ptr();
    char* dp = d.ptr();
    for (uint64_t i = 0; i < n; ++i) {
      float v = LoadAsFloat(sp + static_cast<int64_t>(i) * s.step * static_cast<int64_t>(ss), src.dtype);
      if (o.from != 0) {
        char w[4];
        StoreFromFloat(w, o.wire, v - o.from);
        v = LoadAsFloat(w, o.wire);
      }
      StoreFromFloat(dp + static_cast<int64_t>(i) * d.step * static_cast<int64_t>(ds), dst.dtype, v + o.to);
    }
    done += n;
    if (done == total) break;
    s.Advance(n);
    d.Advance(n);
  }
}

void Kernels::Quant(const QuantArgs& args) {
  throw Error("the " + name() + " kernels cannot run quantize or dequantize steps");
}

void Kernels::Transform(const RegionView& src, const RegionView& dst, const Offsets& o) {
  throw Error("the " + name() + " kernels cannot apply a buffer's offset (layout \"transform\")");
}

namespace {

class HostKernels : public Kernels {
 public:
  std::string name() const override { return "cpu"; }
  // At least one byte, so that a plan without staging still gets a valid address.
  char* Allocate(size_t bytes) override { return new char[std::max<size_t>(bytes, 1)]; }
  void Release(char* p) noexcept override { delete[] p; }
  void Copy(const RegionView& src, const RegionView& dst) override { CopyRegion(src, dst); }
  void Quant(const QuantArgs& args) override { QuantRegion(args); }
  void Transform(const RegionView& src, const RegionView& dst, const Offsets& o) override {
    TransformRegion(src, dst, o);
  }
  void Finish() override {}
};

}  // namespace

Kernels& CpuKernels() {
  static HostKernels kernels;
  return kernels;
}

}  // namespace reshard
