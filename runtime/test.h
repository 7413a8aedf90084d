// Fixtures of the runtime tests: plans built with the flatbuffers builder, a
// temporary directory, and ranks run in forked processes.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/plan.h"
#include "runtime/supervise.h"
#include "runtime/transport.h"

namespace reshard::testing {

/// A transport for plans without messages: it cannot gather either, so a
/// session over it proves nothing at connect and its local checks speak.
class NoTransport : public Transport {
 public:
  NoTransport(uint32_t rank, uint32_t size) : rank_(rank), size_(size) {}
  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1000); }
  size_t post_send(uint32_t, uint64_t, const void*, size_t) override { throw Error("no messages"); }
  size_t post_recv(uint32_t, uint64_t, void*, size_t) override { throw Error("no messages"); }
  void wait(size_t, Clock::time_point) override {}
  void reset() override {}
  bool allgather(const void*, size_t, void*, Clock::time_point) override { return false; }

 private:
  uint32_t rank_, size_;
};

inline fb::Region MakeRegion(uint32_t buffer, uint64_t offset, std::vector<uint32_t> shape,
                             std::vector<uint32_t> stride, uint8_t buffer_modes = 0) {
  uint32_t sh[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
  for (size_t k = 0; k < shape.size() && k < 4; ++k) sh[k] = shape[k];
  for (size_t k = 0; k < stride.size() && k < 4; ++k) st[k] = stride[k];
  return fb::Region(offset, flatbuffers::span<const uint32_t, 4>(sh), flatbuffers::span<const uint32_t, 4>(st), buffer,
                    static_cast<uint8_t>(shape.size()), buffer_modes, 0);
}

/// A staging region (offsets in elements of the step's wire dtype).
inline fb::Region StagingRegion(uint64_t offset, std::vector<uint32_t> shape, std::vector<uint32_t> stride) {
  return MakeRegion(kNone, offset, std::move(shape), std::move(stride));
}

inline fb::Step MakeStep(fb::StepKind kind, uint32_t peer, uint32_t src, uint32_t dst, uint64_t staging,
                         uint64_t bytes, fb::Dtype wire, fb::Channel channel = fb::Channel::net, uint32_t dep = kNone) {
  return fb::Step(staging, bytes, peer, src, dst, dep, kind, channel, wire, 0, 0);
}

/// A fragment: logical box [lo, hi) of tensor `tensor` at `offset` of buffer
/// `buffer`, with element strides per logical dim (none select buffers).
inline fb::Fragment MakeFragment(uint32_t tensor, uint32_t buffer, uint64_t offset, std::vector<uint32_t> lo,
                                 std::vector<uint32_t> hi, std::vector<uint64_t> stride, uint8_t role,
                                 uint8_t buffer_dims = 0) {
  uint64_t st[6] = {};
  uint32_t l[6] = {}, h[6] = {};
  for (size_t d = 0; d < lo.size() && d < hi.size() && d < stride.size() && d < 6; ++d) {
    l[d] = lo[d];
    h[d] = hi[d];
    st[d] = stride[d];
  }
  return fb::Fragment(offset, flatbuffers::span<const uint64_t, 6>(st), flatbuffers::span<const uint32_t, 6>(l),
                      flatbuffers::span<const uint32_t, 6>(h), tensor, buffer, static_cast<uint8_t>(lo.size()),
                      buffer_dims, role, 0);
}

struct BufferSpec {
  std::string name;
  fb::Dtype dtype = fb::Dtype::fp32;
  std::vector<uint64_t> shape;
  float offset = 0;  // Buffer.offset
};

struct TensorSpec {
  std::string name;
  fb::Dtype dtype = fb::Dtype::fp32;
  std::vector<uint64_t> lo, hi;
  int scale_of = -1;  // a scale tensor: the scales of tensor scale_of on `side`, over `block`
  uint8_t side = 0;
  std::vector<uint64_t> block = {};
  float train_offset = 0, infer_offset = 0;  // Tensor.train_offset / infer_offset
};

/// A QuantOp of step `step`.
inline fb::QuantOp MakeQuant(uint32_t step, fb::QuantKind kind, uint32_t scale, std::array<uint32_t, 2> origin,
                             std::array<uint32_t, 2> block, fb::Dtype scale_dtype = fb::Dtype::fp32) {
  return fb::QuantOp(step, scale, flatbuffers::span<const uint32_t, 2>(origin),
                     flatbuffers::span<const uint32_t, 2>(block), kind, scale_dtype, 0);
}

struct ProgramSpec {
  uint32_t rank = 0;
  std::vector<BufferSpec> buffers;
  std::vector<fb::Fragment> fragments;
  uint64_t staging_bytes = 0;
  std::vector<fb::Region> regions;
  std::vector<fb::Step> steps;
  std::vector<fb::QuantOp> quant_ops;
  /// Starts of rounds; Build closes the list with steps.size() unless raw_rounds.
  std::vector<uint32_t> round_begin;
  bool raw_rounds = false;

  uint32_t Region(fb::Region r) {
    regions.push_back(r);
    return static_cast<uint32_t>(regions.size() - 1);
  }
  /// Starts a new round at the next step.
  void Round() { round_begin.push_back(static_cast<uint32_t>(steps.size())); }
  void Step(fb::Step s) {
    if (round_begin.empty()) Round();
    steps.push_back(s);
  }
  /// Adds `s` with a quant op (its step field is filled in).
  void QuantStep(fb::Step s, fb::QuantKind kind, uint32_t scale, std::array<uint32_t, 2> origin,
                 std::array<uint32_t, 2> block, fb::Dtype scale_dtype = fb::Dtype::fp32) {
    quant_ops.push_back(MakeQuant(static_cast<uint32_t>(steps.size()), kind, scale, origin, block, scale_dtype));
    Step(s);
  }
};

struct PlanSpec {
  uint32_t schema_version = kSchemaVersion;
  uint64_t staging_limit = 0;  // bytes per rank (validate checks it)
  int64_t num_ranks = -1;  // -1: programs.size()
  std::vector<TensorSpec> tensors;
  std::vector<ProgramSpec> programs;
};

inline flatbuffers::Offset<fb::Program> BuildProgram(flatbuffers::FlatBufferBuilder& b, const ProgramSpec& p) {
  std::vector<flatbuffers::Offset<fb::Buffer>> buffers;
  for (const BufferSpec& s : p.buffers)
    buffers.push_back(fb::CreateBufferDirect(b, s.name.c_str(), s.dtype, &s.shape, 0, s.offset));
  std::vector<uint32_t> rb = p.round_begin;
  if (!p.raw_rounds) {
    if (rb.empty()) rb.push_back(0);
    if (rb.back() != p.steps.size()) rb.push_back(static_cast<uint32_t>(p.steps.size()));
  }
  return fb::CreateProgramDirect(b, p.rank, -1, -1, &buffers, &p.fragments, p.staging_bytes, &p.regions, &p.steps,
                                 &rb, p.quant_ops.empty() ? nullptr : &p.quant_ops);
}

inline std::vector<uint8_t> BuildPlan(const PlanSpec& spec) {
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
  for (const TensorSpec& t : spec.tensors) {
    tensors.push_back(fb::CreateTensorDirect(b, t.name.c_str(), t.dtype, nullptr, &t.lo, &t.hi, t.scale_of, t.side,
                                             t.block.empty() ? nullptr : &t.block, t.train_offset, t.infer_offset));
  }
  std::vector<flatbuffers::Offset<fb::Program>> blobs;
  for (const ProgramSpec& p : spec.programs) blobs.push_back(BuildProgram(b, p));
  uint32_t n = spec.num_ranks >= 0 ? static_cast<uint32_t>(spec.num_ranks) : static_cast<uint32_t>(spec.programs.size());
  std::vector<uint32_t> none;
  auto root = fb::CreatePlanDirect(b, spec.schema_version, "test", "digest", fb::Strategy::direct, "test-model",
                                   "train", "infer", "local", spec.staging_limit, n, &none, &none, &none, &tensors, &blobs, 0, 0, 1);
  fb::FinishPlanBuffer(b, root);
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

// Plans the multi-rank tests (gloo_test, c_api_test, e2e_test) share.

// Tensor w bf16 [8,16] held whole by rank 0. Rank 1 needs columns 4..12 as
// fp32 (pack on 0, unpack converting on 1) and rows 0..4 as bf16, sent
// straight from rank 0's buffer into its own.
inline PlanSpec PackAndDirectPlan() {
  PlanSpec spec;
  spec.tensors.push_back({"w", fb::Dtype::bf16, {0, 0}, {8, 16}});
  ProgramSpec p0, p1;
  p0.rank = 0;
  p0.buffers = {{"w", fb::Dtype::bf16, {8, 16}}};
  p0.fragments.push_back(MakeFragment(0, 0, 0, {0, 0}, {8, 16}, {16, 1}, 0));
  p0.staging_bytes = 128;
  uint32_t cols = p0.Region(MakeRegion(0, 4, {8, 8}, {16, 1}));
  uint32_t rows = p0.Region(MakeRegion(0, 0, {4, 16}, {16, 1}));
  p0.Step(MakeStep(fb::StepKind::pack, kNone, cols, kNone, 0, 128, fb::Dtype::bf16));
  p0.Step(MakeStep(fb::StepKind::send, 1, kNone, kNone, 0, 128, fb::Dtype::bf16));
  p0.Step(MakeStep(fb::StepKind::send, 1, rows, kNone, 0, 128, fb::Dtype::bf16));
  p1.rank = 1;
  p1.buffers = {{"w.cols", fb::Dtype::fp32, {8, 8}}, {"w.rows", fb::Dtype::bf16, {4, 16}}};
  p1.fragments.push_back(MakeFragment(0, 0, 0, {0, 4}, {8, 12}, {8, 1}, 1));
  p1.fragments.push_back(MakeFragment(0, 1, 0, {0, 0}, {4, 16}, {16, 1}, 1));
  p1.staging_bytes = 128;
  uint32_t dcols = p1.Region(MakeRegion(0, 0, {8, 8}, {8, 1}));
  uint32_t drows = p1.Region(MakeRegion(1, 0, {64}, {1}));
  p1.Step(MakeStep(fb::StepKind::recv, 0, kNone, kNone, 0, 128, fb::Dtype::bf16));
  p1.Step(MakeStep(fb::StepKind::recv, 0, kNone, drows, 0, 128, fb::Dtype::bf16));
  p1.Step(MakeStep(fb::StepKind::unpack, kNone, kNone, dcols, 0, 128, fb::Dtype::bf16));
  spec.programs = {p0, p1};
  return spec;
}

// Tensor u fp32 [4,32]: rank 0 holds rows 0..2, rank 1 rows 2..4; ranks 2 and
// 3 each need all of u. Round 0: 0 -> 2 and 1 -> 3 straight from the buffers
// into staging. Round 1: 2 and 3 forward what they got to each other (nvlink);
// both unpack all four rows through one staging region.
inline PlanSpec ForwardPlan() {
  PlanSpec spec;
  spec.tensors.push_back({"u", fb::Dtype::fp32, {0, 0}, {4, 32}});
  std::vector<ProgramSpec> p(4);
  for (int s = 0; s < 2; ++s) {
    p[s].rank = s;
    p[s].buffers = {{"u.half", fb::Dtype::fp32, {2, 32}}};
    p[s].fragments.push_back(MakeFragment(0, 0, 0, {static_cast<uint32_t>(2 * s), 0},
                                          {static_cast<uint32_t>(2 * s + 2), 32}, {32, 1}, 0));
    uint32_t all = p[s].Region(MakeRegion(0, 0, {2, 32}, {32, 1}));
    p[s].Step(MakeStep(fb::StepKind::send, 2 + s, all, kNone, 0, 256, fb::Dtype::fp32));
  }
  for (int d = 2; d < 4; ++d) {
    const uint32_t other = d == 2 ? 3 : 2;
    const uint64_t mine = d == 2 ? 0 : 256, theirs = d == 2 ? 256 : 0;  // staging offsets of rows 0..2 / 2..4
    p[d].rank = d;
    p[d].buffers = {{"u", fb::Dtype::fp32, {4, 32}}};
    p[d].fragments.push_back(MakeFragment(0, 0, 0, {0, 0}, {4, 32}, {32, 1}, 1));
    p[d].staging_bytes = 512;
    p[d].Step(MakeStep(fb::StepKind::recv, d - 2, kNone, kNone, mine, 256, fb::Dtype::fp32));
    p[d].Round();
    p[d].Step(MakeStep(fb::StepKind::forward, other, kNone, kNone, mine, 256, fb::Dtype::fp32, fb::Channel::nvlink));
    p[d].Step(MakeStep(fb::StepKind::recv, other, kNone, kNone, theirs, 256, fb::Dtype::fp32, fb::Channel::nvlink));
    // Rows 0..4 lie in staging in order; unpack them as one staging region.
    uint32_t stage = p[d].Region(StagingRegion(0, {4, 32}, {32, 1}));
    uint32_t dst = p[d].Region(MakeRegion(0, 0, {4, 32}, {32, 1}));
    p[d].Step(MakeStep(fb::StepKind::unpack, kNone, stage, dst, 0, 512, fb::Dtype::fp32));
  }
  spec.programs = p;
  return spec;
}

// Block-scaled FP8 plans (quant_test in runtime/ and compiler/). Tensor w
// bf16 [4,8] held whole by rank 0 (bf16, or FP8 with 2x4 block scales when
// `fp8_source`); rank 1 needs rows 1..3, which cut both block rows.
enum class QuantPath {
  requantize,        // rank 0 sends rows 0..4 as bf16, rank 1 quantizes them
  sender_quantizes,  // rank 0 quantizes rows 0..4 and sends rows 1..3 in FP8 plus the scales
  fp8_source,        // rank 0 holds FP8 and dequantizes rows 1..3; rank 1 needs them as bf16
};

inline PlanSpec QuantPlan(QuantPath path) {
  using K = fb::StepKind;
  using D = fb::Dtype;
  using Q = fb::QuantKind;
  PlanSpec spec;
  spec.staging_limit = 64;
  spec.tensors.push_back({"w", D::bf16, {0, 0}, {4, 8}});
  const bool fp8_dst = path != QuantPath::fp8_source;
  // Scale tensor 1: w's scales on the side that is quantized.
  spec.tensors.push_back({"w#scale", D::fp32, {0, 0}, {2, 2}, 0, static_cast<uint8_t>(fp8_dst ? 1 : 0), {2, 4}});
  ProgramSpec p0, p1;
  p0.rank = 0;
  p1.rank = 1;
  if (path == QuantPath::fp8_source) {
    p0.buffers = {{"w", D::fp8_e4m3, {4, 8}}, {"w.scale", D::fp32, {2, 2}}};
    p0.fragments.push_back(MakeFragment(1, 1, 0, {0, 0}, {2, 2}, {2, 1}, 0));
  } else {
    p0.buffers = {{"w", D::bf16, {4, 8}}};
  }
  p0.fragments.push_back(MakeFragment(0, 0, 0, {0, 0}, {4, 8}, {8, 1}, 0));
  p1.buffers = {{"w", fp8_dst ? D::fp8_e4m3 : D::bf16, {2, 8}}};
  p1.fragments.push_back(MakeFragment(0, 0, 0, {1, 0}, {3, 8}, {8, 1}, 1));
  if (fp8_dst) {
    p1.buffers.push_back({"w.scale", D::fp32, {2, 2}});
    p1.fragments.push_back(MakeFragment(1, 1, 0, {0, 0}, {2, 2}, {2, 1}, 1));
  }
  const uint32_t rows = p0.Region(MakeRegion(0, 0, {4, 8}, {8, 1}));
  const uint32_t dst = p1.Region(MakeRegion(0, 0, {2, 8}, {8, 1}));
  switch (path) {
    case QuantPath::requantize: {
      p0.staging_bytes = 64;
      p0.Step(MakeStep(K::pack, kNone, rows, kNone, 0, 64, D::bf16));
      p0.Step(MakeStep(K::send, 1, kNone, kNone, 0, 64, D::bf16));
      p1.staging_bytes = 64;
      p1.Step(MakeStep(K::recv, 0, kNone, kNone, 0, 64, D::bf16));
      const uint32_t stage = p1.Region(StagingRegion(0, {4, 8}, {8, 1}));
      const uint32_t scale = p1.Region(MakeRegion(1, 0, {2, 2}, {2, 1}));
      p1.QuantStep(MakeStep(K::unpack, kNone, stage, dst, 0, 16, D::bf16), Q::quantize, scale, {1, 0}, {2, 4});
      break;
    }
    case QuantPath::sender_quantizes: {
      // 16 FP8 bytes at 0, then the 4 fp32 scales at byte 16 (element 4).
      p0.staging_bytes = 32;
      const uint32_t q = p0.Region(StagingRegion(0, {2, 8}, {8, 1}));
      const uint32_t scale = p0.Region(StagingRegion(4, {2, 2}, {2, 1}));
      p0.QuantStep(MakeStep(K::pack, kNone, rows, q, 0, 16, D::fp8_e4m3), Q::quantize, scale, {1, 0}, {2, 4});
      p0.Step(MakeStep(K::send, 1, kNone, kNone, 0, 32, D::fp8_e4m3));
      p1.staging_bytes = 32;
      p1.Step(MakeStep(K::recv, 0, kNone, kNone, 0, 32, D::fp8_e4m3));
      const uint32_t sdst = p1.Region(MakeRegion(1, 0, {4}, {1}));
      p1.Step(MakeStep(K::unpack, kNone, kNone, dst, 0, 16, D::fp8_e4m3));
      p1.Step(MakeStep(K::unpack, kNone, kNone, sdst, 16, 16, D::fp32));
      break;
    }
    case QuantPath::fp8_source: {
      p0.staging_bytes = 32;
      const uint32_t part = p0.Region(MakeRegion(0, 8, {2, 8}, {8, 1}));
      const uint32_t out = p0.Region(StagingRegion(0, {2, 8}, {8, 1}));
      const uint32_t scale = p0.Region(MakeRegion(1, 0, {2, 2}, {2, 1}));
      p0.QuantStep(MakeStep(K::pack, kNone, part, out, 0, 32, D::bf16), Q::dequantize, scale, {1, 0}, {2, 4});
      p0.Step(MakeStep(K::send, 1, kNone, kNone, 0, 32, D::bf16));
      p1.Step(MakeStep(K::recv, 0, kNone, dst, 0, 32, D::bf16));
      break;
    }
  }
  spec.programs = {p0, p1};
  return spec;
}

struct ShellResult {
  int exit_code;
  std::string out;  // stdout and stderr
};

/// Runs `command` through the shell, stderr folded into stdout.
inline ShellResult Shell(const std::string& command) {
  ShellResult r{-1, ""};
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// A fresh directory, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "reshard-test-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw Error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

struct RankOutcome {
  int exit_code = -1;    // -1: killed by a signal or by the timeout
  bool timed_out = false;
  std::string message;   // what the rank reported ("" when it succeeded)
  double seconds = 0;    // from the start until the rank exited
};

/// Runs fn(rank) for ranks 0..n-1, each in a forked process
/// (runtime/supervise.h). fn returns "" for success or what went wrong
/// (exceptions are caught and reported). Ranks still running after
/// `timeout_s` are killed.
inline std::vector<RankOutcome> RunRanks(int n, const std::function<std::string(int)>& fn, double timeout_s = 30) {
  SuperviseOptions options;
  options.watchdog_s = timeout_s;
  SuperviseResult run = Supervise(
      static_cast<size_t>(n),
      [&](size_t r, int fd) {
        const std::string msg = fn(static_cast<int>(r));
        WriteAll(fd, msg);
        return msg.empty() ? 0 : 1;
      },
      options);
  std::vector<RankOutcome> out(static_cast<size_t>(n));
  for (size_t r = 0; r < out.size(); ++r) {
    const ChildOutcome& c = run.children[r];
    out[r].exit_code = c.exit_code();
    out[r].timed_out = c.timed_out;
    out[r].message = c.text;
    out[r].seconds = c.seconds;
  }
  return out;
}

}  // namespace reshard::testing
