// Pass 5: write the plan as FlatBuffers. The only compiler file that includes
// the generated header.
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "compiler/compile.h"
#include "compiler/on_threads.h"
#include "plan_generated.h"
#include "runtime/content_digest.h"
#include "runtime/error.h"
#include "runtime/plan.h"

namespace reshard {
namespace {

// zstd level of packed programs: levels -1 to 3 pack a plan about equally
// fast, and 1 makes large plans several times smaller.
constexpr int kPackLevel = 1;

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

// A program's buffers; each distinct shape is written once per program.
BufferVector EmitBuffers(flatbuffers::FlatBufferBuilder& b, ShapeCache& shapes, const std::vector<BufferDesc>& list) {
  std::vector<flatbuffers::Offset<fb::Buffer>> bufs;
  bufs.reserve(list.size());
  for (const BufferDesc& d : list) {
    auto it = shapes.find(d.shape);
    if (it == shapes.end()) {
      std::vector<uint64_t> shape(d.shape.begin(), d.shape.end());
      it = shapes.emplace(d.shape, b.CreateVector(shape)).first;
    }
    bufs.push_back(fb::CreateBuffer(b, b.CreateString(d.name), ToFb(d.dtype), it->second, d.held_transposed ? 1 : 0,
                                    d.offset));
  }
  return b.CreateVector(bufs);
}

flatbuffers::Offset<fb::Program> EmitProgram(flatbuffers::FlatBufferBuilder& b, uint32_t rank, const RankProgram& p) {
  ShapeCache shapes;
  auto buffers = EmitBuffers(b, shapes, p.buffers);
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

// Rank g's program as a FlatBuffer of its own (root: Program), zstd-compressed
// (the Program's `packed`, schema 2); empty for a rank with nothing to hold
// or do. Each program carries its own buffer names (a rank decompresses its
// program alone); they compress with the rest.
// `b` and `scratch` are the calling thread's, reused from rank to rank: a
// builder and a compression buffer of its own for every rank would land in
// fresh pages each time (page faults), and the packed program would keep the
// compression bound's capacity.
std::vector<uint8_t> PackProgram(uint32_t g, const RankProgram& p, ZSTD_CCtx* zstd, flatbuffers::FlatBufferBuilder& b,
                                 std::vector<uint8_t>& scratch) {
  size_t nsteps = 0;
  for (const Round& r : p.rounds) nsteps += r.local.size() + r.comm.size() + r.unpack.size();
  if (p.buffers.empty() && p.fragments.empty() && nsteps == 0) return {};
  b.Clear();
  b.Finish(EmitProgram(b, g, p));
  scratch.resize(std::max(scratch.size(), ZSTD_compressBound(b.GetSize())));
  const size_t n = ZSTD_compress2(zstd, scratch.data(), scratch.size(), b.GetBufferPointer(), b.GetSize());
  if (ZSTD_isError(n))
    throw Error("packing the program of rank " + std::to_string(g) + ": " + std::string(ZSTD_getErrorName(n)));
  return std::vector<uint8_t>(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(n));
}

// Every rank's packed program, on as many threads as the machine has (each
// rank's is independent; the plan does not depend on their timing).
std::vector<std::vector<uint8_t>> PackPrograms(const PlanIR& ir) {
  std::vector<std::vector<uint8_t>> out(ir.ranks.size());
  std::atomic<size_t> next{0};
  OnThreads(ThreadsFor(ir.ranks.size()), [&](size_t) {
    // One compression context a thread: a fresh one for every program
    // (ZSTD_compress) would set up its tables each time, most of the
    // packing's time.
    std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> zstd(ZSTD_createCCtx(), ZSTD_freeCCtx);
    try {
      if (!zstd) throw Error("packing the programs: out of memory for a zstd context");
      // Each frame carries a checksum of its content: a damaged byte in a
      // packed program fails to decompress (a named error), never decodes
      // into another valid program.
      for (auto [param, value] : {std::pair{ZSTD_c_compressionLevel, kPackLevel}, std::pair{ZSTD_c_checksumFlag, 1}}) {
        const size_t rc = ZSTD_CCtx_setParameter(zstd.get(), param, value);
        if (ZSTD_isError(rc)) throw Error(std::string("packing the programs: ") + ZSTD_getErrorName(rc));
      }
      flatbuffers::FlatBufferBuilder b(size_t{1} << 20);
      std::vector<uint8_t> scratch;
      for (size_t g; (g = next.fetch_add(1)) < ir.ranks.size();)
        out[g] = PackProgram(static_cast<uint32_t>(g), ir.ranks[g], zstd.get(), b, scratch);
    } catch (...) {
      next = ir.ranks.size();  // the other threads stop too
      throw;
    }
  });
  return out;
}

}  // namespace

std::vector<uint8_t> EmitPlan(const CompileInputs& in, const PlanIR& ir) {
  const std::vector<std::vector<uint8_t>> packed = PackPrograms(ir);
  // The builder starts at about the plan's size: grown by doubling from a
  // small start it copied a large plan's bytes again at every step.
  size_t estimate = size_t{1} << 20;
  for (const std::vector<uint8_t>& p : packed) estimate += p.size() + 64;
  for (const TensorSpec& t : in.model.tensors) estimate += t.name.size() + 128;
  flatbuffers::FlatBufferBuilder b(estimate + estimate / 16);
  std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
  bool transforms = false;  // a buffer holds values offset from the model's: schema 3
  for (const TensorSpec& t : in.model.tensors) {
    std::vector<std::string> stack;
    for (int d : t.stack) stack.push_back(in.model.dims[d].first);
    std::vector<uint64_t> lo(t.lo.begin(), t.lo.end()), hi(t.hi.begin(), t.hi.end());
    const size_t k = tensors.size();
    const float train_offset = in.src.offsets.empty() ? 0.0f : in.src.offsets[k];
    const float infer_offset = in.dst.offsets.empty() ? 0.0f : in.dst.offsets[k];
    transforms = transforms || train_offset != 0 || infer_offset != 0;
    tensors.push_back(fb::CreateTensor(b, b.CreateString(t.name), ToFb(t.dtype), b.CreateVectorOfStrings(stack),
                                       b.CreateVector(lo), b.CreateVector(hi), -1, 0, 0, train_offset, infer_offset));
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
  for (uint32_t g = 0; g < ir.ranks.size(); ++g) {
    const RankProgram& p = ir.ranks[g];
    if (packed[g].empty()) {  // an idle rank: its (empty) program in place
      blobs.push_back(EmitProgram(b, g, p));
      continue;
    }
    auto bytes = b.CreateVector(packed[g]);
    fb::ProgramBuilder pb(b);
    pb.add_rank(g);
    pb.add_src_rank(p.src_rank);
    pb.add_dst_rank(p.dst_rank);
    pb.add_packed(bytes);
    blobs.push_back(pb.Finish());
  }
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
  flatbuffers::Offset<fb::RoundFill> fill;
  if (ir.fill_candidates > 0)  // a direct plan's Schedule chose it
    fill = fb::CreateRoundFill(b, ir.round_fill.proportional, ir.round_fill.min_share, ir.round_fill.staging_fill,
                               ir.round_fill.split_share, ir.round_fill.nic_reserve,
                               ir.round_fill.stripe_mib);
  fb::PlanBuilder pb(b);
  pb.add_schema_version(transforms ? kSchemaVersion : kPlainSchemaVersion);
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
  if (!fill.IsNull()) pb.add_round_fill(fill);
  b.Finish(pb.Finish(), fb::PlanIdentifier());
  if (b.GetSize() >= (size_t{2} << 30))
    throw Error("the plan is " + std::to_string(b.GetSize() >> 20) +
                " MiB, over the 2 GiB FlatBuffers limit; raise --staging-mb to make fewer, larger steps");
  std::vector<uint8_t> bytes(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  StampContentDigest(bytes.data(), bytes.size());
  return bytes;
}

}  // namespace reshard
