#include "runtime/executor.h"

#include <algorithm>
#include <cstdio>
#include <exception>

#include "runtime/error.h"

namespace reshard {
namespace {

double Seconds(Transport::Clock::time_point a, Transport::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The buffers a (buffer) region addresses, each once.
std::vector<uint32_t> BuffersOf(const fb::Region& r) {
  std::vector<uint32_t> out;
  uint64_t combos = 1, span = 0;
  for (int k = 0; k < r.ndim(); ++k) {
    if (!(r.buffer_modes() & (1u << k))) continue;
    combos *= r.shape()->Get(k);
    span += static_cast<uint64_t>(r.shape()->Get(k) - 1) * r.stride()->Get(k);
  }
  if (combos == 0) return out;
  if (combos > (uint64_t{1} << 16)) {
    for (uint64_t b = r.buffer(); b <= r.buffer() + span; ++b) out.push_back(static_cast<uint32_t>(b));
    return out;
  }
  for (uint64_t c = 0; c < combos; ++c) {
    uint64_t rest = c, b = r.buffer();
    for (int k = r.ndim() - 1; k >= 0; --k) {
      if (!(r.buffer_modes() & (1u << k))) continue;
      b += (rest % r.shape()->Get(k)) * r.stride()->Get(k);
      rest /= r.shape()->Get(k);
    }
    out.push_back(static_cast<uint32_t>(b));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

Executor::Executor(const fb::Program& program, Transport& transport) : program_(program), transport_(transport) {
  const uint32_t nsteps = program.steps() ? program.steps()->size() : 0;
  const auto* rb = program.round_begin();
  if (rb != nullptr) {
    for (uint32_t r = 0; r + 1 < rb->size(); ++r) {
      Round round;
      for (uint32_t i = rb->Get(r); i < rb->Get(r + 1); ++i) {
        switch (program.steps()->Get(i)->kind()) {
          case fb::StepKind::pack:
          case fb::StepKind::copy:
            round.local.push_back(i);
            break;
          case fb::StepKind::unpack:
            round.unpack.push_back(i);
            break;
          default:
            round.comm.push_back(i);
        }
      }
      rounds_.push_back(std::move(round));
    }
  }
  quant_.assign(nsteps, nullptr);
  if (program.quant_ops() != nullptr) {
    for (const fb::QuantOp* op : *program.quant_ops()) quant_[op->step()] = op;
  }
  const uint32_t nbuf = program.buffers() ? program.buffers()->size() : 0;
  writers_.assign(nbuf, 0);
  written_.resize(nsteps);
  for (uint32_t i = 0; i < nsteps; ++i) {
    const fb::Step& s = *program.steps()->Get(i);
    bool writes = s.kind() == fb::StepKind::unpack || s.kind() == fb::StepKind::copy ||
                  (s.kind() == fb::StepKind::recv && s.dst() != kNone);
    // A quantize op also writes the scales it computes (quantize_scaled reads them).
    const fb::QuantOp* op = quant_[i];
    if (op != nullptr && op->kind() == fb::QuantKind::quantize) {
      const fb::Region& r = *program.regions()->Get(op->scale());
      if (r.buffer() != kNone) written_[i] = BuffersOf(r);
    }
    if (writes) {
      const fb::Region& r = *program.regions()->Get(s.dst());
      if (r.buffer() != kNone) {
        std::vector<uint32_t> more = BuffersOf(r);
        written_[i].insert(written_[i].end(), more.begin(), more.end());
      }
    }
    for (uint32_t b : written_[i]) ++writers_[b];
  }
  send_seq_.assign(transport.size(), 0);
  recv_seq_.assign(transport.size(), 0);
}

RegionView Executor::View(uint32_t region, fb::Dtype wire, const std::vector<char*>& buffers,
                          char* const* staging) const {
  const fb::Region& r = *program_.regions()->Get(region);
  if (r.buffer() == kNone) return ViewOf(r, staging, wire);
  // Every buffer a region addresses has one dtype per plan (the compiler emits
  // regions over buffers of one dtype); the first one's is used.
  return ViewOf(r, buffers.data(), program_.buffers()->Get(r.buffer())->dtype());
}

QuantArgs Executor::QuantOf(const fb::QuantOp& op, const fb::Step& s, const std::vector<char*>& buffers,
                           char* const* staging) const {
  QuantArgs a;
  a.kind = op.kind();
  a.src = View(s.src(), s.wire(), buffers, staging);
  a.dst = View(s.dst(), s.wire(), buffers, staging);
  if (op.scale() != kNone) a.scale = View(op.scale(), op.scale_dtype(), buffers, staging);
  for (int k = 0; k < 2; ++k) {
    a.origin[k] = op.origin()->Get(k);
    a.block[k] = op.block()->Get(k);
  }
  return a;
}

char* Executor::Direct(uint32_t region, const std::vector<char*>& buffers) const {
  const fb::Region& r = *program_.regions()->Get(region);
  return buffers[r.buffer()] + r.offset() * DtypeSize(program_.buffers()->Get(r.buffer())->dtype());
}

void Executor::Wrote(uint32_t step, std::vector<uint64_t>& remaining) const {
  for (uint32_t b : written_[step]) --remaining[b];
}

std::string Executor::WrittenReport(const std::vector<uint64_t>& remaining) const {
  std::vector<std::string> done;
  uint64_t dests = 0;
  for (size_t b = 0; b < writers_.size(); ++b) {
    if (writers_[b] == 0) continue;
    ++dests;
    if (remaining[b] != 0) continue;
    std::string quoted = "'";
    quoted += program_.buffers()->Get(b)->name()->str();
    quoted += "'";
    done.push_back(std::move(quoted));
  }
  if (dests == 0) return "this rank has no destination buffers";
  if (done.empty()) return "none of its " + std::to_string(dests) + " destination buffers is completely written";
  std::string s = "destination buffers completely written so far (" + std::to_string(done.size()) + " of " +
                  std::to_string(dests) + "): ";
  constexpr size_t kShow = 8;
  for (size_t i = 0; i < done.size() && i < kShow; ++i) {
    if (i) s += ", ";
    s += done[i];
  }
  if (done.size() > kShow) s += ", ... (" + std::to_string(done.size() - kShow) + " more)";
  return s;
}

RunStats Executor::Run(const std::vector<char*>& buffers, char* staging) {
  using Clock = Transport::Clock;
  RunStats stats;
  char* const staging_base[1] = {staging};
  std::vector<uint64_t> remaining = writers_;
  const std::string at = "rank " + std::to_string(program_.rank()) + ": ";
  Kernels& kernels = transport_.kernels();
  const auto t0 = Clock::now();

  for (size_t r = 0; r < rounds_.size(); ++r) {
    const Round& round = rounds_[r];
    RoundStats rs;
    const auto r0 = Clock::now();
    auto run_local = [&](uint32_t i) {
      const fb::Step& s = *program_.steps()->Get(i);
      // The views hold the address of `at_staging`: a device's Copy reads it
      // before returning, so the array may live in this scope only.
      char* const at_staging[1] = {staging + s.staging()};
      if (quant_[i] != nullptr) {
        // Quant steps address staging through regions (never at s.staging()).
        QuantArgs args = QuantOf(*quant_[i], s, buffers, staging_base);
        rs.bytes_local += ViewElements(args.dst) * DtypeSize(args.dst.dtype);
        try {
          kernels.Quant(args);
        } catch (const std::exception& e) {
          throw Error(at + "step " + std::to_string(i) + " (" + StepKindName(s.kind()) + ") of round " +
                      std::to_string(r) + ": " + e.what());
        }
      } else if (s.kind() == fb::StepKind::pack) {
        RegionView src = View(s.src(), s.wire(), buffers, staging_base);
        kernels.Copy(src, ContiguousView(at_staging, 0, ViewElements(src), s.wire()));
        rs.bytes_local += s.bytes();
      } else if (s.kind() == fb::StepKind::copy) {
        RegionView src = View(s.src(), s.wire(), buffers, staging_base);
        RegionView dst = View(s.dst(), s.wire(), buffers, staging_base);
        kernels.Copy(src, dst);
        rs.bytes_local += ViewElements(dst) * DtypeSize(dst.dtype);
      } else {  // unpack
        RegionView dst = View(s.dst(), s.wire(), buffers, staging_base);
        if (s.src() == kNone) {
          kernels.Copy(ContiguousView(at_staging, 0, ViewElements(dst), s.wire()), dst);
        } else {
          kernels.Copy(View(s.src(), s.wire(), buffers, staging_base), dst);
        }
        rs.bytes_local += ViewElements(dst) * DtypeSize(dst.dtype);
      }
      Wrote(i, remaining);
    };

    for (uint32_t i : round.local) run_local(i);

    if (!round.comm.empty()) {
      const auto c0 = Clock::now();
      bool used[2] = {false, false};
      transport_.reset();
      std::vector<size_t> handles;
      handles.reserve(round.comm.size());
      // A message that cannot be posted or completed ends the run with the
      // step, its peer and what is already in place.
      auto fail = [&](uint32_t i, const std::exception& e) {
        const fb::Step& s = *program_.steps()->Get(i);
        const bool in = s.kind() == fb::StepKind::recv;
        transport_.reset();
        return Error(at + "step " + std::to_string(i) + " (" + StepKindName(s.kind()) + ") of round " +
                     std::to_string(r) + (in ? " from" : " to") + " peer " + std::to_string(s.peer()) + " failed: " +
                     e.what() + "; " + WrittenReport(remaining));
      };
      for (uint32_t i : round.comm) {
        const fb::Step& s = *program_.steps()->Get(i);
        const uint32_t peer = s.peer();
        const size_t bytes = s.bytes();
        used[static_cast<int>(s.channel())] = true;
        ChannelStats& ch = stats.channels[static_cast<int>(s.channel())];
        const int channel = static_cast<int>(s.channel());
        if (s.kind() == fb::StepKind::recv) {
          char* dst = s.dst() == kNone ? staging + s.staging() : Direct(s.dst(), buffers);
          try {
            handles.push_back(transport_.post(false, channel, peer, recv_seq_[peer]++, dst, bytes));
          } catch (const std::exception& e) {
            throw fail(i, e);
          }
          rs.bytes_received += bytes;
          ch.bytes_received += bytes;
        } else {
          char* src =
              (s.kind() == fb::StepKind::send && s.src() != kNone) ? Direct(s.src(), buffers) : staging + s.staging();
          try {
            handles.push_back(transport_.post(true, channel, peer, send_seq_[peer]++, src, bytes));
          } catch (const std::exception& e) {
            throw fail(i, e);
          }
          rs.bytes_sent += bytes;
          ch.bytes_sent += bytes;
        }
      }
      // NCCL posts the round as one group here; a failure to start is the
      // round's, reported at its first message.
      try {
        transport_.start();
      } catch (const std::exception& e) {
        throw fail(round.comm.front(), e);
      }
      // One deadline for the whole round: a peer that stalls is reported once
      // the round has waited `timeout` for it, whichever message it is.
      const auto deadline = Clock::now() + transport_.timeout();
      for (size_t h = 0; h < handles.size(); ++h) {
        const uint32_t i = round.comm[h];
        try {
          transport_.wait(handles[h], deadline);
        } catch (const std::exception& e) {
          throw fail(i, e);
        }
        Wrote(i, remaining);
      }
      transport_.reset();
      const auto c1 = Clock::now();
      rs.comm_seconds = Seconds(c0, c1);
      for (int c = 0; c < 2; ++c) {
        if (used[c]) stats.channels[c].seconds += rs.comm_seconds;
      }
    }

    for (uint32_t i : round.unpack) run_local(i);

    rs.steps = static_cast<uint32_t>(round.local.size() + round.comm.size() + round.unpack.size());
    rs.seconds = Seconds(r0, Clock::now());
    stats.bytes_sent += rs.bytes_sent;
    stats.bytes_received += rs.bytes_received;
    stats.steps += rs.steps;
    stats.rounds.push_back(rs);
  }
  // Device kernels run asynchronously: the run is over when its last unpack is.
  try {
    kernels.Finish();
  } catch (const std::exception& e) {
    throw Error(at + "the local steps on " + kernels.name() + " failed: " + e.what());
  }
  stats.seconds = Seconds(t0, Clock::now());
  return stats;
}

}  // namespace reshard
