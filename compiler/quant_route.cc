#include "compiler/quant_route.h"

#include <algorithm>

#include "runtime/error.h"

namespace reshard {
namespace {

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// The block cover of `b`, clipped to the tensor's box.
Box CoverOf(const Box& b, const std::array<int64_t, 2>& block, const TensorSpec& t) {
  Box out = b;
  for (int q = 0; q < 2; ++q) {
    const int d = b.ndim - 2 + q;
    out.lo[d] = b.lo[d] / block[q] * block[q];
    out.hi[d] = std::min(t.hi[d], (b.hi[d] + block[q] - 1) / block[q] * block[q]);
  }
  return out;
}

// Quant form of a region whose modes are a box's logical dims: outer modes of
// extent 1 dropped, the last two (rows, cols) always kept.
StridedRegion QuantForm(const StridedRegion& r) {
  StridedRegion out = r;
  out.ndim = 0;
  out.buffer_modes = 0;
  for (int k = 0; k < r.ndim; ++k) {
    if (k < r.ndim - 2 && r.shape[k] == 1) continue;
    out.shape[out.ndim] = r.shape[k];
    out.stride[out.ndim] = r.stride[k];
    if (r.buffer_modes >> k & 1) out.buffer_modes |= 1u << out.ndim;
    ++out.ndim;
  }
  return out;
}

// Row-major image of `sub` inside a staging block holding `whole`, at element `base`, in quant form.
StridedRegion StagingImage(const Box& whole, const Box& sub, uint64_t base) {
  return QuantForm(RowMajorRegion(whole, sub, base, kStaging));
}

int OuterModes(const Box& b) {
  int n = 0;
  for (int d = 0; d + 2 < b.ndim; ++d) n += b.extent(d) > 1;
  return n;
}

// Cuts `n` in two along its outermost dim that can be cut - outer dims
// anywhere, rows and cols at block edges - and pushes the halves onto `work`
// (first half on top); false if `n` is one block.
bool CutAtBlockEdge(const Box& n, const std::array<int64_t, 2>& block, std::vector<Box>& work) {
  for (int d = 0; d < n.ndim; ++d) {
    const int q = d - (n.ndim - 2);
    const int64_t b = q < 0 ? 1 : block[q];
    const int64_t first = (n.lo[d] / b + 1) * b, last = (n.hi[d] - 1) / b * b;  // block edges inside (lo, hi)
    if (first >= n.hi[d]) continue;
    const int64_t mid = std::clamp((n.lo[d] + n.hi[d]) / 2 / b * b, first, last);
    Box x = n, y = n;
    x.hi[d] = mid;
    y.lo[d] = mid;
    work.push_back(y);
    work.push_back(x);
    return true;
  }
  return false;
}

}  // namespace

QuantRouter::QuantRouter(const ModelSpec& model, const LayoutSpec& src_layout, const Expansion& src,
                         const LayoutSpec& dst_layout, const Expansion& dst, bool quantize_on_sender)
    : model_(model), quantize_on_sender_(quantize_on_sender) {
  const int nt = static_cast<int>(model.tensors.size());
  src_ = {&src, &src_layout, std::vector<int>(nt, -1), nt};
  dst_ = {&dst, &dst_layout, std::vector<int>(nt, -1), nt + static_cast<int>(src.scales.size())};
  for (Side* s : {&src_, &dst_})
    for (size_t k = 0; k < s->e->scales.size(); ++k) s->scale_of[s->e->scales[k].of] = static_cast<int>(k);
  // A quant op converts between FP8 and the model's values only: a tensor
  // held with an offset on one side moves unquantized on both.
  for (int t = 0; t < nt; ++t) {
    if (!Quantized(t)) continue;
    for (const Side* s : {&src_, &dst_}) {
      if (s->layout->offsets.empty() || s->layout->offsets[t] == 0) continue;
      const Side& q = src_.scale_of[t] >= 0 ? src_ : dst_;
      throw Error(s->layout->file + ": " + s->layout->offset_paths[t] + ": " + Quote(model.tensors[t].name) +
                  " is stored quantized by " + q.layout->file +
                  "; a tensor held with an offset moves unquantized on both sides (no quantize or dequantize step "
                  "applies an offset)");
    }
  }
}

bool QuantRouter::Quantized(int t) const { return src_.scale_of[t] >= 0 || dst_.scale_of[t] >= 0; }

const ScaleTensor* QuantRouter::Scale(const Side& s, int t) const {
  return s.scale_of[t] < 0 ? nullptr : &s.e->scales[s.scale_of[t]];
}

std::array<int64_t, 2> QuantRouter::Block(const Side& s, int t) const {
  const ScaleTensor* st = Scale(s, t);
  if (st == nullptr) return {1, 1};
  const int n = st->box.ndim;
  return {st->block[n - 2], st->block[n - 1]};
}

// The region of the scales of `blocks` in rank `rank`'s scale buffer for tensor `t`.
StridedRegion QuantRouter::ScaleRegion(const Side& s, int rank, int t, const Box& blocks, uint32_t buffer_base) const {
  const int tensor = s.first_scale + s.scale_of[t];
  for (const Fragment& f : s.e->ranks[rank].fragments) {
    if (f.tensor != tensor || !f.box.contains(blocks)) continue;
    StridedRegion r = QuantForm(f.RegionOf(blocks));
    r.buffer += buffer_base;
    return r;
  }
  throw Error(s.layout->file + ": tensor " + Quote(model_.tensors[t].name) + ": rank " + std::to_string(rank) +
              " holds no scales for blocks " + blocks.str());
}

std::vector<Box> QuantRouter::Stripes(int t, const Box& box, uint64_t n) const {
  const std::array<int64_t, 2> block = Block(dst_, t);
  // Cut the outermost dim that has block edges inside the box into n parts at them.
  for (int d = 0; d < box.ndim && n > 1; ++d) {
    const int q = d - (box.ndim - 2);
    const int64_t b = q < 0 ? 1 : block[q];
    const int64_t first = box.lo[d] / b * b, units = (box.hi[d] - first + b - 1) / b;
    if (units < 2) continue;
    std::vector<Box> out;
    const int64_t per = (units + static_cast<int64_t>(n) - 1) / static_cast<int64_t>(n);
    for (int64_t u = 0; u < units; u += per) {
      Box x = box;
      x.lo[d] = std::max(box.lo[d], first + u * b);
      x.hi[d] = std::min(box.hi[d], first + (u + per) * b);
      out.push_back(x);
    }
    return out;
  }
  return {box};
}

std::vector<QuantPiece> QuantRouter::Pieces(int t, const FragmentRef& sf, const Box& cell, const FragmentRef& df,
                                            const Box& need, uint64_t max_bytes, uint64_t block_max_bytes) const {
  const TensorSpec& ts = model_.tensors[t];
  const uint64_t esize = DtypeBytes(ts.dtype);
  const bool dst_q = Scale(dst_, t) != nullptr, src_q = Scale(src_, t) != nullptr;
  const std::array<int64_t, 2> block = Block(dst_, t);
  const uint64_t ssize = dst_q ? DtypeBytes(Scale(dst_, t)->dtype) : 0;
  auto plan = [&](const Box& n) {
    QuantPiece p;
    p.need = n;
    p.read = dst_q ? CoverOf(n, block, ts) : n;
    p.dequantize = src_q;
    p.quantize_sender = dst_q && !src_q && quantize_on_sender_;
    p.quantize_receiver = dst_q && !p.quantize_sender;
    if (p.quantize_sender) {
      p.bytes = AlignUp(static_cast<uint64_t>(n.volume())) + static_cast<uint64_t>(BlocksOf(p.read, block).volume()) * ssize;
    } else {
      p.bytes = static_cast<uint64_t>(p.read.volume()) * esize;
    }
    return p;
  };
  if (dst_q && !cell.contains(CoverOf(need, block, ts))) {
    throw Error("internal: tensor " + Quote(ts.name) + ": piece " + need.str() + " has blocks outside the cell " +
                cell.str() + " (it must be assembled)");
  }
  std::vector<QuantPiece> out;
  std::vector<Box> work = {need};
  while (!work.empty()) {
    Box n = work.back();
    work.pop_back();
    QuantPiece p = plan(n);
    const StridedRegion data = QuantForm(dst_.e->ranks[df.rank].fragments[df.index].RegionOf(n));
    const StridedRegion held = QuantForm(src_.e->ranks[sf.rank].fragments[sf.index].RegionOf(p.read));
    const bool in_format = OuterModes(n) <= 2 && RegionFits(data) && RegionFits(held);
    if (in_format && p.bytes <= max_bytes) {
      out.push_back(p);
      continue;
    }
    if (CutAtBlockEdge(n, block, work)) continue;
    const uint64_t limit = std::max(max_bytes, block_max_bytes);
    if (in_format && p.bytes <= limit) {  // one block, larger than the pieces are cut to
      out.push_back(p);
      continue;
    }
    throw Error(dst_.layout->file + ": tensor " + Quote(ts.name) + ": the piece " + n.str() + " for inference rank " +
                std::to_string(df.rank) + " is one block of " + std::to_string(block[0]) + "x" +
                std::to_string(block[1]) + " and does not fit " + std::to_string(limit) +
                " staging bytes; raise --staging-mb");
  }
  return out;
}

Box QuantRouter::Cover(int t, const Box& need) const {
  return Scale(dst_, t) == nullptr ? need : CoverOf(need, Block(dst_, t), model_.tensors[t]);
}

std::vector<Box> QuantRouter::Groups(int t, const FragmentRef& df, const Box& need, uint64_t max_bytes,
                                     bool by_need) const {
  const TensorSpec& ts = model_.tensors[t];
  const uint64_t esize = DtypeBytes(ts.dtype);
  const std::array<int64_t, 2> block = Block(dst_, t);
  const Fragment& dfr = dst_.e->ranks[df.rank].fragments[df.index];
  std::vector<Box> out, work = {need};
  while (!work.empty()) {
    Box n = work.back();
    work.pop_back();
    const Box cover = CoverOf(n, block, ts);
    if (OuterModes(n) <= 1 && static_cast<uint64_t>((by_need ? n : cover).volume()) * esize <= max_bytes &&
        RegionFits(QuantForm(dfr.RegionOf(n))) && RegionFits(StagingImage(cover, cover, 0))) {
      out.push_back(n);
      continue;
    }
    if (!CutAtBlockEdge(n, block, work)) out.push_back(n);  // one block: the caller checks that it fits the staging
  }
  return out;
}

QuantPiece QuantRouter::Part(int t, const Box& part) const {
  QuantPiece p;
  p.need = p.read = part;
  p.dequantize = Scale(src_, t) != nullptr;
  p.bytes = static_cast<uint64_t>(part.volume()) * DtypeBytes(model_.tensors[t].dtype);
  return p;
}

QuantPiece QuantRouter::Assembled(int t, const Box& need) const {
  QuantPiece p;
  p.need = need;
  p.read = Cover(t, need);
  p.quantize_receiver = true;
  p.bytes = static_cast<uint64_t>(p.read.volume()) * DtypeBytes(model_.tensors[t].dtype);
  return p;
}

void QuantRouter::EmitPartUnpack(int t, const Box& cover, const Box& part, RankProgram& B, size_t round, uint64_t slot,
                                 uint64_t frame) const {
  const Dtype wide = model_.tensors[t].dtype;
  Step up;
  up.kind = StepKind::unpack;
  up.wire = wide;
  up.staging = slot;
  up.bytes = static_cast<uint64_t>(part.volume()) * DtypeBytes(wide);
  up.dst = B.AddRegion(StagingImage(cover, part, frame / DtypeBytes(wide)).Coalesced());
  B.round(round).unpack.push_back(up);
}

void QuantRouter::EmitPartCopy(int t, const Box& cover, const Box& part, const FragmentRef& sf, RankProgram& P,
                               size_t round, uint64_t frame) const {
  const Dtype wide = model_.tensors[t].dtype;
  const Fragment& sfr = src_.e->ranks[sf.rank].fragments[sf.index];
  Step s;
  s.kind = StepKind::copy;
  s.wire = wide;
  s.bytes = static_cast<uint64_t>(part.volume()) * DtypeBytes(wide);
  s.src = P.AddRegion(QuantForm(sfr.RegionOf(part)));
  s.dst = P.AddRegion(StagingImage(cover, part, frame / DtypeBytes(wide)));
  if (Scale(src_, t) != nullptr) {
    QuantOpIR q = DequantOp(t, part);
    q.scale = P.AddRegion(ScaleRegion(src_, sf.rank, t, BlocksOf(part, Block(src_, t)), 0));
    s.quant = P.AddQuant(q);
  }
  P.round(round).local.push_back(s);
}

bool QuantRouter::AmaxPath(int t) const { return Scale(src_, t) == nullptr; }

uint64_t QuantRouter::GridBytes(int t, const Box& cover) const {
  return static_cast<uint64_t>(BlocksOf(cover, Block(dst_, t)).volume()) * 4;
}

void QuantRouter::EmitAmax(int t, const Box& cover, const Box& part, const FragmentRef& sf, RankProgram& P,
                           size_t round, uint64_t off) const {
  const std::array<int64_t, 2> db = Block(dst_, t);
  const Box grid = BlocksOf(cover, db);
  const Fragment& sfr = src_.e->ranks[sf.rank].fragments[sf.index];
  const int n = part.ndim;
  Step pk;
  pk.kind = StepKind::pack;
  pk.wire = Dtype::fp32;
  pk.staging = off;
  pk.bytes = static_cast<uint64_t>(grid.volume()) * 4;
  pk.src = P.AddRegion(QuantForm(sfr.RegionOf(part)));
  pk.dst = P.AddRegion(StagingImage(grid, grid, off / 4));
  QuantOpIR q;
  q.kind = QuantKind::amax;
  q.block = {static_cast<uint32_t>(db[0]), static_cast<uint32_t>(db[1])};
  q.origin = {static_cast<uint32_t>(part.lo[n - 2] - cover.lo[n - 2]),
              static_cast<uint32_t>(part.lo[n - 1] - cover.lo[n - 1])};
  q.scale_dtype = Dtype::fp32;
  pk.quant = P.AddQuant(q);
  P.round(round).local.push_back(pk);
}

void QuantRouter::EmitGridUnpack(uint64_t bytes, RankProgram& B, size_t round, uint64_t slot, uint64_t at) const {
  Step up;
  up.kind = StepKind::unpack;
  up.wire = Dtype::fp32;
  up.staging = slot;
  up.bytes = bytes;
  Box run;
  run.ndim = 1;
  run.hi[0] = static_cast<int64_t>(bytes / 4);
  up.dst = B.AddRegion(RowMajorRegion(run, run, at / 4, kStaging));
  B.round(round).unpack.push_back(up);
}

void QuantRouter::EmitScaledQuantize(int t, const Box& need, size_t grids, uint64_t area, uint64_t slot,
                                     uint64_t values, const FragmentRef& df, RankProgram& B, size_t round) const {
  const Dtype wide = model_.tensors[t].dtype;
  const std::array<int64_t, 2> db = Block(dst_, t);
  const Dtype sd = Scale(dst_, t)->dtype;
  const Box grid = BlocksOf(need, db);
  const Fragment& dfr = dst_.e->ranks[df.rank].fragments[df.index];
  const int n = need.ndim;
  // The grids: a leading mode over them, then the grid's quant form.
  StridedRegion g = StagingImage(grid, grid, area / 4);
  for (int k = g.ndim; k > 0; --k) g.shape[k] = g.shape[k - 1], g.stride[k] = g.stride[k - 1];
  g.shape[0] = static_cast<int64_t>(grids);
  g.stride[0] = static_cast<int64_t>(slot / 4);
  ++g.ndim;
  Step sc;
  sc.kind = StepKind::unpack;
  sc.wire = Dtype::fp32;
  sc.staging = area;
  sc.bytes = static_cast<uint64_t>(grid.volume()) * DtypeBytes(sd);
  sc.src = B.AddRegion(g);
  sc.dst = B.AddRegion(ScaleRegion(dst_, df.rank, t, grid, B.dst_buffer_base));
  QuantOpIR q;
  q.kind = QuantKind::scale_from_amax;
  q.block = {static_cast<uint32_t>(db[0]), static_cast<uint32_t>(db[1])};
  q.scale_dtype = sd;
  sc.quant = B.AddQuant(q);
  B.round(round).unpack.push_back(sc);
  Step up;
  up.kind = StepKind::unpack;
  up.wire = wide;
  up.staging = values;
  up.bytes = static_cast<uint64_t>(need.volume());
  up.src = B.AddRegion(StagingImage(need, need, values / DtypeBytes(wide)));
  StridedRegion dr = QuantForm(dfr.RegionOf(need));
  dr.buffer += B.dst_buffer_base;
  up.dst = B.AddRegion(dr);
  q.kind = QuantKind::quantize_scaled;
  q.origin = {static_cast<uint32_t>(need.lo[n - 2] % db[0]), static_cast<uint32_t>(need.lo[n - 1] % db[1])};
  q.scale = B.AddRegion(ScaleRegion(dst_, df.rank, t, grid, B.dst_buffer_base));
  up.quant = B.AddQuant(q);
  B.round(round).unpack.push_back(up);
}

QuantOpIR QuantRouter::DequantOp(int t, const Box& read) const {
  const std::array<int64_t, 2> sb = Block(src_, t);
  QuantOpIR q;
  q.kind = QuantKind::dequantize;
  q.block = {static_cast<uint32_t>(sb[0]), static_cast<uint32_t>(sb[1])};
  q.origin = {static_cast<uint32_t>(read.lo[read.ndim - 2] % sb[0]), static_cast<uint32_t>(read.lo[read.ndim - 1] % sb[1])};
  q.scale_dtype = Scale(src_, t)->dtype;
  return q;
}

QuantOpIR QuantRouter::QuantizeOp(int t, const QuantPiece& p) const {
  const std::array<int64_t, 2> db = Block(dst_, t);
  const int n = p.need.ndim;
  QuantOpIR q;
  q.kind = QuantKind::quantize;
  q.block = {static_cast<uint32_t>(db[0]), static_cast<uint32_t>(db[1])};
  q.origin = {static_cast<uint32_t>(p.need.lo[n - 2] - p.read.lo[n - 2]),
              static_cast<uint32_t>(p.need.lo[n - 1] - p.read.lo[n - 1])};
  q.scale_dtype = Scale(dst_, t)->dtype;
  return q;
}

void QuantRouter::EmitPack(int t, const QuantPiece& p, const FragmentRef& sf, RankProgram& A, size_t round,
                           uint64_t oa) const {
  const Dtype wide = model_.tensors[t].dtype;
  const uint64_t esize = DtypeBytes(wide);
  const Fragment& sfr = src_.e->ranks[sf.rank].fragments[sf.index];
  // Dequantizing or quantizing as the piece says.
  Step pk;
  pk.kind = StepKind::pack;
  pk.staging = oa;
  pk.src = A.AddRegion(QuantForm(sfr.RegionOf(p.read)));
  if (p.dequantize) {
    const std::array<int64_t, 2> sb = Block(src_, t);
    QuantOpIR q = DequantOp(t, p.read);
    q.scale = A.AddRegion(ScaleRegion(src_, sf.rank, t, BlocksOf(p.read, sb), 0));
    pk.wire = wide;
    pk.bytes = static_cast<uint64_t>(p.read.volume()) * esize;
    pk.dst = A.AddRegion(StagingImage(p.read, p.read, oa / esize));
    pk.quant = A.AddQuant(q);
  } else if (p.quantize_sender) {
    const std::array<int64_t, 2> db = Block(dst_, t);
    const Dtype sd = Scale(dst_, t)->dtype;
    QuantOpIR q = QuantizeOp(t, p);
    const Box blocks = BlocksOf(p.read, db);
    q.scale = A.AddRegion(StagingImage(blocks, blocks, (oa + AlignUp(p.need.volume())) / DtypeBytes(sd)));
    pk.wire = Dtype::fp8_e4m3;
    pk.bytes = static_cast<uint64_t>(p.need.volume());
    pk.dst = A.AddRegion(StagingImage(p.need, p.need, oa));
    pk.quant = A.AddQuant(q);
  } else {
    pk.wire = wide;
    pk.bytes = static_cast<uint64_t>(p.read.volume()) * esize;
  }
  A.round(round).local.push_back(pk);
}

void QuantRouter::EmitUnpack(int t, const QuantPiece& p, const FragmentRef& df, RankProgram& B, size_t round,
                             uint64_t ob) const {
  const Dtype wide = model_.tensors[t].dtype;
  const uint64_t esize = DtypeBytes(wide);
  const Fragment& dfr = dst_.e->ranks[df.rank].fragments[df.index];
  auto dst_region = [&](const Box& b) {
    StridedRegion r = QuantForm(dfr.RegionOf(b));
    r.buffer += B.dst_buffer_base;
    return r;
  };
  // Quantizing when it must.
  Step up;
  up.kind = StepKind::unpack;
  up.staging = ob;
  if (p.quantize_receiver) {
    const std::array<int64_t, 2> db = Block(dst_, t);
    QuantOpIR q = QuantizeOp(t, p);
    q.scale = B.AddRegion(ScaleRegion(dst_, df.rank, t, BlocksOf(p.read, db), B.dst_buffer_base));
    up.wire = wide;
    up.bytes = static_cast<uint64_t>(p.need.volume());
    up.src = B.AddRegion(StagingImage(p.read, p.read, ob / esize));
    up.dst = B.AddRegion(dst_region(p.need));
    up.quant = B.AddQuant(q);
    B.round(round).unpack.push_back(up);
  } else if (p.quantize_sender) {
    const std::array<int64_t, 2> db = Block(dst_, t);
    const Dtype sd = Scale(dst_, t)->dtype;
    const Box blocks = BlocksOf(p.read, db);
    up.wire = Dtype::fp8_e4m3;
    up.bytes = static_cast<uint64_t>(p.need.volume());
    up.dst = B.AddRegion(dst_region(p.need).Coalesced());
    B.round(round).unpack.push_back(up);
    Step us;
    us.kind = StepKind::unpack;
    us.wire = sd;
    us.staging = ob + AlignUp(p.need.volume());
    us.bytes = static_cast<uint64_t>(blocks.volume()) * DtypeBytes(sd);
    StridedRegion sr = ScaleRegion(dst_, df.rank, t, blocks, B.dst_buffer_base).Coalesced();
    us.dst = B.AddRegion(sr);
    B.round(round).unpack.push_back(us);
  } else {
    up.wire = wide;
    up.bytes = static_cast<uint64_t>(p.need.volume()) * esize;
    up.dst = B.AddRegion(dst_region(p.need).Coalesced());
    B.round(round).unpack.push_back(up);
  }
}

void QuantRouter::EmitCopy(int t, const QuantPiece& p, const FragmentRef& sf, const FragmentRef& df, RankProgram& P,
                           size_t round) const {
  const TensorSpec& ts = model_.tensors[t];
  if (p.dequantize && (p.quantize_sender || p.quantize_receiver)) {
    throw Error(dst_.layout->file + ": tensor " + Quote(ts.name) + ": a rank that holds it quantized on both sides " +
                "(colocated) would dequantize and requantize in one copy; not supported yet");
  }
  const Fragment& sfr = src_.e->ranks[sf.rank].fragments[sf.index];
  const Fragment& dfr = dst_.e->ranks[df.rank].fragments[df.index];
  Step s;
  s.kind = StepKind::copy;
  s.wire = ts.dtype;
  s.bytes = static_cast<uint64_t>(p.need.volume()) * DtypeBytes(ts.dtype);
  s.src = P.AddRegion(QuantForm(sfr.RegionOf(p.read)));
  StridedRegion dr = QuantForm(dfr.RegionOf(p.need));
  dr.buffer += P.dst_buffer_base;
  s.dst = P.AddRegion(dr);
  QuantOpIR q;
  if (p.dequantize) {
    const std::array<int64_t, 2> sb = Block(src_, t);
    q.kind = QuantKind::dequantize;
    q.block = {static_cast<uint32_t>(sb[0]), static_cast<uint32_t>(sb[1])};
    q.origin = {static_cast<uint32_t>(p.read.lo[p.read.ndim - 2] % sb[0]),
                static_cast<uint32_t>(p.read.lo[p.read.ndim - 1] % sb[1])};
    q.scale_dtype = Scale(src_, t)->dtype;
    q.scale = P.AddRegion(ScaleRegion(src_, sf.rank, t, BlocksOf(p.read, sb), 0));
  } else {
    const std::array<int64_t, 2> db = Block(dst_, t);
    q = QuantizeOp(t, p);
    q.scale = P.AddRegion(ScaleRegion(dst_, df.rank, t, BlocksOf(p.read, db), P.dst_buffer_base));
  }
  s.quant = P.AddQuant(q);
  P.round(round).local.push_back(s);
}

}  // namespace reshard
