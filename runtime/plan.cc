#include "runtime/plan.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>

#include "runtime/dtype.h"
#include "runtime/quant.h"

#include "runtime/error.h"

namespace reshard {
namespace {

// The flatbuffers verifier asserts buffers are below 2 GiB; refuse them first.
constexpr uint64_t kMaxPlanBytes = (uint64_t{1} << 31) - 1;

using u128 = unsigned __int128;

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// Four identifier bytes, printable ones as-is, the rest as \xNN.
std::string Printable(const uint8_t* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f) {
      out += static_cast<char>(p[i]);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
      out += buf;
    }
  }
  return out;
}

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

}  // namespace

size_t DtypeSize(fb::Dtype d) {
  switch (d) {
    case fb::Dtype::bf16:
    case fb::Dtype::fp16:
      return 2;
    case fb::Dtype::fp32:
      return 4;
    case fb::Dtype::fp8_e4m3:
    case fb::Dtype::e8m0:
      return 1;
  }
  return 0;
}

const char* DtypeName(fb::Dtype d) {
  static thread_local char buf[32];
  if (static_cast<unsigned>(d) <= static_cast<unsigned>(fb::Dtype::MAX)) return fb::EnumNameDtype(d);
  std::snprintf(buf, sizeof buf, "dtype(%u)", static_cast<unsigned>(d));
  return buf;
}

const char* StepKindName(fb::StepKind k) {
  static thread_local char buf[32];
  if (static_cast<unsigned>(k) <= static_cast<unsigned>(fb::StepKind::MAX)) {
    return fb::EnumNameStepKind(k);
  }
  std::snprintf(buf, sizeof buf, "kind(%u)", static_cast<unsigned>(k));
  return buf;
}

const char* QuantKindName(fb::QuantKind k) {
  static thread_local char buf[32];
  if (static_cast<unsigned>(k) <= static_cast<unsigned>(fb::QuantKind::MAX)) return fb::EnumNameQuantKind(k);
  std::snprintf(buf, sizeof buf, "quant(%u)", static_cast<unsigned>(k));
  return buf;
}

uint64_t RegionElements(const fb::Region& r) {
  uint64_t n = 1;
  int ndim = r.ndim() > 4 ? 4 : r.ndim();
  for (int k = 0; k < ndim; ++k) n *= r.shape()->Get(k);
  return n;
}

uint64_t BufferElements(const fb::Buffer& b) {
  uint64_t n = 1;
  if (b.shape() == nullptr) return 0;
  for (uint64_t s : *b.shape()) {
    if (s != 0 && n > UINT64_MAX / s) return UINT64_MAX;
    n *= s;
  }
  return n;
}

std::string FormatRegion(const fb::Region& r) {
  int ndim = r.ndim() > 4 ? 4 : r.ndim();
  std::string s = "(";
  for (int k = 0; k < ndim; ++k) {
    if (k) s += ",";
    s += std::to_string(r.shape()->Get(k));
  }
  s += "):(";
  for (int k = 0; k < ndim; ++k) {
    if (k) s += ",";
    if (r.buffer_modes() & (1u << k)) s += "b";
    s += std::to_string(r.stride()->Get(k));
  }
  return s + ")";
}

struct Plan::Impl {
  std::string path;
  const uint8_t* data = nullptr;
  size_t size = 0;
  void* map = nullptr;          // mmap'ed file, or null
  std::vector<uint8_t> owned;   // from_bytes
  std::mutex mu;
  std::vector<uint8_t> checked;  // per rank: 1 once program(r) passed its checks

  ~Impl() {
    if (map != nullptr) munmap(map, size);
  }

  [[noreturn]] void Fail(const std::string& what) const { throw Error(path + ": " + what); }

  void CheckRoot();
  void CheckProgram(uint32_t rank, const fb::Program& p) const;
};

void Plan::Impl::CheckRoot() {
  if (size < 8) Fail("file is " + std::to_string(size) + " bytes, too small to be a plan");
  if (size > kMaxPlanBytes) {
    Fail("file is " + std::to_string(size) + " bytes, larger than the 2 GiB a plan may have");
  }
  if (!flatbuffers::BufferHasIdentifier(data, fb::PlanIdentifier())) {
    Fail("not a reshard plan (file identifier is '" +
         Printable(data + sizeof(flatbuffers::uoffset_t), flatbuffers::kFileIdentifierLength) +
         "', expected 'RSPL')");
  }
  // The verifier runs before any field is read: a newer schema version still
  // verifies (fields are only ever added), so the version message below stays
  // accurate while a damaged file is reported as such.
  flatbuffers::Verifier verifier(data, size);
  if (!fb::VerifyPlanBuffer(verifier)) {
    Fail("the file is damaged or truncated (flatbuffers verification failed)");
  }
  const fb::Plan* root = fb::GetPlan(data);
  if (root->schema_version() != kSchemaVersion) {
    Fail("schema version " + std::to_string(root->schema_version()) + ", this reshard reads version " +
         std::to_string(kSchemaVersion));
  }
  uint32_t programs = root->programs() ? root->programs()->size() : 0;
  if (programs != root->num_ranks()) {
    Fail("the plan has " + std::to_string(root->num_ranks()) + " ranks but " + std::to_string(programs) +
         " programs");
  }
  checked.assign(root->num_ranks(), 0);
}

// Semantic checks of one program: everything the executor would dereference is
// in range, so a verified program cannot make the runtime touch memory outside
// the buffers it bound and the staging area it allocated.
void Plan::Impl::CheckProgram(uint32_t rank, const fb::Program& p) const {
  const std::string at = "rank " + std::to_string(rank) + ": ";
  const fb::Plan* root = fb::GetPlan(data);
  const uint32_t num_ranks = root->num_ranks();
  if (p.rank() != rank) Fail(at + "program says it is rank " + std::to_string(p.rank()));

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
      if (static_cast<unsigned>(b->dtype()) > static_cast<unsigned>(fb::Dtype::MAX)) {
        Fail(at + "buffer " + Quote(name) + " has unknown dtype " + DtypeName(b->dtype()));
      }
      uint64_t n = BufferElements(*b);
      if (n == UINT64_MAX) Fail(at + "buffer " + Quote(name) + " has more than 2^64 elements");
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
      if (f->ndim() > 6) Fail(fat + "has " + std::to_string(f->ndim()) + " dims, at most 6 allowed");
      if (f->role() > 1) Fail(fat + "role " + std::to_string(f->role()) + " is neither 0 nor 1");
      u128 off = f->offset(), bdelta = 0;
      bool empty = false;
      for (int d = 0; d < f->ndim(); ++d) {
        uint32_t lo = f->lo()->Get(d), hi = f->hi()->Get(d);
        if (hi < lo) Fail(fat + "dim " + std::to_string(d) + " has hi < lo");
        if (hi == lo) empty = true;
        u128 extent = static_cast<u128>(hi - lo == 0 ? 0 : hi - lo - 1) * f->stride()->Get(d);
        if (f->buffer_dims() & (1u << d)) {
          bdelta += extent;
        } else {
          off += extent;
        }
      }
      if (empty) continue;
      if (static_cast<u128>(f->buffer()) + bdelta >= nbuf) {
        Fail(fat + "addresses buffer " + std::to_string(static_cast<uint64_t>(f->buffer() + bdelta)) +
             ", the program binds " + std::to_string(nbuf) + " buffers");
      }
      for (uint64_t b = f->buffer(); b <= f->buffer() + static_cast<uint64_t>(bdelta); ++b) {
        if (off >= elements[b]) {
          Fail(fat + "at offset " + std::to_string(f->offset()) + " exceeds buffer " + Quote(names[b]) +
               " of " + std::to_string(elements[b]) + " elements");
        }
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
    if (RegionElements(r) == 0) return r;
    u128 last = r.offset(), bdelta = 0;
    uint64_t combos = 1;
    for (int k = 0; k < r.ndim(); ++k) {
      u128 extent = static_cast<u128>(r.shape()->Get(k) - 1) * r.stride()->Get(k);
      if (r.buffer_modes() & (1u << k)) {
        bdelta += extent;
        combos *= r.shape()->Get(k);
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
    region_ok[index] = 1;
    return r;
  };
  auto check_range = [&](const std::string& sat, uint64_t begin, uint64_t bytes) {
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
    switch (kind) {
      case fb::StepKind::pack: {
        const fb::Region& r = check_region(sat, s.src(), "src", s.wire(), true, false);
        check_bytes(sat, r, "src", s.bytes(), s.wire());
        check_range(sat, s.staging(), s.bytes());
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
          check_range(sat, s.staging(), s.bytes());
        } else {
          const fb::Region& r = check_region(sat, s.src(), "src", s.wire(), true, false);
          check_direct(sat, r, "src", s.wire());
          check_bytes(sat, r, "src", s.bytes(), s.wire());
        }
        break;
      case fb::StepKind::recv:
        if (s.dst() == kNone) {
          check_range(sat, s.staging(), s.bytes());
        } else {
          const fb::Region& r = check_region(sat, s.dst(), "dst", s.wire(), true, false);
          check_direct(sat, r, "dst", s.wire());
          check_bytes(sat, r, "dst", s.bytes(), s.wire());
        }
        break;
      case fb::StepKind::forward:
        check_range(sat, s.staging(), s.bytes());
        break;
      case fb::StepKind::unpack: {
        // Into a buffer, or into staging (a part of a block cover assembled there before it is quantized).
        const fb::Region& d = check_region(sat, s.dst(), "dst", s.wire(), true, true);
        check_convert(sat, s.wire(), dtype_of(d, s.wire()));
        if (s.src() == kNone) {
          check_bytes(sat, d, "dst", s.bytes(), s.wire());
          check_range(sat, s.staging(), s.bytes());
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

  // Rounds: round r = steps [round_begin[r], round_begin[r+1]).
  const auto* rb = p.round_begin();
  uint32_t nrb = rb ? rb->size() : 0;
  if (nrb == 0) {
    if (nsteps != 0) Fail(at + "round_begin is empty but the program has " + std::to_string(nsteps) + " steps");
    return;
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

Plan::Plan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Plan::Plan(Plan&& other) noexcept = default;
Plan& Plan::operator=(Plan&& other) noexcept = default;
Plan::~Plan() = default;

Plan Plan::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) impl->Fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    impl->Fail(std::string("cannot stat: ") + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    impl->Fail("not a regular file");
  }
  impl->size = static_cast<size_t>(st.st_size);
  if (impl->size < 8 || impl->size > kMaxPlanBytes) {
    ::close(fd);
    impl->CheckRoot();  // throws the size message
  }
  void* map = mmap(nullptr, impl->size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (map == MAP_FAILED) impl->Fail(std::string("cannot map: ") + std::strerror(e));
  impl->map = map;
  impl->data = static_cast<const uint8_t*>(map);
  impl->CheckRoot();
  return Plan(std::move(impl));
}

Plan Plan::from_bytes(std::vector<uint8_t> bytes, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->path = std::move(name);
  impl->owned = std::move(bytes);
  impl->data = impl->owned.data();
  impl->size = impl->owned.size();
  impl->CheckRoot();
  return Plan(std::move(impl));
}

const fb::Plan& Plan::root() const { return *fb::GetPlan(impl_->data); }
uint32_t Plan::num_ranks() const { return root().num_ranks(); }
const std::string& Plan::path() const { return impl_->path; }
size_t Plan::size_bytes() const { return impl_->size; }

const fb::Program& Plan::program(uint32_t global_rank) const {
  const uint32_t n = num_ranks();
  if (global_rank >= n) {
    impl_->Fail("rank " + std::to_string(global_rank) + " out of range (the plan has " + std::to_string(n) +
                " ranks)");
  }
  // The verifier already checked every program's structure when the plan was
  // opened; what is left is the semantic check of this rank's program.
  const fb::Program* program = root().programs()->Get(global_rank);
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->checked[global_rank]) return *program;
  impl_->CheckProgram(global_rank, *program);
  impl_->checked[global_rank] = 1;
  return *program;
}

}  // namespace reshard
