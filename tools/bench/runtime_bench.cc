// Runtime micro and end-to-end benchmarks on 2 local ranks over Gloo (two
// forked processes, FileStore rendezvous in a temporary directory), each
// against a baseline measured in the same run:
//   a. per-step overhead: a plan of >100k small steps (4-byte pack/unpack, one
//      exchange per round) vs the same work written by hand (memcpy + raw Gloo);
//   b. pack and unpack of a large strided bf16 region (every other half row)
//      vs a plain memcpy of the same bytes;
//   c. a plan of large contiguous regions sent buffer to buffer vs raw Gloo
//      UnboundBuffer send/recv of the same chunks;
//   d. a staged plan (strided regions: pack, send, receive, unpack) in rounds
//      over two alternating staging arenas, as the compiler lays them out,
//      pipelined (runtime/pipeline.h) and in series (RESHARD_PIPELINE=0), vs
//      raw Gloo sending the same bytes in as many messages; and the CPU
//      seconds both ranks spent on the pipelined plan and on raw Gloo.
// Rows c and d also show raw Gloo with each message cut into the parts
// reshard's transport cuts it into (GlooOptions::chunk_bytes, 1 MiB unless
// RESHARD_GLOO_CHUNK_BYTES says otherwise), and the plan over a second
// transport that sends messages whole (what the parts are measured against).
// Row d also shows the same exchange written by hand as tightly as it can be
// on a CPU: each part packed (its rows memcpy'd) into a ring of 8 parts just
// before it is sent, and unpacked as soon as it arrives, so that the copies
// run beside the transfers and the kernel reads and writes parts still in
// cache: what a staged plan could at best reach on this host.
// Every number is the median of N repetitions (after one warm-up); timed
// sections start after a barrier, and a two-rank section counts the slower rank.
//
// Usage: runtime_bench [--reps N] [--pack-mib M] [--e2e-mib M] [--rounds R] [--k K] [--staged-rounds R]
#include <signal.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "runtime/error.h"
#include "runtime/gloo_transport.h"
#include "runtime/plan.h"
#include "runtime/pipeline.h"
#include "runtime/session.h"
#include "runtime/test.h"

namespace {

using reshard::kNone;
using reshard::fb::Dtype;
using reshard::fb::StepKind;
using reshard::testing::MakeRegion;
using reshard::testing::MakeStep;
using reshard::testing::PlanSpec;
using reshard::testing::ProgramSpec;
using Clock = std::chrono::steady_clock;

struct Config {
  int reps = 5;
  uint64_t pack_mib = 256;  // bytes packed / unpacked (b)
  uint32_t pack_cols = 4096;  // elements per contiguous run of the strided region (8 KiB of bf16)
  uint64_t e2e_mib = 256;   // bytes moved rank 0 -> rank 1 (c)
  uint32_t e2e_chunks = 8;  // regions (messages) they are split into
  uint32_t rounds = 800;    // (a): rounds of
  uint32_t k = 64;          // k packs, 1 send, 1 recv, k unpacks per rank
  uint32_t staged_rounds = 16;  // (d): rounds the e2e_mib strided bytes are split into
};

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// CPU seconds this process (every thread: the caller's and Gloo's I/O loop)
// has used so far.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// --- plans ------------------------------------------------------------------

// (a) Both ranks: per round, pack k 4-byte regions (2 bf16) into staging,
// exchange the k*4 bytes with the peer, unpack the k elements pairs received.
PlanSpec StepPlan(const Config& c) {
  PlanSpec spec;
  const uint64_t elems = uint64_t{c.rounds} * c.k * 2;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ProgramSpec p;
    p.rank = rank;
    p.buffers = {{"src", Dtype::bf16, {elems}}, {"dst", Dtype::bf16, {elems}}};
    p.staging_bytes = uint64_t{c.k} * 8;
    const uint32_t in = c.k * 4;  // staging offset of what arrives
    for (uint32_t r = 0; r < c.rounds; ++r) {
      p.Round();
      for (uint32_t j = 0; j < c.k; ++j) {
        uint32_t src = p.Region(MakeRegion(0, (uint64_t{r} * c.k + j) * 2, {2}, {1}));
        p.Step(MakeStep(StepKind::pack, kNone, src, kNone, j * 4, 4, Dtype::bf16));
      }
      p.Step(MakeStep(StepKind::send, 1 - rank, kNone, kNone, 0, c.k * 4, Dtype::bf16));
      p.Step(MakeStep(StepKind::recv, 1 - rank, kNone, kNone, in, c.k * 4, Dtype::bf16));
      for (uint32_t j = 0; j < c.k; ++j) {
        uint32_t dst = p.Region(MakeRegion(1, (uint64_t{r} * c.k + j) * 2, {2}, {1}));
        p.Step(MakeStep(StepKind::unpack, kNone, kNone, dst, in + j * 4, 4, Dtype::bf16));
      }
    }
    spec.programs.push_back(std::move(p));
  }
  return spec;
}

// (b) Rank 0 packs the left half of every row of a [rows, 2*cols] bf16 buffer
// (round 0), sends it (round 1); rank 1 receives it (round 1) and unpacks it
// into the right half of every row of its buffer (round 2).
PlanSpec PackPlan(const Config& c) {
  const uint64_t bytes = c.pack_mib << 20;
  const uint32_t cols = c.pack_cols;
  const uint32_t rows = static_cast<uint32_t>(bytes / 2 / cols);
  PlanSpec spec;
  ProgramSpec p0, p1;
  p0.rank = 0;
  p0.buffers = {{"w", Dtype::bf16, {rows, 2ull * cols}}};
  p0.staging_bytes = bytes;
  uint32_t left = p0.Region(MakeRegion(0, 0, {rows, cols}, {2 * cols, 1}));
  p0.Step(MakeStep(StepKind::pack, kNone, left, kNone, 0, bytes, Dtype::bf16));
  p0.Round();
  p0.Step(MakeStep(StepKind::send, 1, kNone, kNone, 0, bytes, Dtype::bf16));
  p0.Round();  // empty round 2
  p0.round_begin.push_back(static_cast<uint32_t>(p0.steps.size()));
  p0.raw_rounds = true;

  p1.rank = 1;
  p1.buffers = {{"w", Dtype::bf16, {rows, 2ull * cols}}};
  p1.staging_bytes = bytes;
  p1.Round();  // empty round 0
  p1.Round();
  p1.Step(MakeStep(StepKind::recv, 0, kNone, kNone, 0, bytes, Dtype::bf16));
  p1.Round();
  uint32_t right = p1.Region(MakeRegion(0, cols, {rows, cols}, {2 * cols, 1}));
  p1.Step(MakeStep(StepKind::unpack, kNone, kNone, right, 0, bytes, Dtype::bf16));
  spec.programs = {p0, p1};
  return spec;
}

// (d) Rank 0 packs the left halves of a [rows, 2*cols] bf16 buffer's rows,
// one slice of rows per round into staging arena r % 2, and sends them; rank
// 1 receives each slice into its arena r % 2 and unpacks it into the right
// halves of its rows.
PlanSpec StagedPlan(const Config& c) {
  const uint64_t bytes = c.e2e_mib << 20;
  const uint32_t cols = c.pack_cols;
  const uint32_t rows = static_cast<uint32_t>(bytes / 2 / cols);
  const uint32_t per = rows / c.staged_rounds;
  const uint64_t slice = uint64_t{per} * cols * 2;
  PlanSpec spec;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ProgramSpec p;
    p.rank = rank;
    p.buffers = {{"w", Dtype::bf16, {rows, 2ull * cols}}};
    p.staging_bytes = 2 * slice;
    for (uint32_t r = 0; r < c.staged_rounds; ++r) {
      const uint64_t arena = (r % 2) * slice;
      p.Round();
      if (rank == 0) {
        uint32_t left = p.Region(MakeRegion(0, uint64_t{r} * per * 2 * cols, {per, cols}, {2 * cols, 1}));
        p.Step(MakeStep(StepKind::pack, kNone, left, kNone, arena, slice, Dtype::bf16));
        p.Step(MakeStep(StepKind::send, 1, kNone, kNone, arena, slice, Dtype::bf16));
      } else {
        uint32_t right = p.Region(MakeRegion(0, uint64_t{r} * per * 2 * cols + cols, {per, cols}, {2 * cols, 1}));
        p.Step(MakeStep(StepKind::recv, 0, kNone, kNone, arena, slice, Dtype::bf16));
        p.Step(MakeStep(StepKind::unpack, kNone, kNone, right, arena, slice, Dtype::bf16));
      }
    }
    spec.programs.push_back(std::move(p));
  }
  return spec;
}

// (c) One round: rank 0 sends `chunks` contiguous regions straight from its
// buffer, rank 1 receives them straight into its own.
PlanSpec E2ePlan(const Config& c) {
  const uint64_t chunk = (c.e2e_mib << 20) / c.e2e_chunks / 2;  // elements
  PlanSpec spec;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ProgramSpec p;
    p.rank = rank;
    p.buffers = {{"w", Dtype::bf16, {c.e2e_chunks, chunk}}};
    for (uint32_t i = 0; i < c.e2e_chunks; ++i) {
      uint32_t region = p.Region(MakeRegion(0, i * chunk, {static_cast<uint32_t>(chunk)}, {1}));
      if (rank == 0) {
        p.Step(MakeStep(StepKind::send, 1, region, kNone, 0, chunk * 2, Dtype::bf16));
      } else {
        p.Step(MakeStep(StepKind::recv, 0, kNone, region, 0, chunk * 2, Dtype::bf16));
      }
    }
    spec.programs.push_back(std::move(p));
  }
  return spec;
}

// --- one rank ---------------------------------------------------------------

struct Memory {
  std::unique_ptr<char[], void (*)(void*)> p{nullptr, std::free};
  explicit Memory(size_t bytes) : p(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)), std::free) {
    if (!p) throw reshard::Error("cannot allocate " + std::to_string(bytes) + " bytes");
    std::memset(p.get(), 0x11, bytes);  // touched: no page faults in timed sections
  }
  char* get() const { return p.get(); }
};

// A session over one plan with every buffer allocated, touched and bound.
struct Bound {
  reshard::Session session;
  std::vector<Memory> memory;
  Bound(const reshard::Plan& plan, uint32_t rank, reshard::Transport& t) : session(plan, rank, t) {
    const auto& prog = session.program();
    for (const reshard::fb::Buffer* b : *prog.buffers()) {
      const size_t bytes = reshard::BufferElements(*b) * reshard::DtypeSize(b->dtype());
      memory.emplace_back(std::max<size_t>(bytes, 1));
      session.bind(b->name()->str(), memory.back().get(), b->dtype(),
                   std::vector<uint64_t>(b->shape()->begin(), b->shape()->end()));
    }
  }
};

std::shared_ptr<gloo::Context> RawContext(uint32_t rank, const std::string& dir) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore file_store(dir);
  gloo::rendezvous::PrefixStore store("raw", file_store);
  auto context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(rank), 2);
  context->setTimeout(std::chrono::seconds(60));
  context->connectFullMesh(store, device);
  return context;
}

// Raw Gloo messages: post every send/recv, then wait for them all. Messages
// of one direction are numbered by the counters (the slot Gloo matches on).
struct Tags {
  uint64_t send = 0, recv = 0;
};
// One exchange by hand: every send and receive posted, then waited for.
// `part` > 0 cuts each message into parts of that many bytes on its slot, as
// reshard's Gloo transport does (GlooOptions::chunk_bytes).
size_t PartsOf(size_t bytes, size_t part) { return part == 0 ? 1 : (bytes + part - 1) / part; }

void RawExchange(gloo::Context& ctx, const std::vector<std::pair<char*, size_t>>& sends,
                 const std::vector<std::pair<char*, size_t>>& recvs, int peer, Tags& tags, size_t part = 0) {
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> s, r;
  for (auto& [p, n] : sends) {
    s.push_back(ctx.createUnboundBuffer(p, n));
    const size_t step = part == 0 ? n : part;
    for (size_t off = 0; off < n; off += step) s.back()->send(peer, tags.send, off, std::min(step, n - off));
    ++tags.send;
  }
  for (auto& [p, n] : recvs) {
    r.push_back(ctx.createUnboundBuffer(p, n));
    const size_t step = part == 0 ? n : part;
    for (size_t off = 0; off < n; off += step) r.back()->recv(peer, tags.recv, off, std::min(step, n - off));
    ++tags.recv;
  }
  for (auto& b : s)
    for (size_t k = 0; k < PartsOf(b->size, part); ++k) b->waitSend();
  for (auto& b : r)
    for (size_t k = 0; k < PartsOf(b->size, part); ++k) b->waitRecv();
}

class Rank {
 public:
  Rank(uint32_t rank, const std::string& dir, const Config& c, std::ostringstream& out)
      : rank_(rank), peer_(1 - rank), c_(c), out_(out) {
    reshard::GlooOptions o;
    o.store_dir = dir;
    o.prefix = "reshard";
    transport_ = std::make_unique<reshard::GlooTransport>(rank, 2, o);
    part_ = reshard::GlooChunkBytes(o);
    o.prefix = "reshard_whole";
    o.chunk_bytes = 0;
    unsetenv("RESHARD_GLOO_CHUNK_BYTES");
    whole_ = std::make_unique<reshard::GlooTransport>(rank, 2, o);
    raw_ = RawContext(rank, dir);
  }

  void Barrier() {
    gloo::BarrierOptions opts(raw_);
    gloo::barrier(opts);
  }
  void Report(const char* name, int rep, double seconds) { out_ << name << " " << rep << " " << seconds << "\n"; }

  // Rank 0 sends `chunks` to rank 1 by hand over raw Gloo (in parts of
  // `part` bytes, 0: whole), after a barrier; reports the time as `name`.
  void RawOneWay(const char* name, int rep, const std::vector<std::pair<char*, size_t>>& chunks, size_t part) {
    const std::vector<std::pair<char*, size_t>> none;
    Barrier();
    const auto t = Clock::now();
    RawExchange(*raw_, rank_ == 0 ? chunks : none, rank_ == 0 ? none : chunks, peer_, tags_, part);
    Report(name, rep, Since(t));
  }

  // (a)
  void Steps(const reshard::Plan& plan) {
    Bound b(plan, rank_, *transport_);
    uint64_t steps = 0;
    for (int rep = -1; rep < c_.reps; ++rep) {
      Barrier();
      auto t = Clock::now();
      reshard::RunStats st = b.session.run();
      Report("steps", rep, Since(t));
      steps = st.steps;
    }
    out_ << "steps_count 0 " << steps << "\n";
    // The same work by hand: k memcpy of 4 bytes, one exchange, k memcpy back.
    char* src = b.memory[0].get();
    char* dst = b.memory[1].get();
    std::vector<char> staging(c_.k * 8);
    for (int rep = -1; rep < c_.reps; ++rep) {
      Barrier();
      auto t = Clock::now();
      for (uint32_t r = 0; r < c_.rounds; ++r) {
        const size_t base = (size_t{r} * c_.k) * 4;
        for (uint32_t j = 0; j < c_.k; ++j) std::memcpy(staging.data() + j * 4, src + base + j * 4, 4);
        RawExchange(*raw_, {{staging.data(), c_.k * 4}}, {{staging.data() + c_.k * 4, c_.k * 4}}, peer_, tags_);
        for (uint32_t j = 0; j < c_.k; ++j) std::memcpy(dst + base + j * 4, staging.data() + c_.k * 4 + j * 4, 4);
      }
      Report("steps_raw", rep, Since(t));
    }
  }

  // (b)
  void Pack(const reshard::Plan& plan) {
    const size_t bytes = c_.pack_mib << 20;
    Bound b(plan, rank_, *transport_);
    for (int rep = -1; rep < c_.reps; ++rep) {
      Barrier();
      reshard::RunStats st = b.session.run();
      if (rank_ == 0) Report("pack", rep, st.rounds.at(0).seconds);
      if (rank_ == 1) Report("unpack", rep, st.rounds.at(2).seconds);
      Report("pack_plan", rep, st.seconds);
    }
    // The baseline, one rank at a time: memcpy of the same bytes.
    Memory a(bytes), z(bytes);
    for (int rep = -1; rep < c_.reps; ++rep) {
      for (uint32_t turn = 0; turn < 2; ++turn) {
        Barrier();
        if (turn != rank_) continue;
        auto t = Clock::now();
        std::memcpy(z.get(), a.get(), bytes);
        Report("memcpy", rep, Since(t));
      }
    }
  }

  // (c): plan and raw Gloo alternate, so that both see the same machine.
  void E2e(const reshard::Plan& plan) {
    Bound b(plan, rank_, *transport_);
    Bound bw(plan, rank_, *whole_);
    const size_t chunk = (c_.e2e_mib << 20) / c_.e2e_chunks;
    char* w = b.memory[0].get();
    std::vector<std::pair<char*, size_t>> chunks;
    for (uint32_t i = 0; i < c_.e2e_chunks; ++i) chunks.push_back({w + i * chunk, chunk});
    for (int rep = -1; rep < c_.reps; ++rep) {
      Barrier();
      auto t = Clock::now();
      b.session.run();
      Report("e2e", rep, Since(t));
      RawOneWay("e2e_raw", rep, chunks, 0);
      RawOneWay("e2e_raw_parts", rep, chunks, part_);
      Barrier();
      t = Clock::now();
      bw.session.run();
      Report("e2e_whole", rep, Since(t));
    }
  }

  // (d): pipelined plan, serial plan and raw Gloo alternate.
  void Staged(const reshard::Plan& plan) {
    Bound piped(plan, rank_, *transport_);
    Bound piped_whole(plan, rank_, *whole_);
    setenv("RESHARD_PIPELINE", "0", 1);
    Bound serial(plan, rank_, *transport_);
    unsetenv("RESHARD_PIPELINE");
    const size_t bytes = c_.e2e_mib << 20;
    const size_t chunk = bytes / c_.staged_rounds;
    Memory w(bytes);
    std::vector<std::pair<char*, size_t>> chunks;
    for (uint32_t i = 0; i < c_.staged_rounds; ++i) chunks.push_back({w.get() + i * chunk, chunk});
    const std::vector<std::pair<char*, size_t>> none;
    for (int rep = -1; rep < c_.reps; ++rep) {
      Barrier();
      auto t = Clock::now();
      double cpu = CpuSeconds();
      piped.session.run();
      Report("staged", rep, Since(t));
      Report("staged_cpu", rep, CpuSeconds() - cpu);
      Barrier();
      t = Clock::now();
      serial.session.run();
      Report("staged_serial", rep, Since(t));
      Barrier();
      t = Clock::now();
      cpu = CpuSeconds();
      if (rank_ == 0) {
        RawExchange(*raw_, chunks, none, peer_, tags_);
      } else {
        RawExchange(*raw_, none, chunks, peer_, tags_);
      }
      Report("staged_raw", rep, Since(t));
      Report("staged_raw_cpu", rep, CpuSeconds() - cpu);
      RawOneWay("staged_raw_parts", rep, chunks, part_);
      FusedByHand("staged_fused", rep);
      Barrier();
      t = Clock::now();
      piped_whole.session.run();
      Report("staged_whole", rep, Since(t));
    }
  }

  // (d) by hand: each 1 MiB part packed (rows memcpy'd) into a ring of
  // parts just before it is sent, and unpacked as soon as it arrives.
  void FusedByHand(const char* name, int rep) {
    const uint64_t bytes = c_.e2e_mib << 20;
    const size_t cols = c_.pack_cols, row = cols * 2;
    const size_t rows = bytes / row;
    std::vector<char>& w = fused_w_;
    w.resize(rows * row * 2);
    const size_t part = part_ ? part_ : (1u << 20), per = part / row, nparts = rows / per;
    constexpr size_t kRing = 8;
    std::vector<char>& ring = fused_ring_;
    ring.resize(kRing * part);
    auto buf = raw_->createUnboundBuffer(ring.data(), ring.size());
    Barrier();
    const auto t = Clock::now();
    const uint64_t tag = rank_ == 0 ? tags_.send++ : tags_.recv++;
    if (rank_ == 0) {
      for (size_t k = 0; k < nparts; ++k) {
        if (k >= kRing) buf->waitSend();
        char* out = ring.data() + (k % kRing) * part;
        for (size_t i = 0; i < per; ++i) std::memcpy(out + i * row, w.data() + (k * per + i) * 2 * row, row);
        buf->send(peer_, tag, (k % kRing) * part, per * row);
      }
      for (size_t k = 0; k < std::min(nparts, kRing); ++k) buf->waitSend();
    } else {
      for (size_t k = 0; k < std::min(nparts, kRing); ++k) buf->recv(peer_, tag, k * part, per * row);
      for (size_t k = 0; k < nparts; ++k) {
        buf->waitRecv();
        const char* in = ring.data() + (k % kRing) * part;
        for (size_t i = 0; i < per; ++i) std::memcpy(w.data() + (k * per + i) * 2 * row + row, in + i * row, row);
        if (k + kRing < nparts) buf->recv(peer_, tag, (k % kRing) * part, per * row);
      }
    }
    Report(name, rep, Since(t));
  }

 private:
  uint32_t rank_, peer_;
  Config c_;
  std::ostringstream& out_;
  std::unique_ptr<reshard::GlooTransport> transport_;
  std::unique_ptr<reshard::GlooTransport> whole_;  // the same, messages sent whole (chunk_bytes 0)
  size_t part_ = 0;                                 // transport_'s part size
  std::shared_ptr<gloo::Context> raw_;
  Tags tags_;
  std::vector<char> fused_w_, fused_ring_;  // FusedByHand's rows and ring, kept across repetitions
};

// --- the parent ---------------------------------------------------------------

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// name -> rep -> max over ranks (wall times), or the sum over ranks for
// names ending in "_cpu" (CPU seconds); warm-up rep -1 dropped.
using Results = std::map<std::string, std::map<int, double>>;

void Parse(const std::string& text, Results& res, uint64_t& steps) {
  std::istringstream in(text);
  std::string name;
  int rep;
  double v;
  while (in >> name >> rep >> v) {
    if (name == "steps_count") {
      steps = static_cast<uint64_t>(v);
      continue;
    }
    if (rep < 0) continue;
    double& slot = res[name][rep];
    const bool cpu = name.size() > 4 && name.compare(name.size() - 4, 4, "_cpu") == 0;
    slot = cpu ? slot + v : std::max(slot, v);
  }
}

double MedianOf(const Results& r, const std::string& name) {
  std::vector<double> v;
  auto it = r.find(name);
  if (it == r.end()) return 0;
  for (auto& [rep, x] : it->second) v.push_back(x);
  return Median(v);
}

int Main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; i += 2) {
    std::string a = argv[i];
    uint64_t v = i + 1 < argc ? std::strtoull(argv[i + 1], nullptr, 10) : 0;
    if (v == 0) a = "";  // every option takes a positive number
    if (a == "--reps") c.reps = static_cast<int>(v);
    else if (a == "--pack-mib") c.pack_mib = v;
    else if (a == "--e2e-mib") c.e2e_mib = v;
    else if (a == "--rounds") c.rounds = static_cast<uint32_t>(v);
    else if (a == "--k") c.k = static_cast<uint32_t>(v);
    else if (a == "--staged-rounds") c.staged_rounds = static_cast<uint32_t>(v);
    else {
      std::fprintf(stderr, "usage: runtime_bench [--reps N] [--pack-mib M] [--e2e-mib M] [--rounds R] [--k K] [--staged-rounds R]\n");
      return 2;
    }
  }
  reshard::testing::TempDir dir;
  const auto t_build = Clock::now();
  reshard::Plan steps_plan =
      reshard::Plan::from_bytes(reshard::testing::BuildPlan(StepPlan(c)), "steps.rsplan");
  reshard::Plan pack_plan = reshard::Plan::from_bytes(reshard::testing::BuildPlan(PackPlan(c)), "pack.rsplan");
  reshard::Plan e2e_plan = reshard::Plan::from_bytes(reshard::testing::BuildPlan(E2ePlan(c)), "e2e.rsplan");
  reshard::Plan staged_plan =
      reshard::Plan::from_bytes(reshard::testing::BuildPlan(StagedPlan(c)), "staged.rsplan");
  std::fprintf(stderr, "runtime_bench: plans built in %.2f s; running 2 ranks, %d repetitions each\n", Since(t_build),
               c.reps);

  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    int p[2];
    if (pipe(p) != 0) throw reshard::Error("pipe failed");
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      close(p[0]);
      std::ostringstream out;
      int rc = 0;
      try {
        Rank r(rank, dir.path(), c, out);
        r.Steps(steps_plan);
        r.Pack(pack_plan);
        r.E2e(e2e_plan);
        r.Staged(staged_plan);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "runtime_bench: rank %u: %s\n", rank, e.what());
        rc = 1;
      }
      const std::string s = out.str();
      size_t off = 0;
      while (off < s.size()) {
        ssize_t w = write(p[1], s.data() + off, s.size() - off);
        if (w <= 0) break;
        off += static_cast<size_t>(w);
      }
      close(p[1]);
      _exit(rc);
    }
    close(p[1]);
    pids.push_back(pid);
    fds.push_back(p[0]);
  }
  Results res;
  uint64_t steps = 0;
  bool failed = false;
  for (size_t r = 0; r < 2; ++r) {
    std::string text;
    char buf[4096];
    ssize_t k;
    while ((k = read(fds[r], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(k));
    close(fds[r]);
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = true;
    Parse(text, res, steps);
  }
  if (failed) {
    std::fprintf(stderr, "runtime_bench: a rank failed\n");
    return 1;
  }

  const size_t part = reshard::GlooChunkBytes(reshard::GlooOptions{});
  const double pack_bytes = static_cast<double>(c.pack_mib << 20);
  const double e2e_bytes = static_cast<double>(c.e2e_mib << 20);
  const uint64_t steps_per_rank = steps;
  const double step_us = MedianOf(res, "steps") / steps_per_rank * 1e6;
  const double step_raw_us = MedianOf(res, "steps_raw") / steps_per_rank * 1e6;
  const double memcpy_gbps = pack_bytes / MedianOf(res, "memcpy") / 1e9;
  const double pack_gbps = pack_bytes / MedianOf(res, "pack") / 1e9;
  const double unpack_gbps = pack_bytes / MedianOf(res, "unpack") / 1e9;
  const double e2e_gbps = e2e_bytes / MedianOf(res, "e2e") / 1e9;
  const double raw_gbps = e2e_bytes / MedianOf(res, "e2e_raw") / 1e9;
  const double strided_gbps = pack_bytes / MedianOf(res, "pack_plan") / 1e9;
  const double staged_gbps = e2e_bytes / MedianOf(res, "staged") / 1e9;
  const double staged_serial_gbps = e2e_bytes / MedianOf(res, "staged_serial") / 1e9;
  const double staged_raw_gbps = e2e_bytes / MedianOf(res, "staged_raw") / 1e9;

  struct Row {
    std::string metric;
    double reshard, baseline;
    std::string unit, target;
    int pass;  // 1 pass, 0 fail, -1 informational
  };
  char name[160];
  std::vector<Row> rows;
  std::snprintf(name, sizeof name, "a. per-step overhead (%llu steps/rank)", static_cast<unsigned long long>(steps));
  rows.push_back({name, step_us, step_raw_us, "us/step", "< 2 us", step_us < 2.0});
  std::snprintf(name, sizeof name, "b. pack %llu MiB strided bf16 vs memcpy", static_cast<unsigned long long>(c.pack_mib));
  rows.push_back({name, pack_gbps, memcpy_gbps, "GB/s", ">= 50%", pack_gbps >= 0.5 * memcpy_gbps});
  std::snprintf(name, sizeof name, "b. unpack %llu MiB strided bf16 vs memcpy",
                static_cast<unsigned long long>(c.pack_mib));
  rows.push_back({name, unpack_gbps, memcpy_gbps, "GB/s", ">= 50%", unpack_gbps >= 0.5 * memcpy_gbps});
  std::snprintf(name, sizeof name, "c. e2e %llu MiB in %u regions vs raw Gloo", static_cast<unsigned long long>(c.e2e_mib),
                c.e2e_chunks);
  rows.push_back({name, e2e_gbps, raw_gbps, "GB/s", ">= 80%", e2e_gbps >= 0.8 * raw_gbps});
  std::snprintf(name, sizeof name, "   info: pack+send+recv+unpack plan vs raw");
  rows.push_back({name, strided_gbps, raw_gbps, "GB/s", "-", -1});
  std::snprintf(name, sizeof name, "   info: the plan vs raw Gloo in the same parts");
  rows.push_back({name, e2e_gbps, e2e_bytes / MedianOf(res, "e2e_raw_parts") / 1e9, "GB/s", "-", -1});
  std::snprintf(name, sizeof name, "   info: the plan, whole messages, vs raw");
  rows.push_back({name, e2e_bytes / MedianOf(res, "e2e_whole") / 1e9, raw_gbps, "GB/s", "-", -1});
  std::snprintf(name, sizeof name, "d. staged %llu MiB, %u rounds, pipelined vs raw",
                static_cast<unsigned long long>(c.e2e_mib), c.staged_rounds);
  rows.push_back({name, staged_gbps, staged_raw_gbps, "GB/s", ">= 85%", staged_gbps >= 0.85 * staged_raw_gbps});
  std::snprintf(name, sizeof name, "   info: the same in series (RESHARD_PIPELINE=0)");
  rows.push_back({name, staged_serial_gbps, staged_raw_gbps, "GB/s", "-", -1});
  std::snprintf(name, sizeof name, "   info: pipelined vs raw Gloo in the same parts");
  rows.push_back({name, staged_gbps, e2e_bytes / MedianOf(res, "staged_raw_parts") / 1e9, "GB/s", "-", -1});
  std::snprintf(name, sizeof name, "   info: pipelined, whole messages, vs raw");
  rows.push_back({name, e2e_bytes / MedianOf(res, "staged_whole") / 1e9, staged_raw_gbps, "GB/s", "-", -1});
  rows.push_back({"   info: hand-fused per part vs raw", e2e_bytes / MedianOf(res, "staged_fused") / 1e9, staged_raw_gbps, "GB/s", "-", -1});
  // CPU seconds both ranks' processes (every thread, Gloo's I/O loops too)
  // spent per run: on a host whose cores the ranks share, what the staged
  // plan adds to the raw exchange's own work.
  const double staged_cpu = MedianOf(res, "staged_cpu"), raw_cpu = MedianOf(res, "staged_raw_cpu");
  std::snprintf(name, sizeof name, "   info: CPU s per run, staged vs raw (2 ranks)");
  rows.push_back({name, staged_cpu, raw_cpu, "s", "-", -1});

  std::printf("%-46s %10s %10s %8s %7s %8s %s\n", "metric", "reshard", "baseline", "unit", "ratio", "target", "result");
  for (const Row& r : rows) {
    const double ratio = r.baseline > 0 ? r.reshard / r.baseline : 0;
    std::printf("%-46s %10.3f %10.3f %8s %6.0f%% %8s %s\n", r.metric.c_str(), r.reshard, r.baseline, r.unit.c_str(),
                ratio * 100, r.target.c_str(), r.pass < 0 ? "info" : r.pass ? "pass" : "FAIL");
  }
  std::printf("(medians of %d repetitions, 2 ranks over Gloo TCP on 127.0.0.1; baseline of a: the same memcpy's and "
              "exchanges by hand over raw Gloo; reshard cuts messages into parts of %zu bytes, 0: whole)\n",
              c.reps, part);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "runtime_bench: %s\n", e.what());
    return 1;
  }
}
