#include "runtime/pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace reshard {
namespace {

// Staging bytes [first, second), or a buffer's elements: buffer b's
// elements [lo, hi) are [b * 2^40 + lo, b * 2^40 + hi) (kBufferSpan).
using Range = std::pair<uint64_t, uint64_t>;
constexpr int kBufferShift = 40;
constexpr uint64_t kBufferSpan = uint64_t{1} << kBufferShift;
constexpr uint64_t kMostBuffers = uint64_t{1} << (64 - kBufferShift - 1);

struct Footprint {
  std::vector<Range> sread, swrite;
  std::vector<Range> bread, bwrite;

  void Add(const Footprint& o) {
    sread.insert(sread.end(), o.sread.begin(), o.sread.end());
    swrite.insert(swrite.end(), o.swrite.begin(), o.swrite.end());
    bread.insert(bread.end(), o.bread.begin(), o.bread.end());
    bwrite.insert(bwrite.end(), o.bwrite.begin(), o.bwrite.end());
  }
  void Normalize() {
    for (auto* v : {&sread, &swrite, &bread, &bwrite}) {
      std::sort(v->begin(), v->end());
      std::vector<Range> out;
      for (const Range& r : *v) {
        if (r.first >= r.second) continue;
        if (!out.empty() && r.first <= out.back().second) {
          out.back().second = std::max(out.back().second, r.second);
        } else {
          out.push_back(r);
        }
      }
      *v = std::move(out);
    }
  }
};

bool Overlap(const std::vector<Range>& a, const std::vector<Range>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].second <= b[j].first) {
      ++i;
    } else if (b[j].second <= a[i].first) {
      ++j;
    } else {
      return true;
    }
  }
  return false;
}

// Normalized footprints conflict when one writes what the other reads or writes.
bool Conflict(const Footprint& a, const Footprint& b) {
  return Overlap(a.swrite, b.sread) || Overlap(a.swrite, b.swrite) || Overlap(b.swrite, a.sread) ||
         Overlap(a.bwrite, b.bread) || Overlap(a.bwrite, b.bwrite) || Overlap(b.bwrite, a.bread);
}

class Footprinter {
 public:
  explicit Footprinter(const fb::Program& p) : p_(p) {}

  // A region read (write = false) or written, its staging elements of `dtype`.
  void Region(uint32_t region, fb::Dtype dtype, bool write, Footprint& f) const {
    if (region == kNone) return;
    const fb::Region& r = *p_.regions()->Get(region);
    if (RegionElements(r) == 0) return;
    if (r.buffer() != kNone) {
      // In each buffer it addresses, the span from its first element to its
      // last (a superset of what it touches: regions interleaved in one
      // buffer still conflict), in the buffer's elements.
      uint64_t last = r.offset();
      for (int k = 0; k < r.ndim(); ++k)
        if (!(r.buffer_modes() & (1u << k))) last += static_cast<uint64_t>(r.shape()->Get(k) - 1) * r.stride()->Get(k);
      const bool fits = last < kBufferSpan;
      auto& dst = write ? f.bwrite : f.bread;
      for (uint32_t b : RegionBuffers(r)) {
        const uint64_t base = uint64_t{b} << kBufferShift;
        if (b >= kMostBuffers) {  // past the key space: conflicts with every buffer region
          dst.push_back({0, ~uint64_t{0}});
        } else {
          dst.push_back(fits ? Range{base + r.offset(), base + last + 1} : Range{base, base + kBufferSpan});
        }
      }
      return;
    }
    uint64_t last = r.offset();
    for (int k = 0; k < r.ndim(); ++k) last += static_cast<uint64_t>(r.shape()->Get(k) - 1) * r.stride()->Get(k);
    const uint64_t size = DtypeSize(dtype);
    (write ? f.swrite : f.sread).push_back({r.offset() * size, (last + 1) * size});
  }
  static void Staging(const fb::Step& s, bool write, Footprint& f) {
    (write ? f.swrite : f.sread).push_back({s.staging(), uint64_t{s.staging()} + s.bytes()});
  }

  Footprint Of(uint32_t i, const fb::QuantOp* op) const {
    const fb::Step& s = *p_.steps()->Get(i);
    Footprint f;
    if (op != nullptr) {
      Region(s.src(), s.wire(), false, f);
      Region(s.dst(), s.wire(), true, f);
      if (op->scale() != kNone) {
        Region(op->scale(), op->scale_dtype(), false, f);
        Region(op->scale(), op->scale_dtype(), true, f);
      }
      return f;
    }
    switch (s.kind()) {
      case fb::StepKind::pack:
        Region(s.src(), s.wire(), false, f);
        Staging(s, true, f);
        break;
      case fb::StepKind::copy:
        Region(s.src(), s.wire(), false, f);
        Region(s.dst(), s.wire(), true, f);
        break;
      case fb::StepKind::unpack:
        if (s.src() == kNone) {
          Staging(s, false, f);
        } else {
          Region(s.src(), s.wire(), false, f);
        }
        Region(s.dst(), s.wire(), true, f);
        break;
      case fb::StepKind::recv:
        if (s.dst() == kNone) {
          Staging(s, true, f);
        } else {
          Region(s.dst(), s.wire(), true, f);
        }
        break;
      case fb::StepKind::send:
        if (s.src() == kNone) {
          Staging(s, false, f);
        } else {
          Region(s.src(), s.wire(), false, f);
        }
        break;
      default:  // forward
        Staging(s, false, f);
    }
    return f;
  }

 private:
  const fb::Program& p_;
};

}  // namespace

std::vector<uint32_t> RegionBuffers(const fb::Region& r) {
  std::vector<uint32_t> out;
  uint64_t combos = 1, span = 0;
  for (int k = 0; k < r.ndim(); ++k) {
    if (!(r.buffer_modes() & (1u << k))) continue;
    combos *= r.shape()->Get(k);
    span += static_cast<uint64_t>(r.shape()->Get(k) - 1) * r.stride()->Get(k);
  }
  if (combos == 0) return out;
  if (combos > (uint64_t{1} << 16)) {
    for (uint64_t b = r.buffer(); b <= r.buffer() + span; ++b) out.push_back(static_cast<uint32_t>(b));
    return out;
  }
  for (uint64_t c = 0; c < combos; ++c) {
    uint64_t rest = c, b = r.buffer();
    for (int k = r.ndim() - 1; k >= 0; --k) {
      if (!(r.buffer_modes() & (1u << k))) continue;
      b += (rest % r.shape()->Get(k)) * r.stride()->Get(k);
      rest /= r.shape()->Get(k);
    }
    out.push_back(static_cast<uint32_t>(b));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool PipelineEnabled() {
  const char* v = std::getenv("RESHARD_PIPELINE");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

PipelineSchedule SchedulePipeline(const fb::Program& program, bool enabled) {
  PipelineSchedule out;
  const auto* rb = program.round_begin();
  const uint32_t nrounds = rb != nullptr && rb->size() > 0 ? rb->size() - 1 : 0;
  out.early_pack.assign(nrounds, 0);
  out.late_unpack.assign(nrounds, 0);
  if (!enabled || nrounds < 2) return out;
  const uint32_t nsteps = program.steps() ? program.steps()->size() : 0;
  std::vector<const fb::QuantOp*> quant(nsteps, nullptr);
  if (program.quant_ops() != nullptr) {
    for (const fb::QuantOp* op : *program.quant_ops()) quant[op->step()] = op;
  }
  Footprinter fp(program);
  // Per round: its local phase before the messages, the messages, the unpacks.
  std::vector<Footprint> pack(nrounds), flight(nrounds), unpack(nrounds);
  std::vector<uint8_t> has_pack(nrounds, 0), has_unpack(nrounds, 0), has_flight(nrounds, 0);
  for (uint32_t r = 0; r < nrounds; ++r) {
    for (uint32_t i = rb->Get(r); i < rb->Get(r + 1); ++i) {
      const fb::StepKind k = program.steps()->Get(i)->kind();
      Footprint f = fp.Of(i, quant[i]);
      if (k == fb::StepKind::pack || k == fb::StepKind::copy) {
        pack[r].Add(f);
        has_pack[r] = 1;
      } else if (k == fb::StepKind::unpack) {
        unpack[r].Add(f);
        has_unpack[r] = 1;
      } else {
        flight[r].Add(f);
        has_flight[r] = 1;
      }
    }
    pack[r].Normalize();
    flight[r].Normalize();
    unpack[r].Normalize();
  }
  for (uint32_t r = 0; r + 1 < nrounds; ++r) {
    // Only work next to messages gains anything.
    const bool swap_ok = !Conflict(unpack[r], pack[r + 1]);
    if (has_pack[r + 1] && has_flight[r] && swap_ok && !Conflict(pack[r + 1], flight[r])) {
      out.early_pack[r + 1] = 1;
      ++out.overlapped_packs;
    }
    if (has_unpack[r] && has_flight[r + 1] && swap_ok && !Conflict(unpack[r], flight[r + 1])) {
      out.late_unpack[r] = 1;
      ++out.overlapped_unpacks;
    }
  }
  return out;
}

}  // namespace reshard
