#include "compiler/share_packs.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "compiler/on_threads.h"

namespace reshard {
namespace {

struct Span {
  uint64_t lo = 0, hi = 0;  // staging bytes [lo, hi)
  bool overlaps(const Span& o) const { return lo < o.hi && o.lo < hi; }
};

// The staging bytes a region in staging touches, from its first element to
// its last (elements of `esize` bytes).
Span HullOf(const StridedRegion& r, size_t esize) {
  uint64_t last = r.offset;
  for (int k = 0; k < r.ndim; ++k) last += static_cast<uint64_t>(r.shape[k] - 1) * r.stride[k];
  return {r.offset * esize, (last + 1) * esize};
}

// A pack that may repeat another: where its bytes start, and everything they
// depend on (equal keys: equal bytes at equal offsets from `base`).
struct Pack {
  uint64_t base = 0, bytes = 0;
  std::string key;
  bool quant = false;
};

void Put(std::string& key, const void* data, size_t n) { key.append(static_cast<const char*>(data), n); }
template <typename T>
void Put(std::string& key, const T& v) {
  Put(key, &v, sizeof v);
}
void PutRegion(std::string& key, const StridedRegion& r) {
  Put(key, r.buffer), Put(key, r.offset), Put(key, r.ndim), Put(key, r.buffer_modes);
  for (int k = 0; k < r.ndim; ++k) Put(key, r.shape[k]), Put(key, r.stride[k]);
}

// The pack at `local[i]`, or false where it cannot be shared: its source is
// not a buffer, or what it writes in staging is not dense.
bool AsPack(const RankProgram& p, const std::vector<Step>& local, size_t i, Pack& out) {
  const Step& s = local[i];
  if (s.kind != StepKind::pack || s.src == kNoRegion || p.regions[s.src].buffer == kStaging) return false;
  out = Pack{};
  std::vector<Span> parts;
  if (s.quant < 0) {
    if (s.dst != kNoRegion) return false;
    PutRegion(out.key, p.regions[s.src].Coalesced());
    Put(out.key, s.wire), Put(out.key, s.bytes);
    parts.push_back({s.staging, s.staging + s.bytes});
  } else {
    const QuantOpIR& q = p.quant_ops[s.quant];
    if (s.dst == kNoRegion) return false;
    // Block-scaled kernels read the modes (outer..., rows, cols) as written: raw regions.
    PutRegion(out.key, p.regions[s.src]);
    Put(out.key, s.wire), Put(out.key, q.kind), Put(out.key, q.origin), Put(out.key, q.block), Put(out.key, q.scale_dtype);
    out.quant = true;
    auto dense = [&](uint32_t region, size_t esize) {
      const StridedRegion& r = p.regions[region];
      if (r.buffer != kStaging || !r.Coalesced().contiguous()) return false;
      Put(out.key, r.ndim);
      for (int k = 0; k < r.ndim; ++k) Put(out.key, r.shape[k]), Put(out.key, r.stride[k]);
      parts.push_back({r.offset * esize, (r.offset + static_cast<uint64_t>(r.elements())) * esize});
      return true;
    };
    if (!dense(s.dst, DtypeBytes(s.wire))) return false;
    Put(out.key, q.scale != kNoRegion);
    if (q.scale != kNoRegion && !dense(q.scale, DtypeBytes(q.scale_dtype))) return false;
  }
  out.base = parts[0].lo;
  for (const Span& x : parts) out.base = std::min(out.base, x.lo), out.bytes += x.hi - x.lo;
  // Where each part lies from the base is part of what the readers see.
  for (const Span& x : parts) Put(out.key, x.lo - out.base), Put(out.key, x.hi - out.base);
  return out.bytes > 0;
}

// A step's touch of staging: reads at a staging offset (sends, forwards,
// unpacks: these can be redirected), writes (receives, packs) and reads
// through regions.
struct Access {
  Span span;
  Step* step = nullptr;  // set for a read at an offset
  bool write = false;
  int owner = -1;  // the Pack whose step this is, if any
};

void AccessesOf(const RankProgram& p, std::vector<Step>& list, const std::vector<int>* pack_of,
                std::vector<Access>& out) {
  for (size_t i = 0; i < list.size(); ++i) {
    Step& s = list[i];
    const int owner = pack_of ? (*pack_of)[i] : -1;
    auto region = [&](uint32_t r, size_t esize, bool write) {
      if (r != kNoRegion && p.regions[r].buffer == kStaging) out.push_back({HullOf(p.regions[r], esize), nullptr, write, owner});
    };
    const Span at{s.staging, s.staging + s.bytes};
    switch (s.kind) {
      case StepKind::send:
      case StepKind::unpack:
        if (s.src == kNoRegion) out.push_back({at, &s, false, owner});
        break;
      case StepKind::forward:
        out.push_back({at, &s, false, owner});
        break;
      case StepKind::recv:
        if (s.dst == kNoRegion) out.push_back({at, nullptr, true, owner});
        break;
      case StepKind::pack:
        if (s.dst == kNoRegion) out.push_back({at, nullptr, true, owner});
        break;
      case StepKind::copy:
        break;
    }
    if (s.kind == StepKind::pack || s.kind == StepKind::unpack || s.kind == StepKind::copy) {
      size_t dst_size = DtypeBytes(s.wire);
      if (s.quant >= 0) {
        const QuantOpIR& q = p.quant_ops[s.quant];
        if (q.kind == QuantKind::scale_from_amax) dst_size = DtypeBytes(q.scale_dtype);
        // Scales: written by quantize, read by the others; counted as written.
        region(q.scale, DtypeBytes(q.scale_dtype), true);
      }
      region(s.src, DtypeBytes(s.wire), false);
      region(s.dst, dst_size, true);
    }
  }
}

// Staging writes sorted by start, with the running maximum of their ends, to
// find those that overlap a span.
class Writes {
 public:
  explicit Writes(std::vector<Access> w) : w_(std::move(w)) {
    std::sort(w_.begin(), w_.end(), [](const Access& x, const Access& y) { return x.span.lo < y.span.lo; });
    for (const Access& a : w_) max_hi_.push_back(std::max(max_hi_.empty() ? 0 : max_hi_.back(), a.span.hi));
  }
  template <typename Fn>
  void Overlapping(const Span& s, Fn fn) const {
    size_t i = std::lower_bound(w_.begin(), w_.end(), s.hi, [](const Access& a, uint64_t x) { return a.span.lo < x; }) -
               w_.begin();
    while (i > 0 && max_hi_[i - 1] > s.lo) {
      --i;
      if (w_[i].span.overlaps(s)) fn(w_[i]);
    }
  }

 private:
  std::vector<Access> w_;
  std::vector<uint64_t> max_hi_;
};

// One rank's rounds; adds what it drops to `out`.
void SharePacksOf(RankProgram& p, SharedPacks& out) {
  for (Round& round : p.rounds) {
    std::vector<Pack> packs;
    std::vector<int> pack_of(round.local.size(), -1);
    std::vector<int> first_of;  // per Pack: the Pack it repeats, or -1
    std::map<std::string, int> first;
    for (size_t i = 0; i < round.local.size(); ++i) {
      Pack k;
      if (!AsPack(p, round.local, i, k)) continue;
      auto [it, inserted] = first.emplace(k.key, static_cast<int>(packs.size()));
      pack_of[i] = static_cast<int>(packs.size());
      first_of.push_back(inserted ? -1 : it->second);
      packs.push_back(std::move(k));
    }
    std::vector<char> drop(packs.size(), 0);
    for (size_t k = 0; k < packs.size(); ++k) drop[k] = first_of[k] >= 0;
    if (std::find(drop.begin(), drop.end(), 1) == drop.end()) continue;
    auto is_dup = [&](int k) { return k >= 0 && first_of[k] >= 0; };
    auto delta = [&](int k) { return packs[first_of[k]].base - packs[k].base; };  // modulo 2^64

    std::vector<Access> acc;
    AccessesOf(p, round.local, &pack_of, acc);
    AccessesOf(p, round.comm, nullptr, acc);
    AccessesOf(p, round.unpack, nullptr, acc);
    std::vector<Access> w;
    for (const Access& a : acc)
      if (a.write && a.span.lo < a.span.hi) w.push_back(a);
    const Writes writes(std::move(w));

    // A reader at an offset whose span holds repeats' bytes reads the
    // first copies' instead: every write in its span must be a repeat
    // moved by the same distance, and every write in the span it then
    // reads a first copy of one of them.
    struct Redirect {
      Step* step;
      uint64_t delta;
      std::vector<int> dups;
    };
    std::vector<Redirect> redirects;
    for (const Access& a : acc) {
      if (a.write || a.span.lo == a.span.hi) continue;
      std::vector<int> dups;
      bool others = false;
      writes.Overlapping(a.span, [&](const Access& b) { is_dup(b.owner) ? dups.push_back(b.owner) : void(others = true); });
      if (dups.empty()) continue;
      bool ok = a.step != nullptr && !others;
      for (int k : dups) ok = ok && delta(k) == delta(dups[0]);
      if (ok) {
        const uint64_t d = delta(dups[0]);
        writes.Overlapping({a.span.lo + d, a.span.hi + d}, [&](const Access& b) {
          ok = ok && std::any_of(dups.begin(), dups.end(), [&](int k) { return first_of[k] == b.owner; });
        });
      }
      if (ok) {
        redirects.push_back({a.step, delta(dups[0]), std::move(dups)});
      } else {
        for (int k : dups) drop[k] = 0;
      }
    }
    // A reader redirected reads all its repeats from their first copies,
    // or none: one kept repeat keeps them all.
    for (bool changed = true; changed;) {
      changed = false;
      for (const Redirect& r : redirects) {
        if (std::all_of(r.dups.begin(), r.dups.end(), [&](int k) { return drop[k]; })) continue;
        for (int k : r.dups) changed = changed || drop[k], drop[k] = 0;
      }
    }
    for (const Redirect& r : redirects)
      if (drop[r.dups[0]]) r.step->staging += r.delta;

    std::vector<Step> kept;
    kept.reserve(round.local.size());
    for (size_t i = 0; i < round.local.size(); ++i) {
      const int k = pack_of[i];
      if (k >= 0 && drop[k]) {
        ++out.packs;
        if (packs[k].quant) ++out.quant_packs;
        out.bytes += packs[k].bytes;
        continue;
      }
      kept.push_back(round.local[i]);
    }
    round.local = std::move(kept);
  }
}

}  // namespace

// Every rank on its own (a rank's steps read and write its own staging
// only), on as many threads as the machine has, each taking every T-th rank.
SharedPacks SharePacks(PlanIR& ir) {
  const size_t threads = ThreadsFor(ir.ranks.size());
  std::vector<SharedPacks> counts(threads);
  OnThreads(threads, [&](size_t t) {
    for (size_t g = t; g < ir.ranks.size(); g += threads) SharePacksOf(ir.ranks[g], counts[t]);
  });
  SharedPacks out;
  for (const SharedPacks& c : counts) out.packs += c.packs, out.quant_packs += c.quant_packs, out.bytes += c.bytes;
  return out;
}

}  // namespace reshard
