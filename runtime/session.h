// A rank's side of a refit: bind the weight buffers its program names, then
// replay the program. See README.md, "Python" and "Using it".
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/executor.h"
#include "runtime/plan.h"
#include "runtime/transport.h"

namespace reshard {

class Session {
 public:
  /// Checks the rank's program (Plan::program), that the transport is the
  /// rank's (a transport over every plan rank, rank = plan rank; or over the
  /// active ones only, rank i = plan.active_ranks()[i]), and that every dtype is one the kernels convert; exchanges the
  /// hello with every rank (runtime/hello.h: one plan, distinct ranks; blocks
  /// until every rank has created its session, or the transport's timeout);
  /// allocates exactly
  /// the program's staging_bytes with the transport's kernels (on the device
  /// for NCCL). `plan` and `transport` must outlive the session.
  Session(const Plan& plan, uint32_t global_rank, Transport& transport);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Binds the memory of buffer `name` (rebinding replaces): host memory for
  /// a CPU transport, device memory of the transport's device for NCCL.
  /// Throws reshard::Error for a name the program does not list, a dtype or
  /// shape other than the program's, or memory the kernels cannot reach.
  void bind(const std::string& name, void* ptr, fb::Dtype dtype, std::vector<uint64_t> shape);
  /// The same for buffer `index` of program().buffers() (no name lookup: the
  /// Python binding binds thousands of buffers by an index it has mapped once).
  void bind_index(uint32_t index, void* ptr, fb::Dtype dtype, std::vector<uint64_t> shape);
  /// The memory bound to each buffer of program().buffers() (nullptr: unbound).
  const std::vector<char*>& bound() const { return bound_; }
  /// Replays the program. Throws reshard::Error before any byte moves when a
  /// buffer is unbound, and on a failed or stalled peer (see Executor::Run);
  /// Interrupted on SIGINT/SIGTERM/SIGHUP within an InterruptScope. Any
  /// failure ends the transport's use (Transport::Fail): the peers learn
  /// this rank's reason at once, and a later run on it says it failed.
  /// Throws at once, without touching the transport, when another thread is
  /// running this session.
  RunStats run();
  /// Fails the transport with `why` (this rank's reason, e.g. a check of its
  /// own before run() that failed): every peer learns it at once. Python's
  /// run() calls it when its checks of the bound tensors fail.
  void abort(const std::string& why);

  /// Whether run() is in progress (in any thread).
  bool running() const { return running_; }
  const fb::Program& program() const { return program_; }
  uint32_t rank() const { return rank_; }
  size_t staging_bytes() const { return staging_bytes_; }
  /// Whether the hello proved every rank runs this plan as a distinct rank
  /// (false only for transports that cannot gather: test loopbacks).
  bool proven() const { return proven_; }
  /// Names of the buffers of the program, in program order.
  std::vector<std::string> buffer_names() const;

 private:
  void BindDestination(uint32_t index, uintptr_t start, uint64_t bytes, const std::string& at);

  [[maybe_unused]] const Plan& plan_;
  const fb::Program& program_;
  uint32_t rank_;
  Transport& transport_;
  size_t staging_bytes_;
  Kernels& kernels_;
  char* staging_ = nullptr;  // from kernels_.Allocate
  bool proven_ = false;
  std::unique_ptr<Transport> mapped_;  // plan ranks over a transport of the active ones (runtime/rank_map.h)
  std::vector<char*> bound_;
  Executor executor_;
  // Destination buffers' bound memory by start address (end, buffer): two
  // destinations in one memory would each overwrite the other's weights.
  std::map<uintptr_t, std::pair<uintptr_t, uint32_t>> destinations_;
  std::atomic<bool> running_{false};
};

}  // namespace reshard
