// Replays one rank's program round by round over a Transport. The same
// executor serves every transport; only the kernels and the transport differ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernels.h"
#include "runtime/pipeline.h"
#include "runtime/plan.h"
#include "runtime/transport.h"

namespace reshard {

/// Traffic of one channel (net, nvlink) over a run.
struct ChannelStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  /// Wall time of the communication phases of rounds that used the channel.
  double seconds = 0;
};

struct RoundStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  /// Bytes written by pack, copy and unpack steps.
  uint64_t bytes_local = 0;
  uint32_t steps = 0;
  double seconds = 0;       // its local phases and its messages (phases may overlap other rounds')
  double comm_seconds = 0;  // from posting its messages until all completed
};

struct RunStats {
  ChannelStats channels[2];  // indexed by fb::Channel
  std::vector<RoundStats> rounds;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t steps = 0;
  double seconds = 0;
};

/// Runs the steps of a checked program (Plan::program). Execution of a round:
/// its pack and copy steps in order, then all its receives posted, then its
/// sends and forwards, all waited for, then its unpack steps in order. Rounds
/// are pipelined where runtime/pipeline.h proves it safe: while round r's
/// messages fly, round r-1's unpacks and round r+1's packs run. Messages of
/// one direction between two ranks are numbered in plan order; the number is
/// the transport's matching tag.
class Executor {
 public:
  Executor(const fb::Program& program, Transport& transport);

  /// `buffers[i]` is the memory bound to program buffer i, `staging` has
  /// program.staging_bytes() bytes, all of it memory of the transport's
  /// kernels (host memory for Gloo, device memory for NCCL). Local steps run
  /// on those kernels; Run returns once they are done. Throws reshard::Error naming the rank,
  /// step, kind and peer of a failed message and the buffers completely
  /// written so far; after a failure the transport must not be reused.
  RunStats Run(const std::vector<char*>& buffers, char* staging);
  /// The pipelined schedule Run follows (RESHARD_PIPELINE=0 turns it off).
  const PipelineSchedule& schedule() const { return schedule_; }
  /// Whether some step writes into program buffer `buffer` (a destination).
  bool writes(uint32_t buffer) const { return buffer < writers_.size() && writers_[buffer] != 0; }

 private:
  struct Round {
    std::vector<uint32_t> local;   // pack and copy steps
    std::vector<uint32_t> comm;    // send, recv, forward
    std::vector<uint32_t> unpack;
  };

  RegionView View(uint32_t region, fb::Dtype wire, const std::vector<char*>& buffers, char* const* staging) const;
  QuantArgs QuantOf(const fb::QuantOp& op, const fb::Step& s, const std::vector<char*>& buffers,
                    char* const* staging) const;
  char* Direct(uint32_t region, const std::vector<char*>& buffers) const;
  // The offset of the buffer(s) a region addresses (Buffer.offset); 0 for staging.
  float OffsetOf(uint32_t region) const;
  void Wrote(uint32_t step, std::vector<uint64_t>& remaining) const;
  std::string WrittenReport(const std::vector<uint64_t>& remaining) const;

  const fb::Program& program_;
  Transport& transport_;
  std::vector<Round> rounds_;
  std::vector<uint64_t> writers_;                // per buffer: steps writing into it
  std::vector<std::vector<uint32_t>> written_;   // per step: buffers it writes
  std::vector<uint64_t> send_seq_, recv_seq_;    // per peer, persist across runs
  std::vector<const fb::QuantOp*> quant_;        // per step: its QuantOp or null
  PipelineSchedule schedule_;
};

}  // namespace reshard
