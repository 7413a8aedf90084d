#include "runtime/plan_check.h"

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/kernels.h"
#include "runtime/plan.h"
#include "runtime/quant.h"

namespace reshard {
namespace {

using u128 = unsigned __int128;

[[noreturn]] void FailAt(const std::string& file, const std::string& what) { throw Error(file + ": " + what); }

std::string Quote(const std::string& s) { return "'" + s + "'"; }

bool IsContiguous(const fb::Region& r) {
  // Contiguous: one buffer (no buffer mode of extent > 1) and, ignoring
  // extent-1 modes, strides are the running products of the inner shapes.
  uint64_t expect = 1;
  for (int k = r.ndim() - 1; k >= 0; --k) {
    uint32_t n = r.shape()->Get(k);
    if (n == 1) continue;
    if (r.buffer_modes() & (1u << k)) return false;
    if (r.stride()->Get(k) != expect) return false;
    expect *= n;
  }
  return true;
}

// a * b, or UINT64_MAX when it does not fit.
uint64_t MulSat(uint64_t a, uint64_t b) {
  if (a != 0 && b > UINT64_MAX / a) return UINT64_MAX;
  return a * b;
}

std::string Dims(const flatbuffers::Vector<uint64_t>* v) {
  std::string s = "[";
  for (uint32_t i = 0; v && i < v->size(); ++i) {
    if (i) s += ",";
    s += std::to_string(v->Get(i));
  }
  return s + "]";
}

// The flatbuffers verifier checks a vector's length prefix for 4-byte
// alignment only; vectors of 8-byte elements must be 8-byte aligned (the
// builder always aligns them; a hand-made file may not) or reading them is a
// misaligned load (an empty one may be anywhere). The plan's bytes start
// 8-byte aligned (mmap, new[]).
template <class V>
bool Aligned8(const V* v) {
  return v == nullptr || v->size() == 0 || reinterpret_cast<uintptr_t>(v->Data()) % 8 == 0;
}

std::string RegionCount(uint64_t n) { return n == UINT64_MAX ? std::string("more than 2^64") : std::to_string(n); }

}  // namespace

// The plan-wide tables: every rank map entry is a rank; every tensor has a
// name, a box of at most 6 dims with 32-bit coordinates and fewer than 2^63
// elements; every scale tensor names a model tensor of as many dims, positive
// blocks, and a box of blocks inside the tensor's.
void CheckPlanTables(const fb::Plan& plan, const std::string& file) {
  auto Fail = [&](const std::string& what) { FailAt(file, what); };
  const uint32_t num_ranks = plan.num_ranks();
  auto check_map = [&](const flatbuffers::Vector<uint32_t>* v, const char* what) {
    for (uint32_t i = 0; v && i < v->size(); ++i) {
      if (v->Get(i) >= num_ranks) {
        Fail(std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(v->Get(i)) +
             " is not a rank (the plan has " + std::to_string(num_ranks) + " ranks)");
      }
    }
  };
  check_map(plan.src_global(), "src_global");
  check_map(plan.dst_global(), "dst_global");
  if (plan.domain() && plan.domain()->size() != 0 && plan.domain()->size() != num_ranks) {
    Fail("domain lists " + std::to_string(plan.domain()->size()) + " ranks, the plan has " + std::to_string(num_ranks));
  }
  const uint32_t nt = plan.tensors() ? plan.tensors()->size() : 0;
  for (uint32_t k = 0; k < nt; ++k) {
    const fb::Tensor& t = *plan.tensors()->Get(k);
    std::string tat = "tensor " + std::to_string(k);
    if (t.name() == nullptr || t.name()->size() == 0) Fail(tat + " has no name");
    tat += " (" + Quote(t.name()->str()) + "): ";
    if (static_cast<unsigned>(t.dtype()) > static_cast<unsigned>(fb::Dtype::MAX)) {
      Fail(tat + "unknown dtype " + DtypeName(t.dtype()));
    }
    if (!std::isfinite(t.train_offset()) || !std::isfinite(t.infer_offset())) Fail(tat + "a non-finite offset");
    if (t.lo() == nullptr || t.hi() == nullptr) Fail(tat + "has no box (lo and hi)");
    if (!Aligned8(t.lo()) || !Aligned8(t.hi()) || !Aligned8(t.block())) {
      Fail(tat + "a vector of 64-bit values is not 8-byte aligned (the file is damaged)");
    }
    const uint32_t n = t.lo()->size();
    if (t.hi()->size() != n) {
      Fail(tat + "lo has " + std::to_string(n) + " dims, hi " + std::to_string(t.hi()->size()));
    }
    if (n > 6) Fail(tat + "has " + std::to_string(n) + " dims, at most 6 allowed");
    if (t.stack_dims() && t.stack_dims()->size() > n) {
      Fail(tat + "names " + std::to_string(t.stack_dims()->size()) + " stack dims of its " + std::to_string(n) +
           " dims");
    }
    uint64_t volume = 1;
    for (uint32_t d = 0; d < n; ++d) {
      const uint64_t lo = t.lo()->Get(d), hi = t.hi()->Get(d);
      if (hi < lo || hi > kMaxTensorExtent) {
        Fail(tat + "box " + Dims(t.lo()) + ".." + Dims(t.hi()) + ": dim " + std::to_string(d) +
             (hi < lo ? " has hi < lo" : " ends beyond 2^32 - 1 (coordinates are 32-bit)"));
      }
      volume = MulSat(volume, hi - lo);
    }
    if (volume > (uint64_t{1} << 63)) Fail(tat + "box " + Dims(t.lo()) + ".." + Dims(t.hi()) + " has more than 2^63 elements");
    if (t.side() > 1) Fail(tat + "side " + std::to_string(t.side()) + " is neither 0 (training) nor 1 (inference)");
    if (t.scale_of() == -1) continue;
    // A scale tensor.
    if (t.scale_of() < 0 || static_cast<uint32_t>(t.scale_of()) >= nt) {
      Fail(tat + "scale_of " + std::to_string(t.scale_of()) + " out of range (the plan has " + std::to_string(nt) +
           " tensors)");
    }
    const fb::Tensor& of = *plan.tensors()->Get(static_cast<uint32_t>(t.scale_of()));
    if (of.scale_of() != -1 || static_cast<uint32_t>(t.scale_of()) == k) {
      Fail(tat + "scale_of " + std::to_string(t.scale_of()) + " is a scale tensor itself");
    }
    if (t.dtype() != fb::Dtype::fp32 && t.dtype() != fb::Dtype::e8m0) {
      Fail(tat + "scales are " + DtypeName(t.dtype()) + ", expected fp32 or e8m0");
    }
    // `of` comes earlier or later in the table; check its box here as well.
    const uint32_t on = of.lo() && of.hi() && of.lo()->size() == of.hi()->size() ? of.lo()->size() : 7;
    if (on != n) {
      Fail(tat + "has " + std::to_string(n) + " dims, the tensor it scales " + std::to_string(on));
    }
    if (t.block() == nullptr || t.block()->size() != n) {
      Fail(tat + "block " + Dims(t.block()) + " should have " + std::to_string(n) + " dims");
    }
    uint64_t block_volume = 1;
    for (uint32_t d = 0; d < n; ++d) {
      const uint64_t b = t.block()->Get(d), ohi = of.hi()->Get(d);
      if (b == 0) Fail(tat + "block " + Dims(t.block()) + " is 0 in dim " + std::to_string(d));
      if (ohi > kMaxTensorExtent) Fail(tat + "the tensor it scales ends beyond 2^32 - 1 in dim " + std::to_string(d));
      const uint64_t blocks = ohi / b + (ohi % b != 0);
      if (t.hi()->Get(d) > blocks) {
        Fail(tat + "box " + Dims(t.lo()) + ".." + Dims(t.hi()) + " holds more than the " + std::to_string(blocks) +
             " blocks of " + std::to_string(b) + " in dim " + std::to_string(d) + " of tensor " +
             Quote(of.name() ? of.name()->str() : ""));
      }
      block_volume = MulSat(block_volume, b < ohi ? b : ohi);
    }
    if (block_volume > kMaxScaleBlockElements) {
      Fail(tat + "a block " + Dims(t.block()) + " spans " +
           (block_volume == UINT64_MAX ? std::string("more than 2^64") : std::to_string(block_volume)) +
           " elements, at most 2^32 are supported");
    }
  }
}

// Semantic checks of one program: everything the executor would dereference is
// in range, so a verified program cannot make the runtime touch memory outside
// the buffers it bound and the staging area it allocated.
void CheckProgram(const fb::Plan& plan, uint32_t rank, const fb::Program& p, const std::string& file) {
  auto Fail = [&](const std::string& what) { FailAt(file, what); };
  const std::string at = "rank " + std::to_string(rank) + ": ";
  const fb::Plan* root = &plan;
  const uint32_t num_ranks = root->num_ranks();
  if (p.rank() != rank) Fail(at + "program says it is rank " + std::to_string(p.rank()));

  if (!Aligned8(p.fragments()) || !Aligned8(p.regions())) {
    Fail(at + "the fragment or region table is not 8-byte aligned (the file is damaged)");
  }

  // Buffers.
  std::vector<uint64_t> elements;
  std::vector<std::string> names;
  std::set<std::string> seen;
  if (p.buffers() != nullptr) {
    for (uint32_t i = 0; i < p.buffers()->size(); ++i) {
      const fb::Buffer* b = p.buffers()->Get(i);
      if (b->name() == nullptr || b->name()->size() == 0) {
        Fail(at + "buffer " + std::to_string(i) + " has no name");
      }
      std::string name = b->name()->str();
      if (!seen.insert(name).second) Fail(at + "buffer " + Quote(name) + " is listed twice");
      if (b->shape() == nullptr) Fail(at + "buffer " + Quote(name) + " has no shape");
      if (!Aligned8(b->shape())) Fail(at + "buffer " + Quote(name) + ": the shape vector is not 8-byte aligned (the file is damaged)");
      if (static_cast<unsigned>(b->dtype()) > static_cast<unsigned>(fb::Dtype::MAX)) {
        Fail(at + "buffer " + Quote(name) + " has unknown dtype " + DtypeName(b->dtype()));
      }
      uint64_t n = BufferElements(*b);
      if (n == UINT64_MAX || MulSat(n, DtypeSize(b->dtype())) > kMaxBufferBytes) {
        Fail(at + "buffer " + Quote(name) + " of shape " + Dims(b->shape()) + " and " + DtypeName(b->dtype()) +
             " holds more than 2^62 bytes");
      }
      // An offset is arithmetic on the values: finite, and on a dtype that carries it.
      if (!std::isfinite(b->offset())) Fail(at + "buffer " + Quote(name) + " has a non-finite offset");
      if (b->offset() != 0 && !KernelSupports(b->dtype())) {
        Fail(at + "buffer " + Quote(name) + " of " + DtypeName(b->dtype()) +
             " has an offset; only bf16, fp16 and fp32 values carry one");
      }
      elements.push_back(n);
      names.push_back(std::move(name));
    }
  }
  const uint64_t nbuf = elements.size();
  const uint64_t staging_bytes = p.staging_bytes();
  const uint32_t nregions = p.regions() ? p.regions()->size() : 0;
  const uint32_t nsteps = p.steps() ? p.steps()->size() : 0;

  // Fragments (read by the synthetic fill/check of `reshard run`).
  const uint32_t ntensors = root->tensors() ? root->tensors()->size() : 0;
  if (p.fragments() != nullptr) {
    for (uint32_t i = 0; i < p.fragments()->size(); ++i) {
      const fb::Fragment* f = p.fragments()->Get(i);
      std::string fat = at + "fragment " + std::to_string(i) + ": ";
      if (f->tensor() >= ntensors) {
        Fail(fat + "tensor " + std::to_string(f->tensor()) + " out of range (the plan has " +
             std::to_string(ntensors) + " tensors)");
      }
      const fb::Tensor& t = *root->tensors()->Get(f->tensor());
      if (f->ndim() != t.lo()->size()) {
        Fail(fat + "has " + std::to_string(f->ndim()) + " dims, tensor " + Quote(t.name()->str()) + " has " +
             std::to_string(t.lo()->size()));
      }
      if (f->role() > 1) Fail(fat + "role " + std::to_string(f->role()) + " is neither 0 nor 1");
      u128 off = f->offset(), bdelta = 0;
      uint64_t volume = 1;
      for (int d = 0; d < f->ndim(); ++d) {
        const uint32_t lo = f->lo()->Get(d), hi = f->hi()->Get(d);
        if (hi <= lo || lo < t.lo()->Get(d) || hi > t.hi()->Get(d)) {
          Fail(fat + "dim " + std::to_string(d) + " [" + std::to_string(lo) + ", " + std::to_string(hi) + ") " +
               (hi <= lo ? std::string("is empty") :
                           "leaves tensor " + Quote(t.name()->str()) + " [" + std::to_string(t.lo()->Get(d)) + ", " +
                               std::to_string(t.hi()->Get(d)) + ")"));
        }
        volume *= hi - lo;  // at most 2^63: the tensor's box is
        u128 extent = static_cast<u128>(hi - lo - 1) * f->stride()->Get(d);
        if (f->buffer_dims() & (1u << d)) {
          bdelta += extent;
        } else {
          off += extent;
        }
      }
      if (f->buffer_dims() >> f->ndim()) Fail(fat + "marks buffer dims beyond its " + std::to_string(f->ndim()) + " dims");
      if (static_cast<u128>(f->buffer()) + bdelta >= nbuf) {
        Fail(fat + "addresses buffer " + std::to_string(static_cast<uint64_t>(f->buffer() + bdelta)) +
             ", the program binds " + std::to_string(nbuf) + " buffers");
      }
      // Distinct elements in distinct places: no more than the buffers hold.
      u128 room = 0;
      for (uint64_t b = f->buffer(); b <= f->buffer() + static_cast<uint64_t>(bdelta); ++b) {
        if (off >= elements[b]) {
          Fail(fat + "at offset " + std::to_string(f->offset()) + " exceeds buffer " + Quote(names[b]) +
               " of " + std::to_string(elements[b]) + " elements");
        }
        room += elements[b];
      }
      if (volume > room) {
        Fail(fat + "has " + std::to_string(volume) + " elements, more than the " +
             std::to_string(static_cast<uint64_t>(room)) + " of the buffers it lies in");
      }
    }
  }

  // A region's check depends only on the region unless it is in staging (then
  // its offsets count elements of the step's wire dtype); cache buffer ones.
  std::vector<uint8_t> region_ok(nregions, 0);
  auto check_region = [&](const std::string& sat, uint32_t index, const char* role, fb::Dtype wire,
                          bool want_buffer, bool want_staging) -> const fb::Region& {
    if (index >= nregions) {
      Fail(sat + role + " region " + std::to_string(index) + " out of range (the program has " +
           std::to_string(nregions) + " regions)");
    }
    const fb::Region& r = *p.regions()->Get(index);
    const bool staging = r.buffer() == kNone;
    if (staging && !want_staging) Fail(sat + role + " region " + FormatRegion(r) + " is in staging, expected a buffer");
    if (!staging && !want_buffer) Fail(sat + role + " region " + FormatRegion(r) + " is in a buffer, expected staging");
    if (!staging && region_ok[index]) return r;
    if (r.ndim() < 1 || r.ndim() > 4) {
      Fail(sat + role + " region " + std::to_string(index) + " has " + std::to_string(r.ndim()) +
           " modes, expected 1 to 4");
    }
    if (r.buffer_modes() >> r.ndim()) {
      Fail(sat + role + " region " + FormatRegion(r) + " marks buffer modes beyond its " +
           std::to_string(r.ndim()) + " modes");
    }
    for (int k = 0; k < r.ndim(); ++k) {
      if (r.shape()->Get(k) == 0) Fail(sat + role + " region " + FormatRegion(r) + " has an empty mode " + std::to_string(k));
    }
    const uint64_t count = RegionElements(r);
    u128 last = r.offset(), bdelta = 0;
    uint64_t combos = 1;
    for (int k = 0; k < r.ndim(); ++k) {
      u128 extent = static_cast<u128>(r.shape()->Get(k) - 1) * r.stride()->Get(k);
      if (r.buffer_modes() & (1u << k)) {
        bdelta += extent;
        combos = MulSat(combos, r.shape()->Get(k));
      } else {
        last += extent;
      }
    }
    if (staging) {
      if (r.buffer_modes() != 0) Fail(sat + role + " region " + FormatRegion(r) + " in staging has buffer modes");
      u128 end = (last + 1) * DtypeSize(wire);
      if (end > staging_bytes) {
        Fail(sat + role + " staging region " + FormatRegion(r) + " at offset " + std::to_string(r.offset()) +
             " ends at byte " + std::to_string(static_cast<uint64_t>(end)) + ", beyond the " +
             std::to_string(staging_bytes) + " staging bytes");
      }
      if (count > staging_bytes / DtypeSize(wire)) {
        Fail(sat + role + " staging region " + FormatRegion(r) + " has " + RegionCount(count) +
             " elements, more than the staging area holds");
      }
      return r;
    }
    if (static_cast<u128>(r.buffer()) + bdelta >= nbuf) {
      Fail(sat + role + " region " + FormatRegion(r) + " addresses buffer " +
           std::to_string(static_cast<uint64_t>(r.buffer() + bdelta)) + ", the program binds " +
           std::to_string(nbuf) + " buffers");
    }
    auto check_buffer = [&](uint64_t b) {
      if (p.buffers()->Get(b)->dtype() != p.buffers()->Get(r.buffer())->dtype()) {
        Fail(sat + role + " region " + FormatRegion(r) + " spans buffers " + Quote(names[r.buffer()]) + " of " +
             DtypeName(p.buffers()->Get(r.buffer())->dtype()) + " and " + Quote(names[b]) + " of " +
             DtypeName(p.buffers()->Get(b)->dtype()));
      }
      if (p.buffers()->Get(b)->offset() != p.buffers()->Get(r.buffer())->offset()) {
        Fail(sat + role + " region " + FormatRegion(r) + " spans buffers " + Quote(names[r.buffer()]) + " and " +
             Quote(names[b]) + " of different offsets");
      }
      if (last >= elements[b]) {
        Fail(sat + role + " region " + FormatRegion(r) + " at offset " + std::to_string(r.offset()) +
             " exceeds buffer " + Quote(names[b]) + " of " + std::to_string(elements[b]) + " elements");
      }
    };
    if (combos <= (uint64_t{1} << 16)) {
      // Visit exactly the buffers the region addresses.
      for (uint64_t c = 0; c < combos; ++c) {
        uint64_t rest = c, b = r.buffer();
        for (int k = r.ndim() - 1; k >= 0; --k) {
          if (!(r.buffer_modes() & (1u << k))) continue;
          b += (rest % r.shape()->Get(k)) * r.stride()->Get(k);
          rest /= r.shape()->Get(k);
        }
        check_buffer(b);
      }
    } else {
      for (uint64_t b = r.buffer(); b <= r.buffer() + static_cast<uint64_t>(bdelta); ++b) check_buffer(b);
    }
    // Distinct elements in distinct places: no more than the buffers in its range hold.
    u128 room = 0;
    for (uint64_t b = r.buffer(); b <= r.buffer() + static_cast<uint64_t>(bdelta); ++b) room += elements[b];
    if (count > room) {
      Fail(sat + role + " region " + FormatRegion(r) + " has " + RegionCount(count) + " elements, more than the " +
           std::to_string(static_cast<uint64_t>(room)) + " of the buffers it lies in");
    }
    region_ok[index] = 1;
    return r;
  };
  // Typed loads and stores of wire elements at `begin` (pack, unpack; a GPU
  // faults on misaligned ones): offsets are multiples of the element size.
  auto check_range = [&](const std::string& sat, uint64_t begin, uint64_t bytes, fb::Dtype wire) {
    if (begin % DtypeSize(wire) != 0) {
      Fail(sat + "staging offset " + std::to_string(begin) + " is not a multiple of the " +
           std::to_string(DtypeSize(wire)) + " bytes of a " + DtypeName(wire) + " element");
    }
    if (static_cast<u128>(begin) + bytes > staging_bytes) {
      Fail(sat + "staging range [" + std::to_string(begin) + ", " +
           std::to_string(static_cast<uint64_t>(static_cast<u128>(begin) + bytes)) + ") exceeds the " +
           std::to_string(staging_bytes) + " staging bytes");
    }
  };
  auto check_bytes = [&](const std::string& sat, const fb::Region& r, const char* role, uint64_t bytes,
                         fb::Dtype wire) {
    u128 want = static_cast<u128>(RegionElements(r)) * DtypeSize(wire);
    if (want != bytes) {
      Fail(sat + role + " region " + FormatRegion(r) + " holds " + std::to_string(static_cast<uint64_t>(want)) +
           " bytes of " + DtypeName(wire) + ", the step moves " + std::to_string(bytes));
    }
  };
  auto check_direct = [&](const std::string& sat, const fb::Region& r, const char* role, fb::Dtype wire) {
    if (!IsContiguous(r)) {
      Fail(sat + role + " region " + FormatRegion(r) + " is not contiguous in one buffer");
    }
    fb::Dtype bd = p.buffers()->Get(r.buffer())->dtype();
    if (bd != wire) {
      Fail(sat + role + " region is in buffer " + Quote(names[r.buffer()]) + " of " + DtypeName(bd) +
           ", the wire dtype is " + DtypeName(wire));
    }
    // The wire holds the model's values; a message straight from or into a
    // buffer moves its bytes unchanged.
    if (p.buffers()->Get(r.buffer())->offset() != 0) {
      Fail(sat + role + " region is in buffer " + Quote(names[r.buffer()]) +
           ", which holds values offset from the model's; it is sent and received through staging");
    }
  };

  // Quant ops: one per step at most, on local steps only.
  std::vector<const fb::QuantOp*> quant(nsteps, nullptr);
  if (p.quant_ops() != nullptr) {
    for (uint32_t q = 0; q < p.quant_ops()->size(); ++q) {
      const fb::QuantOp* op = p.quant_ops()->Get(q);
      const std::string qat = at + "quant op " + std::to_string(q) + ": ";
      if (op->step() >= nsteps) {
        Fail(qat + "step " + std::to_string(op->step()) + " out of range (the program has " + std::to_string(nsteps) +
             " steps)");
      }
      if (quant[op->step()] != nullptr) Fail(qat + "step " + std::to_string(op->step()) + " has two quant ops");
      quant[op->step()] = op;
    }
  }
  // The element conversions plain (non-quant) steps may ask of the kernels.
  auto check_convert = [&](const std::string& sat, fb::Dtype from, fb::Dtype to) {
    if (from == to || (KernelSupports(from) && KernelSupports(to))) return;
    Fail(sat + "converts " + DtypeName(from) + " to " + DtypeName(to) +
         " without a quant op (quantized buffers are read and written by quantize and dequantize steps)");
  };
  auto dtype_of = [&](const fb::Region& r, fb::Dtype staging_dtype) {
    return r.buffer() == kNone ? staging_dtype : p.buffers()->Get(r.buffer())->dtype();
  };
  auto check_quant = [&](const std::string& sat, const fb::Step& s, const fb::QuantOp& op) {
    if (s.kind() != fb::StepKind::pack && s.kind() != fb::StepKind::unpack && s.kind() != fb::StepKind::copy) {
      Fail(sat + "has a quant op, which only pack, unpack and copy steps take");
    }
    if (static_cast<unsigned>(op.kind()) > static_cast<unsigned>(fb::QuantKind::MAX)) {
      Fail(sat + "unknown quant kind " + std::to_string(static_cast<unsigned>(op.kind())));
    }
    if (op.scale_dtype() != fb::Dtype::fp32 && op.scale_dtype() != fb::Dtype::e8m0) {
      Fail(sat + "scale dtype " + DtypeName(op.scale_dtype()) + ", expected fp32 or e8m0");
    }
    const bool src_staging = s.kind() == fb::StepKind::unpack, dst_staging = s.kind() == fb::StepKind::pack;
    const bool copy = s.kind() == fb::StepKind::copy;
    if (s.src() == kNone || s.dst() == kNone) Fail(sat + "a quant step names both its src and dst regions");
    // The amax kinds run where the compiler puts them: partial amaxes on the
    // sender (a pack), their scales and the quantizing on the receiver (unpacks).
    const bool amax = op.kind() == fb::QuantKind::amax, from_amax = op.kind() == fb::QuantKind::scale_from_amax;
    if ((amax && s.kind() != fb::StepKind::pack) ||
        ((from_amax || op.kind() == fb::QuantKind::quantize_scaled) && s.kind() != fb::StepKind::unpack)) {
      Fail(sat + (amax ? "an " : "a ") + QuantKindName(op.kind()) + " op on a " + StepKindName(s.kind()) + " step");
    }
    if ((amax || from_amax) && op.scale() != kNone)
      Fail(sat + (amax ? "an " : "a ") + QuantKindName(op.kind()) + " op takes no scale region");
    if (!amax && !from_amax && op.scale() == kNone)
      Fail(sat + "the " + QuantKindName(op.kind()) + " op has no scale region");
    if ((amax || from_amax) && s.wire() != fb::Dtype::fp32)
      Fail(sat + "amaxes are fp32, the step's wire is " + DtypeName(s.wire()));
    const fb::Region& a = check_region(sat, s.src(), "src", s.wire(), !src_staging, src_staging || copy);
    const fb::Region& b =
        check_region(sat, s.dst(), "dst", from_amax ? op.scale_dtype() : s.wire(), !dst_staging, dst_staging || copy);
    for (const fb::Region* x : {&a, &b}) {
      if (x->buffer() != kNone && p.buffers()->Get(x->buffer())->offset() != 0) {
        Fail(sat + "a " + QuantKindName(op.kind()) + " op on buffer " + Quote(names[x->buffer()]) +
             ", which holds values offset from the model's (quant ops apply no offset)");
      }
    }
    QuantArgs args;
    if (op.scale() != kNone) {
      const fb::Region& c = check_region(sat, op.scale(), "scale", op.scale_dtype(), true, true);
      if (c.buffer() != kNone && p.buffers()->Get(c.buffer())->dtype() != op.scale_dtype()) {
        Fail(sat + "scale region is in buffer " + Quote(names[c.buffer()]) + " of " +
             DtypeName(p.buffers()->Get(c.buffer())->dtype()) + ", the op's scales are " + DtypeName(op.scale_dtype()));
      }
      args.scale = ViewOf(c, nullptr, op.scale_dtype());
    }
    args.kind = op.kind();
    args.src = ViewOf(a, nullptr, dtype_of(a, s.wire()));
    args.dst = ViewOf(b, nullptr, dtype_of(b, from_amax ? op.scale_dtype() : s.wire()));
    for (int k = 0; k < 2; ++k) args.origin[k] = op.origin()->Get(k), args.block[k] = op.block()->Get(k);
    try {
      CheckQuantArgs(args);
    } catch (const Error& e) {
      Fail(sat + e.what());
    }
  };

  for (uint32_t i = 0; i < nsteps; ++i) {
    const fb::Step& s = *p.steps()->Get(i);
    const std::string sat = at + "step " + std::to_string(i) + " (" + StepKindName(s.kind()) + "): ";
    if (static_cast<unsigned>(s.kind()) > static_cast<unsigned>(fb::StepKind::MAX)) Fail(sat + "unknown step kind");
    if (static_cast<unsigned>(s.wire()) > static_cast<unsigned>(fb::Dtype::MAX)) {
      Fail(sat + "unknown wire dtype " + DtypeName(s.wire()));
    }
    if (static_cast<unsigned>(s.channel()) > static_cast<unsigned>(fb::Channel::MAX)) {
      Fail(sat + "unknown channel " + std::to_string(static_cast<unsigned>(s.channel())));
    }
    if (s.dep() != kNone) {
      Fail(sat + "dep " + std::to_string(s.dep()) + " is not supported yet (must be 0xFFFFFFFF)");
    }
    const fb::StepKind kind = s.kind();
    if (quant[i] != nullptr) {
      check_quant(sat, s, *quant[i]);
      continue;
    }
    if (kind == fb::StepKind::send || kind == fb::StepKind::recv || kind == fb::StepKind::forward) {
      if (s.peer() >= num_ranks) {
        Fail(sat + "peer " + std::to_string(s.peer()) + " out of range (the plan has " + std::to_string(num_ranks) +
             " ranks)");
      }
      if (s.peer() == rank) Fail(sat + "peer is the rank itself");
    }
    // The region a step kind does not take is none (validate reads any it names).
    if ((kind == fb::StepKind::pack || kind == fb::StepKind::send || kind == fb::StepKind::forward) && s.dst() != kNone) {
      Fail(sat + "names dst region " + std::to_string(s.dst()) + ", which a " + StepKindName(kind) + " step does not take");
    }
    if ((kind == fb::StepKind::recv || kind == fb::StepKind::forward) && s.src() != kNone) {
      Fail(sat + "names src region " + std::to_string(s.src()) + ", which a " + StepKindName(kind) + " step does not take");
    }
    switch (kind) {
      case fb::StepKind::pack: {
        const fb::Region& r = check_region(sat, s.src(), "src", s.wire(), true, false);
        check_bytes(sat, r, "src", s.bytes(), s.wire());
        check_range(sat, s.staging(), s.bytes(), s.wire());
        check_convert(sat, dtype_of(r, s.wire()), s.wire());
        break;
      }
      case fb::StepKind::copy: {
        const fb::Region& a = check_region(sat, s.src(), "src", s.wire(), true, true);
        const fb::Region& b = check_region(sat, s.dst(), "dst", s.wire(), true, true);
        if (RegionElements(a) != RegionElements(b)) {
          Fail(sat + "src region " + FormatRegion(a) + " has " + std::to_string(RegionElements(a)) +
               " elements, dst region " + FormatRegion(b) + " has " + std::to_string(RegionElements(b)));
        }
        check_convert(sat, dtype_of(a, s.wire()), dtype_of(b, s.wire()));
        break;
      }
      case fb::StepKind::send:
        if (s.src() == kNone) {
          check_range(sat, s.staging(), s.bytes(), s.wire());
        } else {
          const fb::Region& r = check_region(sat, s.src(), "src", s.wire(), true, false);
          check_direct(sat, r, "src", s.wire());
          check_bytes(sat, r, "src", s.bytes(), s.wire());
        }
        break;
      case fb::StepKind::recv:
        if (s.dst() == kNone) {
          check_range(sat, s.staging(), s.bytes(), s.wire());
        } else {
          const fb::Region& r = check_region(sat, s.dst(), "dst", s.wire(), true, false);
          check_direct(sat, r, "dst", s.wire());
          check_bytes(sat, r, "dst", s.bytes(), s.wire());
        }
        break;
      case fb::StepKind::forward:
        check_range(sat, s.staging(), s.bytes(), s.wire());
        break;
      case fb::StepKind::unpack: {
        // Into a buffer, or into staging (a part of a block cover assembled there before it is quantized).
        const fb::Region& d = check_region(sat, s.dst(), "dst", s.wire(), true, true);
        check_convert(sat, s.wire(), dtype_of(d, s.wire()));
        if (s.src() == kNone) {
          check_bytes(sat, d, "dst", s.bytes(), s.wire());
          check_range(sat, s.staging(), s.bytes(), s.wire());
        } else {
          const fb::Region& r = check_region(sat, s.src(), "src", s.wire(), false, true);
          if (RegionElements(r) != RegionElements(d)) {
            Fail(sat + "src region " + FormatRegion(r) + " has " + std::to_string(RegionElements(r)) +
                 " elements, dst region " + FormatRegion(d) + " has " + std::to_string(RegionElements(d)));
          }
        }
        break;
      }
    }
  }

  // Regions no step uses are in range as well (show prints them).
  for (uint32_t i = 0; i < nregions; ++i) {
    if (region_ok[i]) continue;
    const fb::Region& r = *p.regions()->Get(i);
    check_region(at + "region " + std::to_string(i) + ": ", i, "the", r.buffer() == kNone ? fb::Dtype::fp8_e4m3 : fb::Dtype::fp32,
                 true, true);
  }

  // Rounds: round r = steps [round_begin[r], round_begin[r+1]).
  const auto* rb = p.round_begin();
  uint32_t nrb = rb ? rb->size() : 0;
  if (nrb == 0) {
    Fail(at + "round_begin is empty, expected at least [0] (the program has " + std::to_string(nsteps) + " steps)");
  }
  if (rb->Get(0) != 0) Fail(at + "round_begin[0] is " + std::to_string(rb->Get(0)) + ", expected 0");
  for (uint32_t r = 1; r < nrb; ++r) {
    if (rb->Get(r) < rb->Get(r - 1)) {
      Fail(at + "round_begin[" + std::to_string(r) + "] = " + std::to_string(rb->Get(r)) + " is below round_begin[" +
           std::to_string(r - 1) + "] = " + std::to_string(rb->Get(r - 1)));
    }
  }
  if (rb->Get(nrb - 1) != nsteps) {
    Fail(at + "round_begin ends at " + std::to_string(rb->Get(nrb - 1)) + ", expected the step count " +
         std::to_string(nsteps));
  }
}

}  // namespace reshard
