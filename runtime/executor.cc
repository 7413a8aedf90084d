#include "runtime/executor.h"

#include <algorithm>
#include <cstdio>
#include <exception>

#include "runtime/error.h"
#include "runtime/pipeline.h"

namespace reshard {
namespace {

double Seconds(Transport::Clock::time_point a, Transport::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
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
      if (r.buffer() != kNone) written_[i] = RegionBuffers(r);
    }
    if (writes) {
      const fb::Region& r = *program.regions()->Get(s.dst());
      if (r.buffer() != kNone) {
        std::vector<uint32_t> more = RegionBuffers(r);
        written_[i].insert(written_[i].end(), more.begin(), more.end());
      }
    }
    for (uint32_t b : written_[i]) ++writers_[b];
  }
  schedule_ = SchedulePipeline(program, PipelineEnabled());
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

float Executor::OffsetOf(uint32_t region) const {
  if (region == kNone) return 0;
  const fb::Region& r = *program_.regions()->Get(region);
  return r.buffer() == kNone ? 0 : program_.buffers()->Get(r.buffer())->offset();
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
  const size_t nrounds = rounds_.size();
  stats.rounds.resize(nrounds);

  auto run_local = [&](size_t r, uint32_t i) {
    RoundStats& rs = stats.rounds[r];
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
    } else {
      // A buffer that holds offset values is read and written through the
      // model's values (plan_check: one offset across a region's buffers).
      Offsets o;
      o.wire = s.wire();
      if (s.kind() != fb::StepKind::unpack) o.from = OffsetOf(s.src());
      if (s.kind() != fb::StepKind::pack) o.to = OffsetOf(s.dst());
      auto copy = [&](const RegionView& src, const RegionView& dst) {
        if (o.from != 0 || o.to != 0) {
          kernels.Transform(src, dst, o);
        } else {
          kernels.Copy(src, dst);
        }
      };
      if (s.kind() == fb::StepKind::pack) {
        RegionView src = View(s.src(), s.wire(), buffers, staging_base);
        copy(src, ContiguousView(at_staging, 0, ViewElements(src), s.wire()));
        rs.bytes_local += s.bytes();
      } else if (s.kind() == fb::StepKind::copy) {
        RegionView src = View(s.src(), s.wire(), buffers, staging_base);
        RegionView dst = View(s.dst(), s.wire(), buffers, staging_base);
        copy(src, dst);
        rs.bytes_local += ViewElements(dst) * DtypeSize(dst.dtype);
      } else {  // unpack
        RegionView dst = View(s.dst(), s.wire(), buffers, staging_base);
        if (s.src() == kNone) {
          copy(ContiguousView(at_staging, 0, ViewElements(dst), s.wire()), dst);
        } else {
          copy(View(s.src(), s.wire(), buffers, staging_base), dst);
        }
        rs.bytes_local += ViewElements(dst) * DtypeSize(dst.dtype);
      }
    }
    Wrote(i, remaining);
  };
  auto local_phase = [&](size_t r, const std::vector<uint32_t>& steps) {
    const auto l0 = Clock::now();
    for (uint32_t i : steps) run_local(r, i);
    stats.rounds[r].seconds += Seconds(l0, Clock::now());
  };

  // The round whose messages are in flight.
  struct Flight {
    size_t round = 0;
    std::vector<uint32_t> order;  // steps in posting order: receives, then sends
    std::vector<size_t> handles;
    Clock::time_point c0, deadline;
    bool used[2] = {false, false};
  };
  // A message that cannot be posted or completed ends the run with the step,
  // its peer and what is already in place.
  auto fail = [&](size_t r, uint32_t i, const std::exception& e) {
    const fb::Step& s = *program_.steps()->Get(i);
    const bool in = s.kind() == fb::StepKind::recv;
    transport_.reset();
    return Error(at + "step " + std::to_string(i) + " (" + StepKindName(s.kind()) + ") of round " + std::to_string(r) +
                 (in ? " from" : " to") + " peer " + std::to_string(s.peer()) + " failed: " + e.what() + "; " +
                 WrittenReport(remaining));
  };
  auto post = [&](size_t r, Flight& f) {
    const Round& round = rounds_[r];
    RoundStats& rs = stats.rounds[r];
    f.round = r;
    f.c0 = Clock::now();
    transport_.reset();
    f.order.clear();
    f.handles.clear();
    f.handles.reserve(round.comm.size());
    // Receives first: Gloo sends a message's data only once its receiver has
    // said it is ready, and that signal queues behind the receiver's own
    // outgoing data to the same peer; posted after a large send, it would
    // make the two directions take turns. Messages of one direction keep plan
    // order (their sequence numbers).
    for (int pass = 0; pass < 2; ++pass) {
      for (uint32_t i : round.comm) {
        const fb::Step& s = *program_.steps()->Get(i);
        const bool is_recv = s.kind() == fb::StepKind::recv;
        if (is_recv != (pass == 0)) continue;
        const uint32_t peer = s.peer();
        const size_t bytes = s.bytes();
        const int channel = static_cast<int>(s.channel());
        f.used[channel] = true;
        ChannelStats& ch = stats.channels[channel];
        try {
          if (is_recv) {
            char* dst = s.dst() == kNone ? staging + s.staging() : Direct(s.dst(), buffers);
            f.handles.push_back(transport_.post(false, channel, peer, recv_seq_[peer]++, dst, bytes));
            rs.bytes_received += bytes;
            ch.bytes_received += bytes;
          } else {
            char* src = (s.kind() == fb::StepKind::send && s.src() != kNone) ? Direct(s.src(), buffers)
                                                                             : staging + s.staging();
            f.handles.push_back(transport_.post(true, channel, peer, send_seq_[peer]++, src, bytes));
            rs.bytes_sent += bytes;
            ch.bytes_sent += bytes;
          }
        } catch (const std::exception& e) {
          throw fail(r, i, e);
        }
        f.order.push_back(i);
      }
    }
    // NCCL posts the round as one group here; a failure to start is the
    // round's, reported at its first message.
    try {
      transport_.start();
    } catch (const std::exception& e) {
      throw fail(r, f.order.front(), e);
    }
    // One deadline for the whole round: a peer that stalls is reported once
    // the round has waited `timeout` for it, whichever message it is.
    f.deadline = Clock::now() + transport_.timeout();
  };
  auto land = [&](Flight& f) {
    for (size_t h = 0; h < f.handles.size(); ++h) {
      try {
        transport_.wait(f.handles[h], f.deadline);
      } catch (const std::exception& e) {
        throw fail(f.round, f.order[h], e);
      }
      Wrote(f.order[h], remaining);
    }
    transport_.reset();
    RoundStats& rs = stats.rounds[f.round];
    rs.comm_seconds = Seconds(f.c0, Clock::now());
    rs.seconds += rs.comm_seconds;
    for (int c = 0; c < 2; ++c) {
      if (f.used[c]) stats.channels[c].seconds += rs.comm_seconds;
    }
  };

  // Round r: [pack r unless packed early] post r | unpack r-1 (late),
  // pack r+1 (early) | wait r | [unpack r unless late].
  std::vector<uint8_t> packed(nrounds, 0);
  for (size_t r = 0; r < nrounds; ++r) {
    const Round& round = rounds_[r];
    if (!packed[r]) local_phase(r, round.local);
    const bool late_prev = r > 0 && schedule_.late_unpack[r - 1];
    const bool early_next = r + 1 < nrounds && schedule_.early_pack[r + 1];
    if (round.comm.empty()) {
      if (late_prev) local_phase(r - 1, rounds_[r - 1].unpack);
    } else {
      Flight f;
      post(r, f);
      if (late_prev) local_phase(r - 1, rounds_[r - 1].unpack);
      if (early_next) {
        local_phase(r + 1, rounds_[r + 1].local);
        packed[r + 1] = 1;
      }
      land(f);
    }
    if (early_next && !packed[r + 1]) {  // no messages to overlap: in order
      local_phase(r + 1, rounds_[r + 1].local);
      packed[r + 1] = 1;
    }
    const bool late = r + 1 < nrounds && schedule_.late_unpack[r];
    if (!late) local_phase(r, round.unpack);
  }
  for (size_t r = 0; r < nrounds; ++r) {
    RoundStats& rs = stats.rounds[r];
    const Round& round = rounds_[r];
    rs.steps = static_cast<uint32_t>(round.local.size() + round.comm.size() + round.unpack.size());
    stats.bytes_sent += rs.bytes_sent;
    stats.bytes_received += rs.bytes_received;
    stats.steps += rs.steps;
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
