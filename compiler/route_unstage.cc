// Pieces sent without staging where a GPU's memory, not its links, sets the
// refit's pace (router.h: Unstage).
//
// A piece is staged (packed at the sender, unpacked at the receiver) where
// its region is not one contiguous run on both ends. A piece of a tensor
// whose layers lie in buffers of their own spans buffers - q_proj's rows of
// 48 layers, (48,1048576):(b1,1) - and is staged whole, though each layer's
// slice may be contiguous on both ends. Where the GPUs' links bind the
// refit, the packs and unpacks run beside the messages and cost nothing;
// where GPUs copy more through their HBM than their links carry (training
// and inference colocated, most weights already where they are served),
// they add to the busiest GPU's HBM time. There each layer's slice goes as a
// message of its own: unstaged where contiguous on both ends, staged at one
// end only where contiguous on the other (o_proj's rows, sent to a TP rank
// that holds half their columns: packed at the sender, received straight
// into the receiver's buffer).
//
// A slice several receivers take from one sender straight into their
// buffers is packed once for all of them (hops kFromSender).
//
// (FSDP2 -> vLLM TP2 DP4 EP, Qwen3-30B-A3B colocated on 8 GPUs, whose
// bound is the busiest GPU's local copies: unstaged, nearly all the unpacks
// and some of the packs go, for many more, smaller messages, each slice at
// least kMinDirectSlice; with the copies' placement in route_schedule.cc,
// simulate puts the refit much closer to its bound.)

#include "compiler/router.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace reshard::routing {

// Whether some GPU's HBM traffic - its local copies, and the packs and
// unpacks of what it sends and receives staged - takes longer than the
// busiest link's bytes. Quantized and assembled pieces count as staged.
bool Router::HbmBinds(const std::vector<DPiece>& pieces) const {
  const size_t n = ir_.ranks.size();
  const double hbm = cluster_.hbm_GBps * 1e9, nic = cluster_.nic_gbps * 1e9 / 8, nvlink = cluster_.nvlink_GBps * 1e9;
  if (hbm <= 0 || nic <= 0 || nvlink <= 0) return false;
  std::vector<uint64_t> mem(n, 0), net_out(n, 0), net_in(n, 0), nv_out(n, 0), nv_in(n, 0);
  auto carry = [&](uint32_t from, uint32_t to, uint64_t bytes, bool staged_from) {
    if (ChannelOf(from, to) == Channel::net) net_out[from] += bytes, net_in[to] += bytes;
    else nv_out[from] += bytes, nv_in[to] += bytes;
    if (staged_from) mem[from] += bytes;
  };
  for (const DPiece& p : pieces) {
    if (p.a == p.b) {
      mem[p.a] += p.bytes;
      continue;
    }
    carry(p.a, p.b, p.bytes, p.staged);
    if (p.staged) mem[p.b] += p.bytes;
    for (uint32_t k = 0; k < p.hop_count; ++k) {
      const Hop& h = hop_pool_[p.hop_begin + k];
      carry(HolderOf(p, h.parent), h.rank, p.bytes, false);  // forwarded from staging
      mem[h.rank] += p.bytes;                                  // and unpacked there
    }
  }
  double mem_s = 0, link_s = 0;
  for (size_t g = 0; g < n; ++g) {
    mem_s = std::max(mem_s, 2.0 * static_cast<double>(mem[g]) / hbm);  // read once, written once
    link_s = std::max({link_s, static_cast<double>(std::max(net_out[g], net_in[g])) / nic,
                       static_cast<double>(std::max(nv_out[g], nv_in[g])) / nvlink});
  }
  return mem_s > link_s;
}

void Router::Unstage(std::vector<DPiece>& pieces) {
  hbm_binds_ = HbmBinds(pieces);
  if (!hbm_binds_) return;
  std::vector<DPiece> out;
  out.reserve(pieces.size());
  std::vector<uint8_t> ends;  // per slice: which of its ends are contiguous
  for (const DPiece& p : pieces) {
    // Only plain staged pieces without a tree, their dtype the same on both
    // ends and no offset (a staged end converts, a direct one cannot).
    const Dtype dtype = model_.tensors[p.tensor].dtype;
    bool plain = p.staged && p.a != p.b && p.hop_count == 0 && p.quant < 0 && p.assembly < 0;
    if (plain) {
      const StridedRegion rs = SrcRegion(p.s, p.box), rd = DstRegion(p.d, p.box);
      const BufferDesc& bs = src_.ranks[p.s.rank].buffers[rs.buffer];
      const BufferDesc& bd = dst_.ranks[p.d.rank].buffers[rd.buffer - ir_.ranks[p.b].dst_buffer_base];
      // (An offset is applied by the pack or unpack of a staged end, too.)
      plain = bs.dtype == dtype && bd.dtype == dtype && bs.offset == 0 && bd.offset == 0;
    }
    if (!plain) {
      out.push_back(p);
      continue;
    }
    // The piece whole, or its slices along its outermost dim (a layer each,
    // where layers are buffers): each must be at least kMinDirectSlice and
    // contiguous on one end at least.
    const uint64_t esize = DtypeBytes(dtype);
    std::vector<Box> slices = {p.box};
    auto contiguous_ends = [&](const Box& x) {
      return static_cast<uint8_t>((SrcRegion(p.s, x).contiguous() ? kDirectSrc : 0) |
                                  (DstRegion(p.d, x).contiguous() ? kDirectDst : 0));
    };
    uint8_t whole = contiguous_ends(p.box);
    if (whole == 0) {
      slices = SliceOuter(p.box);
      if (slices.size() < 2) {
        out.push_back(p);
        continue;
      }
    }
    ends.clear();
    bool ok = true;
    for (const Box& x : slices) {
      ends.push_back(slices.size() == 1 ? whole : contiguous_ends(x));
      ok = ok && ends.back() != 0 && static_cast<uint64_t>(x.volume()) * esize >= kMinDirectSlice;
    }
    if (!ok) {
      out.push_back(p);
      continue;
    }
    for (size_t i = 0; i < slices.size(); ++i) {
      DPiece q = p;
      q.box = slices[i];
      q.bytes = static_cast<uint64_t>(slices[i].volume()) * esize;
      q.staged = ends[i] != (kDirectSrc | kDirectDst);
      q.direct = q.staged ? ends[i] : 0;
      out.push_back(q);
    }
  }
  // One pack for all of a slice's receivers: where several take the same
  // slice from the same sender straight into their buffers (kDirectDst:
  // o_proj's FSDP2 rows, wanted by every rank of a TP group), the first
  // one's piece carries the others as hops from the sender (kFromSender),
  // sent in its round from its one pack. (Packed once per receiver they
  // could land in different rounds, and a pack shares only within a round.)
  using Key = std::tuple<int, uint32_t, int, int, Box>;
  std::map<Key, size_t> first;                      // per slice: its first receiver's piece in `out`
  std::vector<std::vector<size_t>> others(out.size());  // per such piece: the other receivers' pieces
  std::vector<bool> taken(out.size(), false);
  for (size_t i = 0; i < out.size(); ++i) {
    const DPiece& p = out[i];
    if (p.direct != kDirectDst || p.hop_count > 0) continue;
    auto [it, fresh] = first.try_emplace(Key{p.tensor, p.a, p.s.rank, p.s.index, p.box}, i);
    if (!fresh) others[it->second].push_back(i), taken[i] = true;
  }
  pieces.clear();
  for (size_t i = 0; i < out.size(); ++i) {
    if (taken[i]) continue;
    DPiece p = out[i];
    if (!others[i].empty()) {
      p.hop_begin = static_cast<uint32_t>(hop_pool_.size());
      p.hop_count = static_cast<uint32_t>(others[i].size());
      for (size_t k : others[i]) hop_pool_.push_back({out[k].d, out[k].b, kFromSender, 0});
    }
    pieces.push_back(p);
  }
}

}  // namespace reshard::routing
