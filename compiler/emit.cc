// Pass 5: write the plan as FlatBuffers. The only compiler file that includes
// the generated header.
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "compiler/compile.h"
#include "plan_generated.h"
#include "runtime/content_digest.h"
#include "runtime/error.h"

namespace reshard {
namespace {

fb::Dtype ToFb(Dtype d) { return static_cast<fb::Dtype>(static_cast<uint8_t>(d)); }

fb::Region ToFb(const StridedRegion& r) {
  std::array<uint32_t, 4> shape{1, 1, 1, 1}, stride{0, 0, 0, 0};
  for (int k = 0; k < r.ndim; ++k) shape[k] = static_cast<uint32_t>(r.shape[k]), stride[k] = static_cast<uint32_t>(r.stride[k]);
  return fb::Region(r.offset, flatbuffers::span<const uint32_t, 4>(shape), flatbuffers::span<const uint32_t, 4>(stride),
                    r.buffer, static_cast<uint8_t>(r.ndim), static_cast<uint8_t>(r.buffer_modes), 0);
}

fb::Fragment ToFb(const Fragment& f, uint8_t role) {
  std::array<uint64_t, 6> stride{};
  std::array<uint32_t, 6> lo{}, hi{};
  for (int d = 0; d < f.box.ndim; ++d) {
    stride[d] = static_cast<uint64_t>(f.stride[d]);
    lo[d] = static_cast<uint32_t>(f.box.lo[d]);
    hi[d] = static_cast<uint32_t>(f.box.hi[d]);
  }
  fb::Fragment out(f.offset, flatbuffers::span<const uint64_t, 6>(stride), flatbuffers::span<const uint32_t, 6>(lo),
                   flatbuffers::span<const uint32_t, 6>(hi), static_cast<uint32_t>(f.tensor), f.buffer,
                   static_cast<uint8_t>(f.box.ndim), static_cast<uint8_t>(f.buffer_dims), role, 0);
  return out;
}

fb::Step ToFb(const Step& s) {
  return fb::Step(static_cast<uint32_t>(s.staging), static_cast<uint32_t>(s.bytes), s.peer, s.src, s.dst, 0xFFFFFFFFu, static_cast<fb::StepKind>(s.kind),
                  static_cast<fb::Channel>(s.channel), ToFb(s.wire), 0, 0);
}

fb::QuantOp ToFb(const QuantOpIR& q, uint32_t step) {
  return fb::QuantOp(step, q.scale, flatbuffers::span<const uint32_t, 2>(q.origin),
                     flatbuffers::span<const uint32_t, 2>(q.block), static_cast<fb::QuantKind>(q.kind),
                     ToFb(q.scale_dtype), 0);
}

using ShapeCache = std::map<std::vector<int64_t>, flatbuffers::Offset<flatbuffers::Vector<uint64_t>>>;
using BufferVector = flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Buffer>>>;

bool SameBuffers(const std::vector<BufferDesc>& x, const std::vector<BufferDesc>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].name != y[i].name || x[i].dtype != y[i].dtype || x[i].shape != y[i].shape ||
        x[i].held_transposed != y[i].held_transposed)
      return false;
  return true;
}

uint64_t HashBuffers(const std::vector<BufferDesc>& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t x) { h = (h ^ x) * 0x100000001b3ull; };
  for (const BufferDesc& d : v) {
    mix(std::hash<std::string>{}(d.name));
    mix(static_cast<uint64_t>(d.dtype) << 1 | (d.held_transposed ? 1 : 0));
    for (int64_t e : d.shape) mix(static_cast<uint64_t>(e));
  }
  return h;
}

// Buffer names and shapes repeat across ranks (every replica binds the same
// names): each distinct string and shape is written once for the whole plan,
// each distinct buffer table once, and each distinct list of them once (the
// ranks of one pipeline stage and TP degree share theirs: tables may be
// referenced from several places in a FlatBuffer). Kimi-K2's plan held
// 533,632 buffer tables, 10 MiB of its 84.
struct BufferCache {
  ShapeCache shapes;
  std::map<std::tuple<std::string, Dtype, std::vector<int64_t>, bool>, flatbuffers::Offset<fb::Buffer>> tables;
  std::unordered_map<uint64_t, std::vector<std::pair<const std::vector<BufferDesc>*, BufferVector>>> lists;
};

BufferVector EmitBuffers(flatbuffers::FlatBufferBuilder& b, BufferCache& cache, const std::vector<BufferDesc>& list) {
  auto& same_hash = cache.lists[HashBuffers(list)];
  for (const auto& [seen, offset] : same_hash)
    if (SameBuffers(*seen, list)) return offset;
  std::vector<flatbuffers::Offset<fb::Buffer>> bufs;
  bufs.reserve(list.size());
  for (const BufferDesc& d : list) {
    auto key = std::make_tuple(d.name, d.dtype, d.shape, d.held_transposed);
    auto t = cache.tables.find(key);
    if (t == cache.tables.end()) {
      auto it = cache.shapes.find(d.shape);
      if (it == cache.shapes.end()) {
        std::vector<uint64_t> shape(d.shape.begin(), d.shape.end());
        it = cache.shapes.emplace(d.shape, b.CreateVector(shape)).first;
      }
      t = cache.tables
              .emplace(std::move(key), fb::CreateBuffer(b, b.CreateSharedString(d.name), ToFb(d.dtype), it->second,
                                                        d.held_transposed ? 1 : 0))
              .first;
    }
    bufs.push_back(t->second);
  }
  const BufferVector offset = b.CreateVector(bufs);
  same_hash.push_back({&list, offset});
  return offset;
}

flatbuffers::Offset<fb::Program> EmitProgram(flatbuffers::FlatBufferBuilder& b, BufferCache& cache, uint32_t rank,
                                             const RankProgram& p) {
  auto buffers = EmitBuffers(b, cache, p.buffers);
  std::vector<fb::Fragment> frags;
  frags.reserve(p.fragments.size());
  for (size_t i = 0; i < p.fragments.size(); ++i) frags.push_back(ToFb(p.fragments[i], p.roles[i]));
  auto fragments = b.CreateVectorOfStructs(frags);
  std::vector<fb::Region> regs;
  regs.reserve(p.regions.size());
  for (const auto& r : p.regions) regs.push_back(ToFb(r));
  auto regions = b.CreateVectorOfStructs(regs);
  std::vector<fb::Step> steps;
  std::vector<fb::QuantOp> quants;
  std::vector<uint32_t> begin;
  for (const Round& r : p.rounds) {
    begin.push_back(static_cast<uint32_t>(steps.size()));
    for (const auto* list : {&r.local, &r.comm, &r.unpack})
      for (const Step& s : *list) {
        if (s.quant >= 0) quants.push_back(ToFb(p.quant_ops[s.quant], static_cast<uint32_t>(steps.size())));
        steps.push_back(ToFb(s));
      }
  }
  begin.push_back(static_cast<uint32_t>(steps.size()));
  auto stepv = b.CreateVectorOfStructs(steps);
  auto beginv = b.CreateVector(begin);
  auto quantv = quants.empty() ? 0 : b.CreateVectorOfStructs(quants);
  fb::ProgramBuilder pb(b);
  pb.add_rank(rank);
  pb.add_src_rank(p.src_rank);
  pb.add_dst_rank(p.dst_rank);
  pb.add_buffers(buffers);
  pb.add_fragments(fragments);
  pb.add_staging_bytes(p.staging_bytes);
  pb.add_regions(regions);
  pb.add_steps(stepv);
  pb.add_round_begin(beginv);
  if (!quants.empty()) pb.add_quant_ops(quantv);
  return pb.Finish();
}

}  // namespace

std::vector<uint8_t> EmitPlan(const CompileInputs& in, const PlanIR& ir) {
  // The builder starts at about the plan's size: grown by doubling from a
  // small start it copied a large plan's bytes again at every step.
  size_t estimate = size_t{1} << 20;
  for (const RankProgram& p : ir.ranks) {
    estimate += p.fragments.size() * sizeof(fb::Fragment) + p.regions.size() * sizeof(fb::Region) +
                p.buffers.size() * 32 + p.rounds.size() * 4 + 256;
    for (const Round& r : p.rounds) estimate += (r.local.size() + r.comm.size() + r.unpack.size()) * sizeof(fb::Step);
  }
  flatbuffers::FlatBufferBuilder b(estimate + estimate / 16);
  std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
  for (const TensorSpec& t : in.model.tensors) {
    std::vector<std::string> stack;
    for (int d : t.stack) stack.push_back(in.model.dims[d].first);
    std::vector<uint64_t> lo(t.lo.begin(), t.lo.end()), hi(t.hi.begin(), t.hi.end());
    tensors.push_back(fb::CreateTensor(b, b.CreateString(t.name), ToFb(t.dtype), b.CreateVectorOfStrings(stack),
                                       b.CreateVector(lo), b.CreateVector(hi)));
  }
  for (const ScaleTensor& s : ir.scales) {
    const TensorSpec& t = in.model.tensors[s.of];
    std::vector<std::string> stack;
    for (int d : t.stack) stack.push_back(in.model.dims[d].first);
    std::vector<uint64_t> lo, hi, block;
    for (int d = 0; d < s.box.ndim; ++d) lo.push_back(s.box.lo[d]), hi.push_back(s.box.hi[d]), block.push_back(s.block[d]);
    tensors.push_back(fb::CreateTensor(b, b.CreateString(s.name), ToFb(s.dtype), b.CreateVectorOfStrings(stack),
                                       b.CreateVector(lo), b.CreateVector(hi), s.of, static_cast<uint8_t>(s.side),
                                       b.CreateVector(block)));
  }
  auto tensorv = b.CreateVector(tensors);
  std::vector<flatbuffers::Offset<fb::Program>> blobs;
  BufferCache cache;
  for (uint32_t g = 0; g < ir.ranks.size(); ++g) blobs.push_back(EmitProgram(b, cache, g, ir.ranks[g]));
  auto blobv = b.CreateVector(blobs);
  auto version = b.CreateString(RESHARD_VERSION);
  auto digest = b.CreateString(in.digest);
  auto model = b.CreateString(in.model.name);
  auto src = b.CreateString(in.src.name);
  auto dst = b.CreateString(in.dst.name);
  auto cluster = b.CreateString(in.cluster.name);
  auto srcg = b.CreateVector(ir.src_global);
  auto dstg = b.CreateVector(ir.dst_global);
  auto domain = b.CreateVector(ir.domain);
  fb::PlanBuilder pb(b);
  pb.add_schema_version(1);
  pb.add_compiler_version(version);
  pb.add_digest(digest);
  pb.add_strategy(ir.strategy == "gather" ? fb::Strategy::gather : fb::Strategy::direct);
  pb.add_model(model);
  pb.add_source_layout(src);
  pb.add_dest_layout(dst);
  pb.add_cluster(cluster);
  pb.add_staging_limit(ir.staging_limit);
  pb.add_num_ranks(static_cast<uint32_t>(ir.ranks.size()));
  pb.add_src_global(srcg);
  pb.add_dst_global(dstg);
  pb.add_domain(domain);
  pb.add_tensors(tensorv);
  pb.add_programs(blobv);
  pb.add_total_net_bytes(ir.net_bytes);
  pb.add_total_nvlink_bytes(ir.nvlink_bytes);
  pb.add_num_rounds(static_cast<uint32_t>(ir.num_rounds));
  const fb::Digest128 unstamped(0, 0);  // StampContentDigest fills it in below
  pb.add_content_digest(&unstamped);
  b.Finish(pb.Finish(), fb::PlanIdentifier());
  if (b.GetSize() >= (size_t{2} << 30))
    throw Error("the plan is " + std::to_string(b.GetSize() >> 20) +
                " MiB, over the 2 GiB FlatBuffers limit; raise --staging-mb to make fewer, larger steps");
  std::vector<uint8_t> bytes(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  StampContentDigest(bytes.data(), bytes.size());
  return bytes;
}

}  // namespace reshard
