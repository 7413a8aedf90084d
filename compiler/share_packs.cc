#include "compiler/share_packs.h"

#include <map>
#include <tuple>

namespace reshard {
namespace {

// What a plain pack reads, in a comparable form.
using PackKey = std::tuple<uint32_t, uint64_t, int, std::array<int64_t, kMaxDims>, std::array<int64_t, kMaxDims>,
                           uint32_t, uint8_t, uint64_t>;

PackKey KeyOf(const RankProgram& p, const Step& s) {
  const StridedRegion r = p.regions[s.src].Coalesced();
  return {r.buffer, r.offset, r.ndim, r.shape, r.stride, r.buffer_modes, static_cast<uint8_t>(s.wire), s.bytes};
}

}  // namespace

SharedPacks SharePacks(PlanIR& ir) {
  SharedPacks out;
  for (RankProgram& p : ir.ranks) {
    auto in_staging = [&](uint32_t region) { return region != kNoRegion && p.regions[region].buffer == kStaging; };
    for (Round& round : p.rounds) {
      // Rounds that address staging through regions (block-scaled
      // conversions, gathers into staging) are left alone: only steps at a
      // staging offset are redirected below.
      bool regions = false;
      for (const std::vector<Step>* list : {&round.local, &round.comm, &round.unpack}) {
        for (const Step& s : *list) regions = regions || in_staging(s.src) || in_staging(s.dst) || s.quant >= 0;
      }
      if (regions) continue;
      std::map<PackKey, uint64_t> first;  // -> staging of the first pack
      std::map<uint64_t, std::pair<uint64_t, uint64_t>> moved;  // dropped staging -> (first's staging, bytes)
      for (const Step& s : round.local) {
        if (s.kind != StepKind::pack || s.quant >= 0 || s.src == kNoRegion) continue;
        auto [it, inserted] = first.emplace(KeyOf(p, s), s.staging);
        if (!inserted) moved[s.staging] = {it->second, s.bytes};
      }
      if (moved.empty()) continue;
      // The steps reading staging at an offset: sends, forwards, unpacks.
      std::vector<Step*> readers;
      for (Step& s : round.comm) {
        if (s.kind != StepKind::recv && !(s.kind == StepKind::send && s.src != kNoRegion)) readers.push_back(&s);
      }
      for (Step& s : round.unpack) {
        if (s.src == kNoRegion) readers.push_back(&s);
      }
      // A drop stands only if every reader of its bytes reads nothing else
      // (a message batching several packs' bytes keeps them all).
      for (const Step* r : readers) {
        auto it = moved.upper_bound(r->staging);
        if (it != moved.begin()) --it;
        while (it != moved.end() && it->first < r->staging + r->bytes) {
          const uint64_t lo = it->first, hi = lo + it->second.second;
          const bool touches = r->staging < hi && lo < r->staging + r->bytes;
          const bool inside = r->staging >= lo && r->staging + r->bytes <= hi;
          it = touches && !inside ? moved.erase(it) : std::next(it);
        }
      }
      if (moved.empty()) continue;
      for (Step* r : readers) {
        auto it = moved.upper_bound(r->staging);
        if (it == moved.begin()) continue;
        --it;
        const uint64_t lo = it->first, bytes = it->second.second;
        if (r->staging >= lo && r->staging + r->bytes <= lo + bytes) r->staging = it->second.first + (r->staging - lo);
      }
      std::vector<Step> kept;
      kept.reserve(round.local.size());
      for (const Step& s : round.local) {
        if (s.kind == StepKind::pack && s.quant < 0 && s.src != kNoRegion && moved.count(s.staging)) {
          ++out.packs;
          out.bytes += s.bytes;
          continue;
        }
        kept.push_back(s);
      }
      round.local = std::move(kept);
    }
  }
  return out;
}

}  // namespace reshard
