#include "tests/fuzz/replay.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "compiler/validate.h"
#include "runtime/error.h"
#include "runtime/session.h"
#include "runtime/synthetic.h"
#include "runtime/transport.h"

namespace reshard::fuzz {
namespace {

// A rank alone: a send reads its bytes, a receive writes a pattern into its
// bytes; every message completes at once.
class SinkTransport : public Transport {
 public:
  SinkTransport(uint32_t rank, uint32_t size) : rank_(rank), size_(size) {}
  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1000); }
  size_t post_send(uint32_t, uint64_t, const void* data, size_t bytes) override {
    scratch_.resize(bytes);
    if (bytes) std::memcpy(scratch_.data(), data, bytes);
    return posted_++;
  }
  size_t post_recv(uint32_t, uint64_t seq, void* data, size_t bytes) override {
    if (bytes) std::memset(data, static_cast<int>(seq & 0x3f), bytes);
    return posted_++;
  }
  void wait(size_t, Clock::time_point) override {}
  void reset() override { posted_ = 0; }
  // Alone, there is no rank to say hello to: the session proves nothing at connect.
  bool allgather(const void*, size_t, void*, Clock::time_point) override { return false; }

 private:
  uint32_t rank_, size_;
  size_t posted_ = 0;
  std::vector<char> scratch_;
};

bool Fits(const fb::Program& p) {
  // The synthetic fill and check compute every fragment element's reference
  // value: at most kReplayElements of them per rank.
  uint64_t elements = 0;
  for (uint32_t f = 0; p.fragments() && f < p.fragments()->size(); ++f) {
    const fb::Fragment& frag = *p.fragments()->Get(f);
    uint64_t n = 1;
    for (int d = 0; d < frag.ndim(); ++d) n *= frag.hi()->Get(d) - frag.lo()->Get(d);  // checked: <= buffer elements
    elements += n;
    if (elements > kReplayElements) return false;
  }
  uint64_t total = p.staging_bytes();
  if (total > kReplayBytes) return false;
  for (uint32_t b = 0; p.buffers() && b < p.buffers()->size(); ++b) {
    const fb::Buffer& buf = *p.buffers()->Get(b);
    total += BufferElements(buf) * DtypeSize(buf.dtype());  // checked: < 2^62
    if (total > kReplayBytes) return false;
  }
  return true;
}

// The reference value of a quantized element takes its block's amax: a scan
// of the whole block (once per block). Blocks of more than kReplayElements
// (clipped to their tensor) would take minutes under ASan (a fuzz finding:
// an 85 s unit); such plans are opened, checked and validated, not replayed.
bool ScaleBlocksFit(const fb::Plan& plan) {
  const uint32_t n = plan.tensors() ? plan.tensors()->size() : 0;
  for (uint32_t k = 0; k < n; ++k) {
    const fb::Tensor& s = *plan.tensors()->Get(k);
    if (s.scale_of() < 0) continue;
    const fb::Tensor& t = *plan.tensors()->Get(static_cast<uint32_t>(s.scale_of()));  // checked at open
    uint64_t elements = 1;
    for (uint32_t d = 0; d < s.block()->size(); ++d) {
      elements *= std::min<uint64_t>(s.block()->Get(d), t.hi()->Get(d) - t.lo()->Get(d));
      if (elements > kReplayElements) return false;
    }
  }
  return true;
}

}  // namespace

bool CheckAllRanks(const Plan& plan) {
  try {
    for (uint32_t r = 0; r < plan.num_ranks(); ++r) plan.program(r);
  } catch (const Error&) {
    return false;
  }
  return true;
}

size_t Validate(const Plan& plan) {
  return ValidatePlan(plan.root(), [&](uint32_t r) -> const fb::Program& { return plan.program(r); }).total_errors;
}

bool ReplayAll(const Plan& plan) {
  bool clean = true;
  if (!ScaleBlocksFit(plan.root())) return clean;
  for (uint32_t r = 0; r < plan.num_ranks(); ++r) {
    if (!Fits(plan.program(r))) continue;
    try {
      SinkTransport transport(r, plan.num_ranks());
      Session session(plan, r, transport);
      const fb::Program& program = session.program();
      const uint32_t nbuf = program.buffers() ? program.buffers()->size() : 0;
      std::vector<std::unique_ptr<char[]>> memory;
      std::vector<char*> ptrs;
      for (uint32_t b = 0; b < nbuf; ++b) {
        const fb::Buffer& buf = *program.buffers()->Get(b);
        const size_t bytes = BufferElements(buf) * DtypeSize(buf.dtype());
        memory.emplace_back(new char[bytes]);  // exactly `bytes`: ASan's redzone starts at the end
        ptrs.push_back(memory.back().get());
        session.bind(buf.name()->str(), ptrs.back(), buf.dtype(),
                     std::vector<uint64_t>(buf.shape()->begin(), buf.shape()->end()));
      }
      PoisonDestinations(program, ptrs);
      FillSources(plan, program, ptrs);
      session.run();
      CheckDestinations(plan, program, ptrs);
    } catch (const Error&) {
      clean = false;
    }
  }
  return clean;
}

}  // namespace reshard::fuzz
