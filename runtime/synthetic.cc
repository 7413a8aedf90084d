#include "runtime/synthetic.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <cstring>
#include <map>
#include <set>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/quant.h"

namespace reshard {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint32_t Load(const char* p, size_t esize) {
  if (esize == 4) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  if (esize == 1) return static_cast<uint8_t>(*p);
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void Store(char* p, size_t esize, uint32_t bits) {
  if (esize == 4) {
    std::memcpy(p, &bits, 4);
  } else if (esize == 1) {
    *p = static_cast<char>(bits);
  } else {
    uint16_t v = static_cast<uint16_t>(bits);
    std::memcpy(p, &v, 2);
  }
}

float BitsToFloat(uint32_t bits, fb::Dtype d) {
  if (d == fb::Dtype::fp8_e4m3) return E4m3ToFloat(static_cast<uint8_t>(bits));
  if (d == fb::Dtype::e8m0) return E8m0ToFloat(static_cast<uint8_t>(bits));
  char buf[4];
  Store(buf, DtypeSize(d), bits);
  return LoadAsFloat(buf, d);
}

uint32_t FloatToBits(float f, fb::Dtype d) {
  char buf[4];
  StoreFromFloat(buf, d, f);
  return Load(buf, DtypeSize(d));
}

// Visits every logical coordinate of a fragment with the element's address.
template <typename Fn>
void ForEachElement(const fb::Fragment& f, const fb::Tensor& t, const std::vector<char*>& buffers,
                    const fb::Program& program, Fn&& fn) {
  const int n = f.ndim();
  uint64_t lo[6], hi[6], c[6], tlo[6], extent[6];
  for (int d = 0; d < n; ++d) {
    lo[d] = f.lo()->Get(d);
    hi[d] = f.hi()->Get(d);
    if (hi[d] <= lo[d]) return;
    c[d] = lo[d];
    tlo[d] = (t.lo() && d < static_cast<int>(t.lo()->size())) ? t.lo()->Get(d) : 0;
    uint64_t thi = (t.hi() && d < static_cast<int>(t.hi()->size())) ? t.hi()->Get(d) : hi[d];
    extent[d] = thi > tlo[d] ? thi - tlo[d] : 1;
  }
  for (;;) {
    uint64_t buf = f.buffer(), off = f.offset(), index = 0;
    for (int d = 0; d < n; ++d) {
      uint64_t delta = (c[d] - lo[d]) * f.stride()->Get(d);
      if (f.buffer_dims() & (1u << d)) {
        buf += delta;
      } else {
        off += delta;
      }
      index = index * extent[d] + (c[d] - tlo[d]);
    }
    fb::Dtype dt = program.buffers()->Get(buf)->dtype();
    fn(buffers[buf] + off * DtypeSize(dt), dt, index, c, static_cast<uint32_t>(buf));
    int d = n - 1;
    for (; d >= 0; --d) {
      if (++c[d] < hi[d]) break;
      c[d] = lo[d];
    }
    if (d < 0) return;
  }
}

// What every element of a plan's tensors should hold: the synthetic values,
// quantized by the reference rules (runtime/quant.h) where a layout stores a
// tensor quantized. A tensor quantized on the training side is, as a logical
// tensor, its dequantized values (rounded to its dtype, as a sender sends
// them); an inference-side quantization quantizes those.
class Reference {
 public:
  explicit Reference(const fb::Plan& plan) : plan_(plan) {
    const uint32_t n = plan.tensors() ? plan.tensors()->size() : 0;
    for (uint32_t k = 0; k < n; ++k) {
      const fb::Tensor& t = *plan.tensors()->Get(k);
      if (t.scale_of() >= 0) scale_of_[{static_cast<uint32_t>(t.scale_of()), t.side() ? 1 : 0}] = k;
    }
  }

  /// The bits element `c` (index `index`) of `tensor` should have in a
  /// buffer of `dtype` on `side` (0 training, 1 inference).
  uint32_t Bits(uint32_t tensor, uint64_t index, const uint64_t* c, fb::Dtype dtype, int side) {
    const fb::Tensor& t = *plan_.tensors()->Get(tensor);
    if (t.scale_of() >= 0) {
      return ScaleBits(Scale(tensor, c), t.dtype() == fb::Dtype::e8m0);
    }
    if (dtype == fb::Dtype::fp8_e4m3) {
      auto it = scale_of_.find({tensor, side});
      if (it == scale_of_.end()) {
        throw Error("tensor '" + t.name()->str() + "' is in an fp8_e4m3 buffer but the plan has no scales for it");
      }
      uint64_t b[6];
      BlockOf(it->second, c, b);
      return QuantizeValue(side == 0 ? Raw(tensor, index) : Logical(tensor, index, c), Scale(it->second, b));
    }
    if (side == 0) {
      if (t.train_offset() == 0 && t.dtype() == dtype) return SyntheticBits(tensor, index, dtype);
      return FloatToBits(Stored(tensor, index), dtype);
    }
    // The receiver adds its buffers' offset to the values as sent (TransformRegion).
    const float v = Logical(tensor, index, c);
    return FloatToBits(t.infer_offset() == 0 ? v : v + t.infer_offset(), dtype);
  }

 private:
  float Raw(uint32_t tensor, uint64_t index) const {
    const fb::Tensor& t = *plan_.tensors()->Get(tensor);
    return SyntheticValue(tensor, index, t.dtype());
  }
  // What the training side's buffers hold: the synthetic value plus their
  // offset, in the tensor's dtype (a wider buffer holds it exactly).
  float Stored(uint32_t tensor, uint64_t index) const {
    const fb::Tensor& t = *plan_.tensors()->Get(tensor);
    const float raw = Raw(tensor, index);
    if (t.train_offset() == 0) return raw;
    return BitsToFloat(FloatToBits(raw + t.train_offset(), t.dtype()), t.dtype());
  }
  // The tensor's value as the training side sends it: its buffers' values
  // less their offset, rounded to the tensor's dtype (a pack's
  // TransformRegion), or its dequantized values.
  float Logical(uint32_t tensor, uint64_t index, const uint64_t* c) {
    auto it = scale_of_.find({tensor, 0});
    const float raw = Raw(tensor, index);
    if (it == scale_of_.end()) {
      const fb::Tensor& t = *plan_.tensors()->Get(tensor);
      if (t.train_offset() == 0) return raw;
      return BitsToFloat(FloatToBits(Stored(tensor, index) - t.train_offset(), t.dtype()), t.dtype());
    }
    uint64_t b[6];
    BlockOf(it->second, c, b);
    const float s = Scale(it->second, b);
    const fb::Dtype dt = plan_.tensors()->Get(tensor)->dtype();
    return BitsToFloat(FloatToBits(DequantizeValue(QuantizeValue(raw, s), s), dt), dt);
  }
  void BlockOf(uint32_t scale, const uint64_t* c, uint64_t* b) const {
    const fb::Tensor& k = *plan_.tensors()->Get(scale);
    for (uint32_t d = 0; d < k.block()->size(); ++d) b[d] = c[d] / k.block()->Get(d);
  }
  // The scale of block `b` of scale tensor `scale`, from the amax of its values.
  float Scale(uint32_t scale, const uint64_t* b) {
    const fb::Tensor& k = *plan_.tensors()->Get(scale);
    const uint32_t of = static_cast<uint32_t>(k.scale_of());
    const fb::Tensor& t = *plan_.tensors()->Get(of);
    const int n = static_cast<int>(k.block()->size());
    uint64_t key = 0;
    for (int d = 0; d < n; ++d) key = key * (k.hi()->Get(d) - k.lo()->Get(d)) + (b[d] - k.lo()->Get(d));
    auto [it, fresh] = cache_.emplace(std::make_pair(scale, key), 0.0f);
    if (!fresh) return it->second;
    uint64_t lo[6], hi[6], c[6];
    for (int d = 0; d < n; ++d) {
      lo[d] = b[d] * k.block()->Get(d);
      hi[d] = std::min<uint64_t>(lo[d] + k.block()->Get(d), t.hi()->Get(d));
      c[d] = lo[d];
    }
    float amax = 0;
    for (;;) {
      uint64_t index = 0;
      for (int d = 0; d < n; ++d) index = index * (t.hi()->Get(d) - t.lo()->Get(d)) + (c[d] - t.lo()->Get(d));
      amax = AmaxStep(amax, k.side() == 0 ? Raw(of, index) : Logical(of, index, c));
      int d = n - 1;
      while (d >= 0 && ++c[d] == hi[d]) c[d] = lo[d], --d;
      if (d < 0) break;
    }
    const float s = ScaleFromAmax(amax, k.dtype() == fb::Dtype::e8m0);
    cache_[std::make_pair(scale, key)] = s;
    return s;
  }

  const fb::Plan& plan_;
  std::map<std::pair<uint32_t, int>, uint32_t> scale_of_;  // (tensor, side) -> its scale tensor
  std::map<std::pair<uint32_t, uint64_t>, float> cache_;   // (scale tensor, block) -> scale
};

// 0 for a program's training-side fragments, 1 for its inference side's.
int SideOf(const fb::Fragment& f) { return f.role() ? 1 : 0; }

}  // namespace

uint32_t SyntheticBits(uint32_t tensor, uint64_t index, fb::Dtype dtype) {
  // Sign, exponent and mantissa from the hash; the exponent stays within the
  // normal range of fp16 (2^-14 .. 2^15) so that converting between bf16,
  // fp16 and fp32 never overflows, underflows or merges values more than the
  // narrower mantissa must.
  const uint64_t h = SplitMix(SplitMix(tensor) ^ index);
  const uint32_t sign = static_cast<uint32_t>(h >> 63);
  const int exp = -14 + static_cast<int>((h >> 32) % 30);
  const uint32_t mant = static_cast<uint32_t>(h);
  switch (dtype) {
    case fb::Dtype::bf16:
      return (sign << 15) | (static_cast<uint32_t>(exp + 127) << 7) | (mant & 0x7f);
    case fb::Dtype::fp16:
      return (sign << 15) | (static_cast<uint32_t>(exp + 15) << 10) | (mant & 0x3ff);
    case fb::Dtype::fp32:
      return (sign << 31) | (static_cast<uint32_t>(exp + 127) << 23) | (mant & 0x7fffff);
    default:
      throw Error(std::string("no synthetic values for dtype ") + DtypeName(dtype) +
                  "; quantized buffers hold the reference quantization of a wider tensor");
  }
}

float SyntheticValue(uint32_t tensor, uint64_t index, fb::Dtype dtype) {
  return BitsToFloat(SyntheticBits(tensor, index, dtype), dtype);
}

uint32_t PoisonBits(fb::Dtype dtype) {
  switch (dtype) {
    case fb::Dtype::bf16:
      return 0x7fda;
    case fb::Dtype::fp16:
      return 0x7e5a;
    case fb::Dtype::fp8_e4m3:
      return 0x7f;
    case fb::Dtype::e8m0:
      return 0xff;
    default:
      return 0x7fc0dead;
  }
}

void FillSources(const Plan& plan, const fb::Program& program, const std::vector<char*>& buffers) {
  if (program.fragments() == nullptr) return;
  Reference ref(plan.root());
  for (const fb::Fragment* f : *program.fragments()) {
    if (f->role() != 0) continue;
    const fb::Tensor& t = *plan.root().tensors()->Get(f->tensor());
    ForEachElement(*f, t, buffers, program, [&](char* p, fb::Dtype dt, uint64_t index, const uint64_t* c, uint32_t) {
      Store(p, DtypeSize(dt), ref.Bits(f->tensor(), index, c, dt, SideOf(*f)));
    });
  }
}

void PoisonDestinations(const fb::Program& program, const std::vector<char*>& buffers) {
  if (program.fragments() == nullptr) return;
  std::set<uint32_t> dests;
  for (const fb::Fragment* f : *program.fragments()) {
    if (f->role() != 1) continue;
    uint64_t span = 0;
    for (int d = 0; d < f->ndim(); ++d) {
      if (f->buffer_dims() & (1u << d)) {
        span += static_cast<uint64_t>(f->hi()->Get(d) - f->lo()->Get(d) - 1) * f->stride()->Get(d);
      }
    }
    for (uint64_t b = f->buffer(); b <= f->buffer() + span; ++b) dests.insert(static_cast<uint32_t>(b));
  }
  for (uint32_t b : dests) {
    const fb::Buffer& buf = *program.buffers()->Get(b);
    const size_t esize = DtypeSize(buf.dtype());
    const uint32_t bits = PoisonBits(buf.dtype());
    const uint64_t n = BufferElements(buf);
    for (uint64_t i = 0; i < n; ++i) Store(buffers[b] + i * esize, esize, bits);
  }
}

CheckResult CheckDestinations(const Plan& plan, const fb::Program& program, const std::vector<char*>& buffers,
                              size_t keep) {
  CheckResult result;
  if (program.fragments() == nullptr) return result;
  Reference ref(plan.root());
  for (const fb::Fragment* f : *program.fragments()) {
    if (f->role() != 1) continue;
    const fb::Tensor& t = *plan.root().tensors()->Get(f->tensor());
    ForEachElement(*f, t, buffers, program,
                   [&](char* p, fb::Dtype dt, uint64_t index, const uint64_t* c, uint32_t buf) {
                     ++result.checked;
                     const uint32_t want = ref.Bits(f->tensor(), index, c, dt, SideOf(*f));
                     uint32_t got = Load(p, DtypeSize(dt));
                     if (got == want) return;
                     ++result.wrong;
                     if (result.first.size() >= keep) return;
                     WrongElement w;
                     w.tensor = t.name() ? t.name()->str() : "";
                     w.coord.assign(c, c + f->ndim());
                     w.buffer = program.buffers()->Get(buf)->name()->str();
                     w.dtype = dt;
                     w.expected_bits = want;
                     w.got_bits = got;
                     w.expected = BitsToFloat(want, dt);
                     w.got = BitsToFloat(got, dt);
                     result.first.push_back(std::move(w));
                   });
  }
  return result;
}

std::string FormatWrong(const WrongElement& w) {
  std::string s = "tensor '" + w.tensor + "' [";
  for (size_t i = 0; i < w.coord.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(w.coord[i]);
  }
  const int digits = 2 * static_cast<int>(DtypeSize(w.dtype));
  char buf[160];
  std::snprintf(buf, sizeof buf, "] in buffer '%s': expected %.9g (0x%0*x), got %.9g (0x%0*x)", w.buffer.c_str(),
                w.expected, digits, w.expected_bits, w.got, digits, w.got_bits);
  return s + buf;
}

SyntheticRun RunSynthetic(const Plan& plan, uint32_t rank, Transport& transport, size_t keep,
                          const std::function<void()>& ready) {
  Session session(plan, rank, transport);
  const fb::Program& program = session.program();
  const uint32_t nbuf = program.buffers() ? program.buffers()->size() : 0;
  // 64-byte aligned, like the allocations a framework would hand over.
  std::vector<std::unique_ptr<char[], void (*)(void*)>> memory;
  std::vector<char*> ptrs;
  for (uint32_t b = 0; b < nbuf; ++b) {
    const fb::Buffer& buf = *program.buffers()->Get(b);
    size_t bytes = BufferElements(buf) * DtypeSize(buf.dtype());
    void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    if (p == nullptr) throw Error("rank " + std::to_string(rank) + ": cannot allocate " + std::to_string(bytes) +
                                  " bytes for buffer '" + buf.name()->str() + "'");
    memory.emplace_back(static_cast<char*>(p), std::free);
    ptrs.push_back(static_cast<char*>(p));
    session.bind(buf.name()->str(), p, buf.dtype(), std::vector<uint64_t>(buf.shape()->begin(), buf.shape()->end()));
  }
  PoisonDestinations(program, ptrs);
  FillSources(plan, program, ptrs);
  SyntheticRun out;
  if (ready) ready();
  out.stats = session.run();
  out.check = CheckDestinations(plan, program, ptrs, keep);
  return out;
}

}  // namespace reshard
