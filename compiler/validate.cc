#include "compiler/validate.h"

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <unordered_map>

#include "compiler/box.h"
#include "compiler/expand.h"

namespace reshard {
namespace {

constexpr uint32_t kNoneIdx = 0xFFFFFFFFu;

size_t WireSize(fb::Dtype d) { return DtypeBytes(static_cast<Dtype>(d)); }  // the enums share values

// An affine map from a logical box to memory (a fragment, or a staging segment).
struct Affine {
  int tensor = 0;
  Box box;
  int64_t buffer = 0, offset = 0;
  std::array<int64_t, kMaxDims> stride{};
  uint32_t buffer_dims = 0;
};

StridedRegion ToRegion(const fb::Region& r) {
  StridedRegion s;
  s.buffer = r.buffer();
  s.offset = r.offset();
  s.ndim = r.ndim();
  s.buffer_modes = r.buffer_modes();
  for (int k = 0; k < s.ndim && k < 4; ++k) s.shape[k] = r.shape()->Get(k), s.stride[k] = r.stride()->Get(k);
  return s;
}

bool SameRegion(const StridedRegion& a, const StridedRegion& b) {
  if (a.ndim != b.ndim || a.buffer_modes != b.buffer_modes || a.offset != b.offset || a.buffer != b.buffer) return false;
  for (int k = 0; k < a.ndim; ++k)
    if (a.shape[k] != b.shape[k] || a.stride[k] != b.stride[k]) return false;
  return true;
}

// Decomposes `delta` over the dims in `mask` (largest stride first); false if it
// does not land on a coordinate inside the box.
bool Decompose(const Affine& f, uint32_t mask, int64_t delta, std::array<int64_t, kMaxDims>& c) {
  if (delta < 0) return false;
  std::array<int, kMaxDims> dims{};
  int n = 0;
  for (int d = 0; d < f.box.ndim; ++d)
    if ((mask >> d & 1) && f.stride[d] > 0) dims[n++] = d;
  for (int i = 1; i < n; ++i)  // largest stride first (at most kMaxDims dims)
    for (int j = i; j > 0 && f.stride[dims[j]] > f.stride[dims[j - 1]]; --j) std::swap(dims[j], dims[j - 1]);
  for (int i = 0; i < n; ++i) {
    int d = dims[i];
    c[d] = delta / f.stride[d];
    delta -= c[d] * f.stride[d];
    if (c[d] >= f.box.extent(d)) return false;
  }
  return delta == 0;
}

// The logical box that `r` covers through `f`, if `r` is exactly the image of a box.
bool Invert(const Affine& f, const StridedRegion& r, Box& out) {
  std::array<int64_t, kMaxDims> c{};
  uint32_t all = (1u << f.box.ndim) - 1;
  if (!Decompose(f, f.buffer_dims, static_cast<int64_t>(r.buffer) - f.buffer, c)) return false;
  if (!Decompose(f, all & ~f.buffer_dims, static_cast<int64_t>(r.offset) - f.offset, c)) return false;
  Box b;
  b.ndim = f.box.ndim;
  for (int d = 0; d < b.ndim; ++d) b.lo[d] = f.box.lo[d] + c[d], b.hi[d] = b.lo[d] + 1;
  // Match the region's modes to logical dims, innermost first.
  int d = b.ndim - 1;
  for (int m = r.ndim - 1; m >= 0; --m) {
    bool isbuf = r.buffer_modes >> m & 1;
    int64_t want = r.stride[m], rem = r.shape[m];
    if (rem == 1) continue;
    while (d >= 0 && !(f.stride[d] == want && ((f.buffer_dims >> d & 1) == isbuf) && f.box.hi[d] - b.lo[d] > 1)) --d;
    if (d < 0) return false;
    while (rem > 1) {
      if (d < 0) return false;
      int64_t avail = f.box.hi[d] - b.lo[d];
      if (rem <= avail) {
        b.hi[d] = b.lo[d] + rem;
        rem = 1;
      } else {
        if (rem % avail != 0) return false;
        b.hi[d] = b.lo[d] + avail;
        rem /= avail;
      }
      --d;
    }
  }
  // The reconstructed box must map exactly onto the region.
  reshard::Fragment fr;
  fr.tensor = f.tensor;
  fr.box = f.box;
  fr.buffer = static_cast<uint32_t>(f.buffer);
  fr.offset = static_cast<uint64_t>(f.offset);
  fr.stride = f.stride;
  fr.buffer_dims = f.buffer_dims;
  StridedRegion back = fr.RegionOf(b).Coalesced();
  back.buffer = r.buffer;  // staging keeps its sentinel
  if (!SameRegion(back, r.Coalesced())) return false;
  out = b;
  return true;
}

struct Seg {
  uint64_t bytes;
  int tensor;
  Box box;
  fb::Dtype wire;
};
using Staging = std::map<uint64_t, Seg>;  // byte offset -> segment

struct Msg {
  uint64_t bytes;
  fb::Channel channel;
  std::vector<std::pair<uint64_t, Seg>> segs;  // relative offset
  std::string where;
};

class Validator {
 public:
  Validator(const fb::Plan& plan, const std::function<const fb::Program&(uint32_t)>& program, size_t max_errors)
      : plan_(plan), program_(program), max_errors_(max_errors) {}

  ValidateReport Run();

 private:
  struct RankState {
    const fb::Program* p = nullptr;
    std::vector<std::vector<Affine>> frags;                  // [role]
    std::vector<std::unordered_map<uint32_t, std::vector<int>>> by_buffer;  // [role] buffer -> frag ids
    std::vector<std::vector<Box>> written;                  // per role-1 fragment
    std::vector<std::vector<std::string>> written_by;
    Staging staging;
    size_t round = 0;
    int phase = 0;  // 0 local, 1 comm, 2 unpack, 3 done
    size_t next_comm = 0;  // next comm step of the round still waiting
  };

  void Error(const std::string& msg) {
    ++report_.total_errors;
    if (report_.errors.size() < max_errors_) report_.errors.push_back(msg);
  }
  std::string Where(uint32_t rank, size_t step) const {
    const fb::Step* s = states_[rank].p->steps()->Get(static_cast<uint32_t>(step));
    static const char* names[] = {"pack", "send", "recv", "unpack", "copy", "forward"};
    uint8_t k = static_cast<uint8_t>(s->kind());
    return "rank " + std::to_string(rank) + " round " + std::to_string(states_[rank].round) + " step " +
           std::to_string(step) + " (" + (k < 6 ? names[k] : "?") + ")";
  }
  std::string TensorName(int t) const {
    return plan_.tensors() && t < static_cast<int>(plan_.tensors()->size()) ? plan_.tensors()->Get(t)->name()->str()
                                                                            : "#" + std::to_string(t);
  }
  // Resolves a buffer region on `rank` through fragments of `role`.
  bool Resolve(uint32_t rank, int role, const StridedRegion& r, int& frag, Box& box) {
    RankState& st = states_[rank];
    auto it = st.by_buffer[role].find(r.buffer);
    if (it == st.by_buffer[role].end()) return false;
    for (int f : it->second)
      if (Invert(st.frags[role][f], r, box)) {
        frag = f;
        return true;
      }
    return false;
  }
  // Resolves a staging region (element offsets of `wire`) to a segment's tensor and box.
  bool ResolveStaging(uint32_t rank, const StridedRegion& r, fb::Dtype wire, Seg& out) {
    Staging& st = states_[rank].staging;
    uint64_t byte = r.offset * WireSize(wire);
    auto it = st.upper_bound(byte);
    if (it == st.begin()) return false;
    --it;
    const Seg& s = it->second;
    if (byte >= it->first + s.bytes || s.wire != wire) return false;
    Affine a;
    a.tensor = s.tensor;
    a.box = s.box;
    a.offset = static_cast<int64_t>(it->first / WireSize(wire));
    a.buffer = r.buffer;
    int64_t stride = 1;
    for (int d = s.box.ndim - 1; d >= 0; --d) a.stride[d] = stride, stride *= s.box.extent(d);
    Box b;
    if (!Invert(a, r, b)) return false;
    out = {static_cast<uint64_t>(b.volume()) * WireSize(wire), s.tensor, b, wire};
    return true;
  }
  void Write(Staging& st, uint64_t off, const Seg& s) {
    auto it = st.lower_bound(off);
    if (it != st.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second.bytes > off) it = prev;
    }
    while (it != st.end() && it->first < off + s.bytes) it = st.erase(it);
    st.emplace(off, s);
  }
  void Written(uint32_t rank, int frag, const Box& box, const std::string& where) {
    states_[rank].written[frag].push_back(box);
    states_[rank].written_by[frag].push_back(where);
    report_.dest_elements += box.volume();
  }
  // Destination write of (tensor, box) into region `dst` on `rank`.
  void Land(uint32_t rank, const StridedRegion& dst, const Seg& what, const std::string& where) {
    int frag;
    Box box;
    if (!Resolve(rank, 1, dst, frag, box)) {
      Error(where + ": destination region " + dst.str() + " of buffer " + std::to_string(dst.buffer) +
            " is not the image of a box of any tensor the rank needs");
      return;
    }
    const Affine& f = states_[rank].frags[1][frag];
    if (f.tensor != what.tensor || !(box == what.box)) {
      Error(where + ": writes " + TensorName(what.tensor) + " " + what.box.str() + " into the place of " +
            TensorName(f.tensor) + " " + box.str());
      return;
    }
    Written(rank, frag, box, where);
  }
  void Local(uint32_t rank, size_t i);
  void Unpack(uint32_t rank, size_t i);
  void PostSend(uint32_t rank, size_t i);
  bool TryRecv(uint32_t rank, size_t i);
  void Coverage();

  const fb::Plan& plan_;
  const std::function<const fb::Program&(uint32_t)>& program_;
  size_t max_errors_;
  ValidateReport report_;
  std::vector<RankState> states_;
  std::map<std::pair<uint32_t, uint32_t>, std::deque<Msg>> queues_;
};

void Validator::Local(uint32_t rank, size_t i) {
  RankState& st = states_[rank];
  const fb::Step* s = st.p->steps()->Get(static_cast<uint32_t>(i));
  std::string where = Where(rank, i);
  if (s->kind() == fb::StepKind::pack) {
    StridedRegion r = ToRegion(*st.p->regions()->Get(s->src()));
    int frag;
    Box box;
    if (!Resolve(rank, 0, r, frag, box)) {
      Error(where + ": source region " + r.str() + " of buffer " + std::to_string(r.buffer) +
            " is not the image of a box of any tensor the rank holds");
      return;
    }
    uint64_t bytes = static_cast<uint64_t>(box.volume()) * WireSize(s->wire());
    if (bytes != s->bytes()) Error(where + ": packs " + std::to_string(bytes) + " bytes, the step says " + std::to_string(s->bytes()));
    Write(st.staging, s->staging(), {bytes, st.frags[0][frag].tensor, box, s->wire()});
  } else if (s->kind() == fb::StepKind::copy) {
    StridedRegion src = ToRegion(*st.p->regions()->Get(s->src()));
    StridedRegion dst = ToRegion(*st.p->regions()->Get(s->dst()));
    Seg what;
    if (src.buffer == kNoneIdx) {
      if (!ResolveStaging(rank, src, s->wire(), what)) {
        Error(where + ": staging region " + src.str() + " holds no data");
        return;
      }
    } else {
      int frag;
      if (!Resolve(rank, 0, src, frag, what.box)) {
        Error(where + ": source region " + src.str() + " is not the image of a box the rank holds");
        return;
      }
      what.tensor = st.frags[0][frag].tensor;
    }
    Land(rank, dst, what, where);
  }
}

void Validator::PostSend(uint32_t rank, size_t i) {
  RankState& st = states_[rank];
  const fb::Step* s = st.p->steps()->Get(static_cast<uint32_t>(i));
  Msg m;
  m.bytes = s->bytes();
  m.channel = s->channel();
  m.where = Where(rank, i);
  if (s->src() != kNoneIdx) {
    StridedRegion r = ToRegion(*st.p->regions()->Get(s->src()));
    int frag;
    Box box;
    if (!r.Coalesced().contiguous() || !Resolve(rank, 0, r, frag, box)) {
      Error(m.where + ": sends region " + r.str() + " straight from a buffer, but it is not a contiguous box the rank holds");
    } else {
      m.segs.push_back({0, {static_cast<uint64_t>(box.volume()) * WireSize(s->wire()), st.frags[0][frag].tensor, box, s->wire()}});
    }
  } else {
    uint64_t lo = s->staging(), hi = lo + s->bytes();
    auto it = st.staging.upper_bound(lo);
    if (it != st.staging.begin() && std::prev(it)->first + std::prev(it)->second.bytes > lo) --it;
    for (; it != st.staging.end() && it->first < hi; ++it) {
      if (it->first < lo || it->first + it->second.bytes > hi) {
        Error(m.where + ": the message cuts through staged data of " + TensorName(it->second.tensor));
        continue;
      }
      m.segs.push_back({it->first - lo, it->second});
    }
  }
  queues_[{rank, s->peer()}].push_back(std::move(m));
  ++report_.messages;
}

bool Validator::TryRecv(uint32_t rank, size_t i) {
  RankState& st = states_[rank];
  const fb::Step* s = st.p->steps()->Get(static_cast<uint32_t>(i));
  auto& q = queues_[{s->peer(), rank}];
  if (q.empty()) return false;
  Msg m = std::move(q.front());
  q.pop_front();
  std::string where = Where(rank, i);
  if (m.bytes != s->bytes())
    Error(where + ": receives " + std::to_string(s->bytes()) + " bytes from rank " + std::to_string(s->peer()) +
          ", whose matching message (" + m.where + ") has " + std::to_string(m.bytes));
  if (m.channel != s->channel()) Error(where + ": channel differs from the matching " + m.where);
  if (s->dst() != kNoneIdx) {
    StridedRegion r = ToRegion(*st.p->regions()->Get(s->dst()));
    if (m.segs.size() != 1) {
      Error(where + ": receives straight into a buffer a message of " + std::to_string(m.segs.size()) + " pieces");
      return true;
    }
    Land(rank, r, m.segs[0].second, where);
  } else {
    for (auto& [rel, seg] : m.segs) Write(st.staging, s->staging() + rel, seg);
  }
  return true;
}

void Validator::Unpack(uint32_t rank, size_t i) {
  RankState& st = states_[rank];
  const fb::Step* s = st.p->steps()->Get(static_cast<uint32_t>(i));
  std::string where = Where(rank, i);
  StridedRegion src;
  if (s->src() != kNoneIdx) {
    src = ToRegion(*st.p->regions()->Get(s->src()));
  } else {
    src.buffer = kNoneIdx;
    src.ndim = 1;
    src.shape[0] = static_cast<int64_t>(s->bytes() / WireSize(s->wire()));
    src.stride[0] = 1;
    src.offset = s->staging() / WireSize(s->wire());
  }
  Seg what;
  if (!ResolveStaging(rank, src, s->wire(), what)) {
    Error(where + ": staging at byte " + std::to_string(src.offset * WireSize(s->wire())) +
          " does not hold a whole box of one tensor (nothing was received or packed there)");
    return;
  }
  Land(rank, ToRegion(*st.p->regions()->Get(s->dst())), what, where);
}

void Validator::Coverage() {
  for (uint32_t rank = 0; rank < states_.size(); ++rank) {
    RankState& st = states_[rank];
    for (size_t f = 0; f < st.frags[1].size(); ++f) {
      const Affine& need = st.frags[1][f];
      auto& boxes = st.written[f];
      std::vector<size_t> order(boxes.size());
      for (size_t k = 0; k < order.size(); ++k) order[k] = k;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return boxes[a] < boxes[b]; });
      int64_t total = 0;
      bool dup = false;
      for (size_t a = 0; a < order.size() && !dup; ++a) {
        total += boxes[order[a]].volume();
        for (size_t b = a + 1; b < order.size(); ++b) {
          if (boxes[order[b]].lo[0] >= boxes[order[a]].hi[0]) break;
          if (boxes[order[a]].intersects(boxes[order[b]])) {
            Error("rank " + std::to_string(rank) + ": " + TensorName(need.tensor) + " " +
                  boxes[order[a]].intersect(boxes[order[b]]).str() + " is written twice (" +
                  st.written_by[f][order[a]] + " and " + st.written_by[f][order[b]] + ")");
            dup = true;
            break;
          }
        }
      }
      if (!dup && total != need.box.volume())
        Error("rank " + std::to_string(rank) + ": " + TensorName(need.tensor) + " " + need.box.str() + ": " +
              std::to_string(need.box.volume() - total) + " of " + std::to_string(need.box.volume()) +
              " elements are never written");
    }
  }
}

ValidateReport Validator::Run() {
  uint32_t n = plan_.num_ranks();
  states_.resize(n);
  for (uint32_t r = 0; r < n; ++r) {
    RankState& st = states_[r];
    st.p = &program_(r);
    st.frags.resize(2);
    st.by_buffer.resize(2);
    if (st.p->fragments()) {
      for (const fb::Fragment* f : *st.p->fragments()) {
        int role = f->role() ? 1 : 0;
        Affine a;
        a.tensor = static_cast<int>(f->tensor());
        a.box.ndim = f->ndim();
        for (int d = 0; d < a.box.ndim; ++d) {
          a.box.lo[d] = f->lo()->Get(d), a.box.hi[d] = f->hi()->Get(d);
          a.stride[d] = static_cast<int64_t>(f->stride()->Get(d));
        }
        a.buffer = f->buffer();
        a.offset = static_cast<int64_t>(f->offset());
        a.buffer_dims = f->buffer_dims();
        int id = static_cast<int>(st.frags[role].size());
        st.frags[role].push_back(a);
        // Every buffer index this fragment touches.
        std::array<int64_t, kMaxDims> c{};
        int nd = a.box.ndim;
        while (true) {
          int64_t b = a.buffer;
          for (int d = 0; d < nd; ++d)
            if (a.buffer_dims >> d & 1) b += c[d] * a.stride[d];
          st.by_buffer[role][static_cast<uint32_t>(b)].push_back(id);
          int d = nd - 1;
          while (d >= 0 && (!(a.buffer_dims >> d & 1) || ++c[d] == a.box.extent(d))) {
            if (a.buffer_dims >> d & 1) c[d] = 0;
            --d;
          }
          if (d < 0) break;
        }
      }
    }
    st.written.resize(st.frags[1].size());
    st.written_by.resize(st.frags[1].size());
    if (st.p->staging_bytes() > plan_.staging_limit())
      Error("rank " + std::to_string(r) + ": staging of " + std::to_string(st.p->staging_bytes()) +
            " bytes exceeds the budget of " + std::to_string(plan_.staging_limit()));
  }
  // Symbolic execution: each rank runs its rounds; a receive waits for its
  // matching send. No progress with ranks left means the plan deadlocks.
  size_t done = 0;
  while (done < n) {
    bool progress = false;
    for (uint32_t r = 0; r < n; ++r) {
      RankState& st = states_[r];
      size_t nrounds = st.p->round_begin() ? st.p->round_begin()->size() - 1 : 0;
      while (st.phase != 3) {
        if (st.round >= nrounds) {
          st.phase = 3;
          ++done;
          progress = true;
          break;
        }
        size_t b = st.p->round_begin()->Get(static_cast<uint32_t>(st.round));
        size_t e = st.p->round_begin()->Get(static_cast<uint32_t>(st.round + 1));
        auto kind = [&](size_t i) { return st.p->steps()->Get(static_cast<uint32_t>(i))->kind(); };
        if (st.phase == 0) {
          for (size_t i = b; i < e; ++i)
            if (kind(i) == fb::StepKind::pack || kind(i) == fb::StepKind::copy) Local(r, i), ++report_.steps;
          for (size_t i = b; i < e; ++i)
            if (kind(i) == fb::StepKind::send || kind(i) == fb::StepKind::forward) PostSend(r, i), ++report_.steps;
          st.phase = 1;
          st.next_comm = b;
          progress = true;
        }
        if (st.phase == 1) {
          while (st.next_comm < e) {
            if (kind(st.next_comm) == fb::StepKind::recv) {
              if (!TryRecv(r, st.next_comm)) break;
              ++report_.steps;
              progress = true;
            }
            ++st.next_comm;
          }
          if (st.next_comm < e) break;
          st.phase = 2;
        }
        if (st.phase == 2) {
          for (size_t i = b; i < e; ++i)
            if (kind(i) == fb::StepKind::unpack) Unpack(r, i), ++report_.steps;
          ++st.round;
          st.phase = 0;
          progress = true;
        }
      }
    }
    if (!progress) {
      for (uint32_t r = 0; r < n && report_.errors.size() < max_errors_; ++r) {
        const RankState& st = states_[r];
        if (st.phase == 1) {
          const fb::Step* s = st.p->steps()->Get(static_cast<uint32_t>(st.next_comm));
          Error("the plan deadlocks: " + Where(r, st.next_comm) + " waits for a message from rank " +
                std::to_string(s->peer()) + " that is never sent");
        }
      }
      return report_;
    }
  }
  for (auto& [pair, q] : queues_)
    for (const Msg& m : q) Error(m.where + ": message to rank " + std::to_string(pair.second) + " is never received");
  Coverage();
  return report_;
}

}  // namespace

ValidateReport ValidatePlan(const fb::Plan& plan, const std::function<const fb::Program&(uint32_t)>& program,
                            size_t max_errors) {
  return Validator(plan, program, max_errors).Run();
}

}  // namespace reshard
