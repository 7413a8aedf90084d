#include "compiler/validate.h"

#include <algorithm>
#include <array>
#include <cstdio>
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

// What a staged or sent range holds: values of (tensor, box); or, for
// block-scaled FP8, the FP8 values of (tensor, box) quantized over blocks of
// `block` (the last two dims), or the scales of those blocks (`box` then
// counts blocks).
// Or (amax) the partial block amaxes of (tensor, box) laid out over the
// block grid `grid` (block coordinates, row-major fp32).
enum class SegKind : uint8_t { values, fp8, scales, amax };
struct Seg {
  uint64_t bytes;
  int tensor;
  Box box;
  fb::Dtype wire;
  SegKind kind = SegKind::values;
  std::array<int64_t, 2> block{0, 0};
  Box grid{};
};

// The plan's tensor table as validate needs it: which tensors are scales of
// which, and over which blocks.
struct TensorInfo {
  int scale_of = -1;
  int side = 0;
  std::array<int64_t, 2> block{0, 0};  // of a scale tensor: its blocks over the last two dims
  bool unit_outer = true;              // of a scale tensor: blocks are 1 on every other dim
  Box box;                              // logical box (in blocks for a scale tensor)
  int scales[2] = {-1, -1};            // of a data tensor: its scale tensor per side
};

// An offset as messages write it: "-1", "0.5".
std::string OffsetStr(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(x));
  return buf;
}

std::string BlockStr(const std::array<int64_t, 2>& b) { return std::to_string(b[0]) + "x" + std::to_string(b[1]); }
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
    // Strided writes into staging this round (parts of a block cover being
    // assembled): byte span, the region written, what it holds.
    struct Scattered {
      uint64_t lo, hi;
      StridedRegion region;
      Seg seg;
    };
    std::vector<Scattered> scattered;
    // Destination scales a scale_from_amax wrote: (tensor, blocks, block shape).
    std::vector<std::tuple<int, Box, std::array<int64_t, 2>>> amax_scales;
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
    if (plan_.tensors() && t < static_cast<int>(plan_.tensors()->size())) return plan_.tensors()->Get(t)->name()->str();
    std::string s = "#";
    return s += std::to_string(t);
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
    if (s.kind == SegKind::amax) {  // a grid of partial amaxes is read whole, as one contiguous run
      if (byte != it->first || !r.Coalesced().contiguous() || static_cast<uint64_t>(r.elements()) * 4 != s.bytes)
        return false;
      out = s;
      return true;
    }
    Affine a;
    a.tensor = s.tensor;
    a.box = s.box;
    a.offset = static_cast<int64_t>(it->first / WireSize(wire));
    a.buffer = r.buffer;
    int64_t stride = 1;
    for (int d = s.box.ndim - 1; d >= 0; --d) a.stride[d] = stride, stride *= s.box.extent(d);
    Box b;
    if (!Invert(a, r, b)) return false;
    out = s;
    out.bytes = static_cast<uint64_t>(b.volume()) * WireSize(wire);
    out.box = b;
    return true;
  }
  // Staged data (packed or received) at byte `off`.
  void Write(RankState& rs, uint64_t off, const Seg& s) {
    std::erase_if(rs.scattered, [&](const RankState::Scattered& x) { return x.lo < off + s.bytes && off < x.hi; });
    Erase(rs.staging, off, off + s.bytes);
    rs.staging.emplace(off, s);
  }
  // A part of a block cover written into its frame by an unpack or copy
  // (contiguous or not); ResolveFrame reads the parts back, in this round only.
  void WritePart(RankState& rs, const StridedRegion& dst, const Seg& s) {
    const StridedRegion c = dst.Coalesced();
    const uint64_t w = WireSize(s.wire), lo = c.offset * w, hi = (c.offset + Span(c)) * w;
    Erase(rs.staging, lo, hi);
    rs.scattered.push_back({lo, hi, c, s});
  }
  // The elements from a staging region's first to its last, inclusive.
  static uint64_t Span(const StridedRegion& r) {
    if (r.elements() == 0) return 0;
    uint64_t span = 1;
    for (int k = 0; k < r.ndim; ++k) span += static_cast<uint64_t>(r.shape[k] - 1) * r.stride[k];
    return span;
  }
  // Forgets the staged segments that overlap bytes [lo, hi).
  void Erase(Staging& st, uint64_t lo, uint64_t hi) {
    auto it = st.lower_bound(lo);
    if (it != st.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second.bytes > lo) it = prev;
    }
    while (it != st.end() && it->first < hi) it = st.erase(it);
  }
  void Written(uint32_t rank, int frag, const Box& box, const std::string& where) {
    states_[rank].written[frag].push_back(box);
    states_[rank].written_by[frag].push_back(where);
    report_.dest_elements += box.volume();
  }
  fb::Dtype BufferDtype(uint32_t rank, uint32_t buffer) const {
    return states_[rank].p->buffers()->Get(buffer)->dtype();
  }
  // What a region of a rank's source buffer holds, given the fragment it resolved to.
  Seg SourceSeg(uint32_t rank, int frag, uint32_t buffer, const Box& box, fb::Dtype wire) const {
    const int t = states_[rank].frags[0][frag].tensor;
    Seg s{static_cast<uint64_t>(box.volume()) * WireSize(wire), t, box, wire};
    if (info_[t].scale_of >= 0) {
      s.kind = SegKind::scales;
      s.tensor = info_[t].scale_of;
      s.block = info_[t].block;
    } else if (BufferDtype(rank, buffer) == fb::Dtype::fp8_e4m3 && info_[t].scales[0] >= 0) {
      s.kind = SegKind::fp8;
      s.block = info_[info_[t].scales[0]].block;
    }
    return s;
  }
  // Destination write of `what` into region `dst` on `rank`: values into a
  // plain buffer, FP8 values into an FP8 buffer whose blocks they were
  // quantized over, scales into the scale buffer of those blocks.
  void Land(uint32_t rank, const StridedRegion& dst, const Seg& what, const std::string& where) {
    int frag;
    Box box;
    if (!Resolve(rank, 1, dst, frag, box)) {
      Error(where + ": destination region " + dst.str() + " of buffer " + std::to_string(dst.buffer) +
            " is not the image of a box of any tensor the rank needs");
      return;
    }
    const Affine& f = states_[rank].frags[1][frag];
    const TensorInfo& fi = info_[f.tensor];
    const int of = fi.scale_of >= 0 ? fi.scale_of : f.tensor;
    const std::string what_str = (what.kind == SegKind::scales ? "the scales of " : "") + TensorName(what.tensor) +
                                 " " + what.box.str();
    if (of != what.tensor || !(box == what.box) || (fi.scale_of >= 0) != (what.kind == SegKind::scales)) {
      Error(where + ": writes " + what_str + " into the place of " + TensorName(f.tensor) + " " + box.str());
      return;
    }
    const bool fp8_dst = fi.scale_of < 0 && BufferDtype(rank, dst.buffer) == fb::Dtype::fp8_e4m3 && fi.scales[1] >= 0;
    if (fi.scale_of < 0 && fp8_dst != (what.kind == SegKind::fp8)) {
      Error(where + ": writes " + (what.kind == SegKind::fp8 ? "FP8 values of " : "values of ") + what_str +
            (fp8_dst ? " into a quantized buffer without quantizing them" : " into a buffer that is not quantized"));
      return;
    }
    const std::array<int64_t, 2> want = fi.scale_of >= 0 ? fi.block : fp8_dst ? info_[fi.scales[1]].block
                                                                              : std::array<int64_t, 2>{0, 0};
    if (what.kind != SegKind::values && what.block != want) {
      Error(where + ": writes " + what_str + " quantized over blocks of " + BlockStr(what.block) +
            ", the destination's blocks are " + BlockStr(want));
      return;
    }
    Written(rank, frag, box, where);
  }
  // Whether `box` of tensor `t` is whole blocks (a block may end early only at the tensor's edge).
  bool WholeBlocks(int t, const Box& box, const std::array<int64_t, 2>& block) const {
    for (int q = 0; q < 2; ++q) {
      const int d = box.ndim - 2 + q;
      if (box.lo[d] % block[q] != 0) return false;
      if (box.hi[d] % block[q] != 0 && box.hi[d] != info_[t].box.hi[d]) return false;
    }
    return true;
  }
  // A staging region that parts written this round make up (an assembled
  // block cover): they must tile one box of one tensor, each in its place in
  // the box's row-major image, which is the region. False with `why` set
  // when parts lie there but do not make it up; false alone when none do.
  bool ResolveFrame(uint32_t rank, const StridedRegion& r, fb::Dtype wire, Seg& out, std::string& why) {
    const RankState& st = states_[rank];
    const StridedRegion c = r.Coalesced();
    const uint64_t w = WireSize(wire), lo = c.offset * w, hi = (c.offset + Span(c)) * w;
    std::vector<const RankState::Scattered*> parts;
    for (const RankState::Scattered& x : st.scattered) {
      if (x.hi <= lo || x.lo >= hi) continue;
      if (x.lo < lo || x.hi > hi) {
        why = "a part written there (" + TensorName(x.seg.tensor) + " " + x.seg.box.str() + ") reaches beyond it";
        return false;
      }
      parts.push_back(&x);
    }
    if (parts.empty()) return false;
    const Seg& first = parts[0]->seg;
    Box f = first.box;
    int64_t volume = 0;
    for (const RankState::Scattered* x : parts) {
      const Seg& p = x->seg;
      if (p.tensor != first.tensor || p.kind != SegKind::values || p.wire != wire || p.box.ndim != f.ndim) {
        why = "the parts written there are not values of one tensor in " +
              std::string(DtypeString(static_cast<Dtype>(wire)));
        return false;
      }
      for (int d = 0; d < f.ndim; ++d)
        f.lo[d] = std::min(f.lo[d], p.box.lo[d]), f.hi[d] = std::max(f.hi[d], p.box.hi[d]);
      volume += p.box.volume();
    }
    for (size_t i = 0; i < parts.size(); ++i)
      for (size_t j = i + 1; j < parts.size(); ++j)
        if (parts[i]->seg.box.intersects(parts[j]->seg.box)) {
          why = "the parts written there overlap at " + TensorName(first.tensor) + " " +
                parts[i]->seg.box.intersect(parts[j]->seg.box).str();
          return false;
        }
    if (volume < c.elements()) {
      why = "parts of " + TensorName(first.tensor) + " fill " + std::to_string(volume) + " of its " +
            std::to_string(c.elements()) + " elements; the rest of the block cover was never written";
      return false;
    }
    if (volume != f.volume()) {
      why = "the parts written there leave " + std::to_string(f.volume() - volume) + " elements of " +
            TensorName(first.tensor) + " " + f.str() + " unwritten";
      return false;
    }
    if (!SameRegion(RowMajorRegion(f, f, c.offset, kNoneIdx).Coalesced(), c)) {
      why =
          "it is not the row-major image of " + TensorName(first.tensor) + " " + f.str() + ", which its parts make up";
      return false;
    }
    for (const RankState::Scattered* x : parts) {
      if (!SameRegion(RowMajorRegion(f, x->seg.box, c.offset, kNoneIdx).Coalesced(), x->region)) {
        why = "the part " + TensorName(first.tensor) + " " + x->seg.box.str() + " was written at " + x->region.str() +
              ", not at its place in the image of " + f.str();
        return false;
      }
    }
    out = Seg{static_cast<uint64_t>(f.volume()) * w, first.tensor, f, wire};
    return true;
  }
  // What a local step's src region (staging, or a source buffer) holds; false after reporting why not.
  bool ReadLocal(uint32_t rank, const StridedRegion& src, fb::Dtype wire, const std::string& where, Seg& out) {
    if (src.buffer == kNoneIdx) {
      if (ResolveStaging(rank, src, wire, out)) return true;
      std::string why;
      if (ResolveFrame(rank, src, wire, out, why)) return true;
      Error(where + ": staging region " + src.str() + (why.empty() ? " holds no data" : ": " + why));
      return false;
    }
    int frag;
    Box box;
    if (!Resolve(rank, 0, src, frag, box)) {
      Error(where + ": source region " + src.str() + " is not the image of a box the rank holds");
      return false;
    }
    out = SourceSeg(rank, frag, src.buffer, box, wire);
    return true;
  }
  void Quant(uint32_t rank, size_t i, const fb::QuantOp& op);
  void AmaxQuant(uint32_t rank, size_t i, const fb::QuantOp& op);
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
  std::vector<TensorInfo> info_;                      // per plan tensor
  std::vector<std::vector<const fb::QuantOp*>> quant_;  // per rank, per step
};

// A quant step moves what plain steps move (boxes of values through
// staging), and in addition: a quantize op must see whole blocks and writes
// every scale of them; a dequantize op must read the scales of exactly the
// blocks its FP8 values lie in. What it proves is where values come from,
// not the arithmetic (the kernels are tested against the reference rules).
// The amax path (quant_route.h): a pack computes a part's partial amaxes
// over a grid of blocks; an unpack takes the scales of the largest amaxes of
// grids whose parts make up every block whole; another quantizes values
// with scales written that way.
void Validator::AmaxQuant(uint32_t rank, size_t i, const fb::QuantOp& op) {
  RankState& st = states_[rank];
  const fb::Step* s = st.p->steps()->Get(static_cast<uint32_t>(i));
  const std::string where = Where(rank, i);
  const StridedRegion src = ToRegion(*st.p->regions()->Get(s->src()));
  const StridedRegion dst = ToRegion(*st.p->regions()->Get(s->dst()));
  const std::array<int64_t, 2> block{op.block()->Get(0), op.block()->Get(1)};
  if (op.kind() == fb::QuantKind::amax) {
    Seg in;
    if (!ReadLocal(rank, src, s->wire(), where, in)) return;
    if (in.kind != SegKind::values || in.box.ndim < 2) {
      Error(where + ": takes block amaxes of " + TensorName(in.tensor) + " " + in.box.str() +
            ", which are not plain values");
      return;
    }
    const Box& b = in.box;
    const int n = b.ndim;
    Seg out{0, in.tensor, b, fb::Dtype::fp32, SegKind::amax, block, b};
    for (int q = 0; q < 2; ++q) {
      const int d = n - 2 + q;
      const int64_t start = b.lo[d] - op.origin()->Get(q);  // the grid's first element
      if (start < 0 || start % block[q] != 0) {
        Error(where + ": origin (" + std::to_string(op.origin()->Get(0)) + "," + std::to_string(op.origin()->Get(1)) +
              ") puts the grid of " + TensorName(in.tensor) + " " + b.str() + " off the block edges");
        return;
      }
      out.grid.lo[d] = start / block[q];
      out.grid.hi[d] = out.grid.lo[d] + (dst.ndim >= 2 ? dst.shape[dst.ndim - 2 + q] : 0);
      if (b.hi[d] > out.grid.hi[d] * block[q]) {
        Error(where + ": the grid " + dst.str() + " does not reach the end of " + TensorName(in.tensor) + " " +
              b.str());
        return;
      }
    }
    out.bytes = static_cast<uint64_t>(out.grid.volume()) * 4;
    if (dst.buffer != kNoneIdx || !dst.Coalesced().contiguous() ||
        static_cast<uint64_t>(dst.elements()) * 4 != out.bytes) {
      Error(where + ": the amax grid " + dst.str() + " is not " + std::to_string(out.grid.volume()) +
            " contiguous fp32 values in staging");
      return;
    }
    Write(st, dst.offset * 4, out);
    return;
  }
  if (op.kind() == fb::QuantKind::scale_from_amax) {
    // The grids: a leading mode over them, each a whole grid in the rank's staging.
    StridedRegion one = src;
    for (int k = 0; k + 1 < src.ndim; ++k) one.shape[k] = src.shape[k + 1], one.stride[k] = src.stride[k + 1];
    one.ndim = src.ndim - 1;
    std::vector<Seg> grids;
    for (int64_t k = 0; k < (src.ndim ? src.shape[0] : 0); ++k) {
      one.offset = src.offset + static_cast<uint64_t>(k * src.stride[0]);
      Seg g;
      if (!ResolveStaging(rank, one, fb::Dtype::fp32, g) || g.kind != SegKind::amax) {
        Error(where + ": grid " + std::to_string(k) + " at staging byte " + std::to_string(one.offset * 4) +
              " holds no partial amaxes of that shape");
        return;
      }
      grids.push_back(g);
    }
    if (grids.empty()) {
      Error(where + ": takes scales from no amax grids");
      return;
    }
    const Seg& g0 = grids[0];
    const Box& grid = g0.grid;
    // The elements of the grid's blocks (clipped to the tensor) must be the parts' boxes, each once.
    Box whole = grid;
    for (int q = 0; q < 2; ++q) {
      const int d = grid.ndim - 2 + q;
      whole.lo[d] = grid.lo[d] * block[q];
      whole.hi[d] = std::min(grid.hi[d] * block[q], info_[g0.tensor].box.hi[d]);
    }
    int64_t volume = 0;
    for (size_t k = 0; k < grids.size(); ++k) {
      const Seg& g = grids[k];
      if (g.tensor != g0.tensor || !(g.grid == grid) || g.block != block || !whole.contains(g.box)) {
        Error(where + ": grid " + std::to_string(k) + " (" + TensorName(g.tensor) + " " + g.box.str() +
              ") is not over the blocks " + grid.str() + " of " + BlockStr(block) + " the others are");
        return;
      }
      for (size_t j = 0; j < k; ++j)
        if (grids[j].box.intersects(g.box)) {
          Error(where + ": grids " + std::to_string(j) + " and " + std::to_string(k) + " both hold the amax of " +
                TensorName(g.tensor) + " " + g.box.intersect(grids[j].box).str());
          return;
        }
      volume += g.box.volume();
    }
    if (volume != whole.volume()) {
      Error(where + ": the grids' parts leave " + std::to_string(whole.volume() - volume) + " elements of " +
            TensorName(g0.tensor) + " " + whole.str() + " out of its blocks' amaxes");
      return;
    }
    Seg scales{static_cast<uint64_t>(grid.volume()) * WireSize(op.scale_dtype()),
               g0.tensor,
               grid,
               op.scale_dtype(),
               SegKind::scales,
               block};
    if (dst.buffer == kNoneIdx) {
      Error(where + ": scales into staging; they belong in the destination's scale buffer");
      return;
    }
    Land(rank, dst, scales, where);
    st.amax_scales.emplace_back(g0.tensor, grid, block);
    return;
  }
  // quantize_scaled
  Seg in;
  if (!ReadLocal(rank, src, s->wire(), where, in)) return;
  const Box& b = in.box;
  if (in.kind != SegKind::values || b.ndim < 2) {
    Error(where + ": quantizes " + TensorName(in.tensor) + " " + b.str() + ", which are not plain values");
    return;
  }
  for (int q = 0; q < 2; ++q)
    if (b.lo[b.ndim - 2 + q] % block[q] != op.origin()->Get(q)) {
      Error(where + ": origin (" + std::to_string(op.origin()->Get(0)) + "," + std::to_string(op.origin()->Get(1)) +
            ") is not where " + TensorName(in.tensor) + " " + b.str() + " starts in its block");
      return;
    }
  const Box blocks = BlocksOf(b, block);
  const StridedRegion scale = ToRegion(*st.p->regions()->Get(op.scale()));
  int frag;
  Box have;
  bool ok = scale.buffer != kNoneIdx && Resolve(rank, 1, scale, frag, have) &&
            info_[st.frags[1][frag].tensor].scale_of == in.tensor && have == blocks;
  bool computed = false;
  for (const auto& [t, box, blk] : st.amax_scales)
    computed = computed || (t == in.tensor && blk == block && box.contains(blocks));
  if (!ok || !computed) {
    Error(where + ": scale region " + scale.str() + " does not hold scales of " + TensorName(in.tensor) + " blocks " +
          blocks.str() + " of " + BlockStr(block) + " taken from amaxes before it");
    return;
  }
  Seg out{static_cast<uint64_t>(b.volume()), in.tensor, b, fb::Dtype::fp8_e4m3, SegKind::fp8, block};
  Land(rank, dst, out, where);
}

void Validator::Quant(uint32_t rank, size_t i, const fb::QuantOp& op) {
  if (op.kind() == fb::QuantKind::amax || op.kind() == fb::QuantKind::scale_from_amax ||
      op.kind() == fb::QuantKind::quantize_scaled) {
    AmaxQuant(rank, i, op);
    return;
  }
  RankState& st = states_[rank];
  const fb::Step* s = st.p->steps()->Get(static_cast<uint32_t>(i));
  const std::string where = Where(rank, i);
  const StridedRegion src = ToRegion(*st.p->regions()->Get(s->src()));
  const StridedRegion dst = ToRegion(*st.p->regions()->Get(s->dst()));
  const StridedRegion scale = ToRegion(*st.p->regions()->Get(op.scale()));
  const std::array<int64_t, 2> block{op.block()->Get(0), op.block()->Get(1)};
  const bool quantize = op.kind() == fb::QuantKind::quantize;
  Seg in;
  if (!ReadLocal(rank, src, s->wire(), where, in)) return;
  const int t = in.tensor;
  const Box& b = in.box;
  if (b.ndim < 2) {
    Error(where + ": " + TensorName(t) + " has no rows and cols to quantize");
    return;
  }
  Seg out = in;
  Seg scales{0, t, BlocksOf(b, block), op.scale_dtype(), SegKind::scales, block};
  if (quantize) {
    if (in.kind != SegKind::values) {
      Error(where + ": quantizes " + TensorName(t) + " " + b.str() + ", which are not plain values");
      return;
    }
    if (!WholeBlocks(t, b, block)) {
      Error(where + ": quantizes " + TensorName(t) + " " + b.str() + ", which is not whole blocks of " + BlockStr(block));
      return;
    }
    // dst is the sub-box at `origin` of the dst region's extent.
    out.kind = SegKind::fp8;
    out.block = block;
    out.wire = fb::Dtype::fp8_e4m3;
    for (int q = 0; q < 2; ++q) {
      const int d = b.ndim - 2 + q;
      out.box.lo[d] = b.lo[d] + op.origin()->Get(q);
      out.box.hi[d] = out.box.lo[d] + dst.shape[dst.ndim - 2 + q];
    }
  } else {
    if (in.kind != SegKind::fp8 || in.block != block) {
      Error(where + ": dequantizes " + TensorName(t) + " " + b.str() + ", which are not FP8 values over blocks of " +
            BlockStr(block));
      return;
    }
    for (int q = 0; q < 2; ++q) {
      if (b.lo[b.ndim - 2 + q] % block[q] != op.origin()->Get(q)) {
        Error(where + ": origin (" + std::to_string(op.origin()->Get(0)) + "," + std::to_string(op.origin()->Get(1)) +
              ") is not where " + TensorName(t) + " " + b.str() + " starts in its block");
        return;
      }
    }
    out.kind = SegKind::values;
    out.block = {0, 0};
    out.wire = s->wire();
  }
  out.bytes = static_cast<uint64_t>(out.box.volume()) * WireSize(out.wire);
  scales.bytes = static_cast<uint64_t>(scales.box.volume()) * WireSize(op.scale_dtype());
  // The scales: written by a quantize op, read by a dequantize op.
  if (quantize) {
    if (scale.buffer == kNoneIdx) {
      if (!scale.Coalesced().contiguous()) Error(where + ": scale region " + scale.str() + " is not contiguous in staging");
      else
        Write(st, scale.offset * WireSize(op.scale_dtype()), scales);
    } else {
      Land(rank, scale, scales, where);
    }
  } else {
    Seg have;
    bool ok;
    if (scale.buffer == kNoneIdx) {
      ok = ResolveStaging(rank, scale, op.scale_dtype(), have);
    } else {
      int frag;
      ok = Resolve(rank, 0, scale, frag, have.box);
      if (ok) have = SourceSeg(rank, frag, scale.buffer, have.box, op.scale_dtype());
    }
    if (!ok || have.kind != SegKind::scales || have.tensor != t || !(have.box == scales.box) || have.block != block) {
      Error(where + ": scale region " + scale.str() + " does not hold the scales of " + TensorName(t) + " blocks " +
            scales.box.str() + " of " + BlockStr(block));
      return;
    }
  }
  // The converted values.
  if (dst.buffer == kNoneIdx && s->kind() != fb::StepKind::pack) {
    WritePart(st, dst, out);  // a dequantized part of a block cover, into its frame
  } else if (dst.buffer == kNoneIdx) {
    if (!dst.Coalesced().contiguous()) {
      Error(where + ": staging region " + dst.str() + " is not contiguous");
      return;
    }
    Write(st, dst.offset * WireSize(out.wire), out);
  } else {
    Land(rank, dst, out, where);
  }
}

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
    Write(st, s->staging(), SourceSeg(rank, frag, r.buffer, box, s->wire()));
  } else if (s->kind() == fb::StepKind::copy) {
    StridedRegion src = ToRegion(*st.p->regions()->Get(s->src()));
    StridedRegion dst = ToRegion(*st.p->regions()->Get(s->dst()));
    Seg what;
    if (!ReadLocal(rank, src, s->wire(), where, what)) return;
    if (dst.buffer == kNoneIdx)
      WritePart(st, dst, what);
    else
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
      m.segs.push_back({0, SourceSeg(rank, frag, r.buffer, box, s->wire())});
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
    for (auto& [rel, seg] : m.segs) Write(st, s->staging() + rel, seg);
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
  const StridedRegion dst = ToRegion(*st.p->regions()->Get(s->dst()));
  if (dst.buffer != kNoneIdx) {
    Land(rank, dst, what, where);
  } else if (what.kind != SegKind::amax) {
    WritePart(st, dst, what);  // a part of a block cover, into its frame
  } else if (dst.Coalesced().contiguous()) {
    Write(st, dst.offset * 4, what);  // a partial-amax grid, into its assembly's area
  } else {
    Error(where + ": copies a partial-amax grid of " + TensorName(what.tensor) + " " + what.box.str() +
          " into staging that is not contiguous");
  }
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
  const uint32_t nt = plan_.tensors() ? plan_.tensors()->size() : 0;
  info_.resize(nt);
  for (uint32_t k = 0; k < nt; ++k) {
    const fb::Tensor& t = *plan_.tensors()->Get(k);
    TensorInfo& ti = info_[k];
    ti.box.ndim = t.lo() ? static_cast<int>(std::min<uint32_t>(t.lo()->size(), kMaxDims)) : 0;
    for (int d = 0; d < ti.box.ndim && t.hi() && d < static_cast<int>(t.hi()->size()); ++d)
      ti.box.lo[d] = static_cast<int64_t>(t.lo()->Get(d)), ti.box.hi[d] = static_cast<int64_t>(t.hi()->Get(d));
    if (t.scale_of() < 0 || static_cast<uint32_t>(t.scale_of()) >= nt || !t.block() || t.block()->size() < 2) continue;
    ti.scale_of = t.scale_of();
    ti.side = t.side() ? 1 : 0;
    const uint32_t nb = t.block()->size();
    ti.block = {static_cast<int64_t>(t.block()->Get(nb - 2)), static_cast<int64_t>(t.block()->Get(nb - 1))};
    for (uint32_t d = 0; d + 2 < nb; ++d) ti.unit_outer = ti.unit_outer && t.block()->Get(d) == 1;
  }
  for (uint32_t k = 0; k < nt; ++k) {
    if (info_[k].scale_of < 0) continue;
    info_[info_[k].scale_of].scales[info_[k].side] = static_cast<int>(k);
    if (!info_[k].unit_outer)
      Error("tensor " + TensorName(static_cast<int>(k)) + ": scale blocks span more than the last two dims");
  }
  quant_.resize(n);
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
        // The offset this side holds the tensor with (a sender subtracts it,
        // a receiver adds it, in every step that touches the buffer): every
        // buffer of the tensor must hold it so.
        const fb::Tensor* ft = f->tensor() < nt ? plan_.tensors()->Get(f->tensor()) : nullptr;
        const float want = ft == nullptr ? 0.0f : role ? ft->infer_offset() : ft->train_offset();
        bool offset_said = false;
        // Every buffer index this fragment touches.
        std::array<int64_t, kMaxDims> c{};
        int nd = a.box.ndim;
        while (true) {
          int64_t b = a.buffer;
          for (int d = 0; d < nd; ++d)
            if (a.buffer_dims >> d & 1) b += c[d] * a.stride[d];
          st.by_buffer[role][static_cast<uint32_t>(b)].push_back(id);
          const fb::Buffer* buf = st.p->buffers() && static_cast<uint64_t>(b) < st.p->buffers()->size()
                                      ? st.p->buffers()->Get(static_cast<uint32_t>(b))
                                      : nullptr;
          if (buf != nullptr && buf->offset() != want && !offset_said) {
            offset_said = true;
            Error("rank " + std::to_string(r) + ": buffer '" + buf->name()->str() + "' holds tensor '" +
                  TensorName(a.tensor) + "' with offset " + OffsetStr(buf->offset()) + ", the plan's " +
                  (role ? "inference" : "training") + " side holds it with offset " + OffsetStr(want));
          }
          int d = nd - 1;
          while (d >= 0 && (!(a.buffer_dims >> d & 1) || ++c[d] == a.box.extent(d))) {
            if (a.buffer_dims >> d & 1) c[d] = 0;
            --d;
          }
          if (d < 0) break;
        }
      }
    }
    quant_[r].assign(st.p->steps() ? st.p->steps()->size() : 0, nullptr);
    if (st.p->quant_ops())
      for (const fb::QuantOp* op : *st.p->quant_ops())
        if (op->step() < quant_[r].size()) quant_[r][op->step()] = op;
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
        auto local = [&](size_t i) {
          if (quant_[r][i] != nullptr) Quant(r, i, *quant_[r][i]);
          else if (kind(i) == fb::StepKind::unpack) Unpack(r, i);
          else Local(r, i);
          ++report_.steps;
        };
        if (st.phase == 0) {
          for (size_t i = b; i < e; ++i)
            if (kind(i) == fb::StepKind::pack || kind(i) == fb::StepKind::copy) local(i);
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
            if (kind(i) == fb::StepKind::unpack) local(i);
          st.scattered.clear();  // frames live within their round
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
