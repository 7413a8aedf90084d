#include "runtime/cuda/nccl_transport.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "runtime/cuda/check.h"
#include "runtime/cuda/comm_check.h"
#include "runtime/error.h"

namespace reshard {
namespace {

std::string SecondsString(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms.count() / 1000.0);
  return buf;
}

std::string Bytes(const char* verb, size_t bytes) { return std::string(verb) + " " + std::to_string(bytes) + " bytes"; }

// Between two polls of a message's completion: spin (yield) for the first
// kSpin of a wait, so that a round the GPU finishes in microseconds is seen
// without a sleep's delay (a short Linux sleep lasts several times what it
// asks), then sleep 20 us, which a round long enough to get there hardly
// notices.
using Clock = Transport::Clock;
constexpr auto kSpin = std::chrono::milliseconds(2);
void Pause(Clock::time_point since) {
  if (Clock::now() - since < kSpin) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// The rank, size and device of a communicator the caller handed over, `which`
// ("net", "nvlink") naming it. CheckCommPointer first refuses what cannot be
// a communicator of this process (null, unmapped, misaligned), which NCCL
// would dereference and fault on; a mapped pointer to something else gets
// past it and is refused by NCCL's own CommCheck (startMagic and endMagic
// against NCCL_MAGIC) as an invalid argument, said here in the same terms.
struct CommInfo {
  int nranks = 0, rank = 0, device = 0;
};
CommInfo QueryComm(ncclComm_t comm, const char* which) {
  cuda::CheckCommPointer(comm, which);
  CommInfo info;
  const auto query = [&](ncclResult_t r, const char* call) {
    if (r == ncclSuccess) return;
    char at[32];
    std::snprintf(at, sizeof at, "%p", static_cast<void*>(comm));
    std::string said = ncclGetErrorString(r);
    const char* last = ncclGetLastError(nullptr);
    if (last != nullptr && *last != '\0') said += std::string(" (") + last + ")";
    // CommCheck's verdict on a pointer to something else ("corrupted comm
    // object detected").
    if (r == ncclInvalidArgument) {
      throw Error(std::string("the ") + which + " communicator " + at + " is not an NCCL communicator: " + call +
                  " says " + said + " " + cuda::kExpectedComm);
    }
    throw Error(std::string("nccl: ") + call + " on the " + which + " communicator " + at + " failed: " + said);
  };
  query(ncclCommCount(comm, &info.nranks), "ncclCommCount");
  query(ncclCommUserRank(comm, &info.rank), "ncclCommUserRank");
  query(ncclCommCuDevice(comm, &info.device), "ncclCommCuDevice");
  if (info.nranks < 1 || info.rank < 0 || info.rank >= info.nranks || info.device < 0) {
    throw Error(std::string("nccl: the ") + which + " communicator says it is rank " + std::to_string(info.rank) +
                " of " + std::to_string(info.nranks) + " on cuda:" + std::to_string(info.device) +
                ", which cannot be: is it an initialized communicator?");
  }
  return info;
}

}  // namespace

NcclTransport::NcclTransport(const NcclOptions& options)
    : owns_comms_(options.owns_comms), timeout_(options.timeout) {
  const CommInfo net = QueryComm(options.net, "net");
  comm_[0] = options.net;
  const int nranks = net.nranks, rank = net.rank, device = net.device;
  if (options.nvlink != nullptr && options.nvlink != options.net) {
    const CommInfo nvlink = QueryComm(options.nvlink, "nvlink");
    const int n = nvlink.nranks, r = nvlink.rank, d = nvlink.device;
    if (n != nranks || r != rank || d != device) {
      throw Error("nccl: the nvlink communicator is rank " + std::to_string(r) + " of " + std::to_string(n) +
                  " on cuda:" + std::to_string(d) + ", the net one rank " + std::to_string(rank) + " of " +
                  std::to_string(nranks) + " on cuda:" + std::to_string(device));
    }
    comm_[1] = options.nvlink;
    lanes_ = 2;
  }
  device_ = device;
  rank_ = static_cast<uint32_t>(rank);
  size_ = static_cast<uint32_t>(nranks);
  if (options.loopback_size > 0) {
    if (nranks != 1) {
      throw Error("nccl: loopback needs one-rank communicators, the net one has " + std::to_string(nranks) + " ranks");
    }
    loopback_ = true;
    rank_ = options.loopback_rank;
    size_ = options.loopback_size;
  }
  cuda::DeviceGuard guard(device_);
  stream_ = options.stream;
  if (stream_ == nullptr) {
    RESHARD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    owns_stream_ = true;
  }
  for (int l = 0; l < lanes_; ++l) {
    RESHARD_CUDA_CHECK(cudaStreamCreateWithFlags(&lane_stream_[l], cudaStreamNonBlocking));
    RESHARD_CUDA_CHECK(cudaEventCreateWithFlags(&done_[l], cudaEventDisableTiming));
  }
  RESHARD_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  kernels_ = cuda::DeviceKernels(device_, stream_);
}

std::unique_ptr<NcclTransport> NcclTransport::Loopback(int device, uint32_t rank, uint32_t size,
                                                       std::chrono::milliseconds timeout, bool blocking) {
  cuda::DeviceGuard guard(device);
  ncclComm_t comms[2] = {nullptr, nullptr};
  for (ncclComm_t& comm : comms) {
    ncclUniqueId id;
    RESHARD_NCCL_CHECK(ncclGetUniqueId(&id));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = blocking ? 1 : 0;
    RESHARD_NCCL_CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &config));
    ncclResult_t state = ncclInProgress;
    const auto deadline = Clock::now() + timeout;
    while (state == ncclInProgress) {
      RESHARD_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
      if (state == ncclInProgress && Clock::now() > deadline) {
        ncclCommAbort(comm);
        throw Error("nccl: a one-rank communicator did not initialize within " + SecondsString(timeout));
      }
      if (state == ncclInProgress) std::this_thread::yield();
    }
    RESHARD_NCCL_CHECK(state);
  }
  NcclOptions options;
  options.net = comms[0];
  options.nvlink = comms[1];
  options.timeout = timeout;
  options.owns_comms = true;
  options.loopback_size = size;
  options.loopback_rank = rank;
  return std::make_unique<NcclTransport>(options);
}

NcclTransport::~NcclTransport() {
  int old = -1;
  cudaGetDevice(&old);
  cudaSetDevice(device_);
  if (owns_comms_ && !aborted_) {
    for (int l = 0; l < lanes_; ++l) {
      // Finalize flushes what is in flight; a non-blocking communicator
      // finishes it in the background, polled here.
      if (ncclCommFinalize(comm_[l]) == ncclInProgress) {
        ncclResult_t state = ncclInProgress;
        const auto deadline = Clock::now() + timeout_;
        while (state == ncclInProgress && Clock::now() < deadline) {
          if (ncclCommGetAsyncError(comm_[l], &state) != ncclSuccess) break;
          std::this_thread::yield();
        }
        if (state == ncclInProgress) {
          ncclCommAbort(comm_[l]);
          continue;
        }
      }
      ncclCommDestroy(comm_[l]);
    }
  }
  for (int l = 0; l < lanes_; ++l) {
    if (done_[l]) cudaEventDestroy(done_[l]);
    if (lane_stream_[l]) cudaStreamDestroy(lane_stream_[l]);
  }
  if (ready_) cudaEventDestroy(ready_);
  if (owns_stream_ && stream_) cudaStreamDestroy(stream_);
  cudaSetDevice(old);
}

size_t NcclTransport::post_send(uint32_t peer, uint64_t seq, const void* data, size_t bytes) {
  return post(true, 0, peer, seq, const_cast<void*>(data), bytes);
}

size_t NcclTransport::post_recv(uint32_t peer, uint64_t seq, void* data, size_t bytes) {
  return post(false, 0, peer, seq, data, bytes);
}

size_t NcclTransport::post(bool send, int channel, uint32_t peer, uint64_t seq, void* data, size_t bytes) {
  if (aborted_) throw Error(abort_reason_);
  if (peer >= size_) {
    throw Error("nccl: peer " + std::to_string(peer) + " out of range for " + std::to_string(size_) + " ranks");
  }
  // NCCL matches the point-to-point calls of a pair of ranks in the order
  // posted, on each communicator: the plan orders both sides alike, so `seq`
  // needs no tag.
  Op op{send, channel == 1 && lanes_ == 2 ? 1 : 0, loopback_ ? 0 : static_cast<int>(peer), data, bytes};
  ops_.push_back(op);
  return ops_.size() - 1;
}

void NcclTransport::Abort() noexcept {
  if (aborted_) return;
  aborted_ = true;
  for (int l = 0; l < lanes_; ++l) ncclCommAbort(comm_[l]);
  if (abort_reason_.empty()) abort_reason_ = "nccl: the communicators were aborted after an earlier failure";
}

void NcclTransport::CheckAsync(const std::string& doing) {
  for (int l = 0; l < lanes_; ++l) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_[l], &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
      std::string msg = std::string("nccl: ") + ncclGetErrorString(state);
      const char* last = ncclGetLastError(comm_[l]);
      if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
      msg += " while " + doing + "; the communicators were aborted";
      Abort();
      throw Error(msg);
    }
  }
}

void NcclTransport::Settle(Clock::time_point deadline, const std::string& doing, const std::string& timed_out) {
  const auto since = Clock::now();
  for (;;) {
    bool busy = false;
    for (int l = 0; l < lanes_; ++l) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_[l], &state) == ncclSuccess && state == ncclInProgress) busy = true;
    }
    CheckAsync(doing);
    if (!busy) return;
    if (Clock::now() >= deadline) {
      Abort();
      if (!timed_out.empty()) throw Error(timed_out + "; the communicators were aborted");
      throw Error("timed out after " + SecondsString(timeout_) + " " + doing + "; the communicators were aborted");
    }
    Pause(since);
  }
}

void NcclTransport::start() {
  if (aborted_) throw Error(abort_reason_);
  if (started_ || ops_.empty()) return;
  cuda::DeviceGuard guard(device_);
  bool used[2] = {false, false};
  for (const Op& op : ops_) used[op.lane] = true;
  // The round's packs ran on the caller's stream: the channels start after them.
  RESHARD_CUDA_CHECK(cudaEventRecord(ready_, stream_));
  for (int l = 0; l < lanes_; ++l) {
    if (used[l]) RESHARD_CUDA_CHECK(cudaStreamWaitEvent(lane_stream_[l], ready_, 0));
  }
  const std::string doing = "posting the round's " + std::to_string(ops_.size()) + " messages";
  RESHARD_NCCL_CHECK(ncclGroupStart());
  try {
    for (const Op& op : ops_) {
      if (op.bytes == 0) continue;  // both sides skip empty messages alike
      if (op.send) {
        RESHARD_NCCL_CHECK(ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm_[op.lane], lane_stream_[op.lane]));
      } else {
        RESHARD_NCCL_CHECK(ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm_[op.lane], lane_stream_[op.lane]));
      }
    }
  } catch (...) {
    ncclGroupEnd();  // a group left open would capture every later NCCL call
    Abort();
    throw;
  }
  try {
    RESHARD_NCCL_CHECK(ncclGroupEnd());
  } catch (...) {
    Abort();
    throw;
  }
  // Non-blocking communicators may still be posting (ncclInProgress); no
  // other call may touch them or their streams until that is over.
  Settle(Clock::now() + timeout_, doing);
  for (int l = 0; l < lanes_; ++l) {
    if (!used[l]) continue;
    // The round's unpacks run after its messages: the executor enqueues them
    // only once wait() has seen this event complete. The kernel stream does
    // not wait for it, so that the next round's packs and the previous
    // round's unpacks (runtime/pipeline.h) overlap these messages.
    RESHARD_CUDA_CHECK(cudaEventRecord(done_[l], lane_stream_[l]));
  }
  started_ = true;
}

void NcclTransport::wait(size_t handle, Clock::time_point deadline) {
  if (!started_) start();
  const Op& op = ops_.at(handle);
  if (lane_done_[op.lane] || op.bytes == 0) return;
  const std::string what = op.send ? Bytes("sending", op.bytes) : Bytes("receiving", op.bytes);
  const auto since = Clock::now();
  for (;;) {
    const cudaError_t q = cudaEventQuery(done_[op.lane]);
    if (q == cudaSuccess) {
      lane_done_[op.lane] = true;
      return;
    }
    if (q != cudaErrorNotReady) {
      Abort();
      cuda::FailCuda(q, "cudaEventQuery(done)", __FILE__, __LINE__);
    }
    CheckAsync(what);
    if (Clock::now() >= deadline) {
      Abort();
      // The whole group completes together: NCCL cannot say which peer of
      // the round stalled; the executor names this message's.
      throw Error("timed out after " + SecondsString(timeout_) + " " + what + "; the communicators were aborted");
    }
    Pause(since);
  }
}

namespace {

// The device buffer of allgather() and the event it waits on, released on
// every path. The buffer is stream-ordered (cudaMallocAsync/cudaFreeAsync on
// the stream the all-gather runs on), so freeing it right after a failure is
// safe even while the all-gather is still queued: the free waits for it.
struct GatherScratch {
  explicit GatherScratch(cudaStream_t s) : stream(s) {}
  ~GatherScratch() {
    if (buffer != nullptr) {
      if (async) {
        cudaFreeAsync(buffer, stream);
      } else {
        // After a failure the communicators are aborted, which ends NCCL's
        // kernel: cudaFree's implicit synchronization returns.
        cudaFree(buffer);
      }
    }
    if (event != nullptr) cudaEventDestroy(event);
  }
  GatherScratch(const GatherScratch&) = delete;
  GatherScratch& operator=(const GatherScratch&) = delete;

  cudaStream_t stream;
  char* buffer = nullptr;
  bool async = true;
  cudaEvent_t event = nullptr;
};

}  // namespace

bool NcclTransport::allgather(const void* mine, size_t bytes, void* all, Clock::time_point deadline) {
  // One process presented as a rank of many: there are no other processes to
  // hear from, and the one-rank communicators could not gather them anyway.
  if (loopback_) return false;
  if (aborted_) throw Error(abort_reason_);
  char* out = static_cast<char*>(all);
  std::memcpy(out + size_t{rank_} * bytes, mine, bytes);
  // A one-rank job goes through NCCL too, so that one GPU can test this path.
  if (bytes == 0) return true;
  using std::chrono::milliseconds;
  const auto budget = std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  const std::string what = "ncclAllGather of " + std::to_string(bytes) + " bytes a rank on the net communicator";
  const std::string doing = "gathering every rank's hello (" + what + ")";
  // NCCL completes a collective for all ranks or none: it cannot say which
  // rank is missing, where the default's messages to every peer could.
  const std::string missing = "no hello from every rank within " + SecondsString(budget) +
                              ": the all-gather of the plan digests (" + what +
                              ") did not complete; a rank that has not started its session, or is stuck before it, "
                              "holds up every rank";
  cuda::DeviceGuard guard(device_);
  // The net channel's stream, idle between rounds: not the caller's stream,
  // whose queued work would delay the hello (and count against its deadline).
  GatherScratch scratch(lane_stream_[0]);
  const cudaStream_t s = scratch.stream;
  const size_t total = size_t{size_} * bytes;
  void* p = nullptr;
  cudaError_t e = cudaMallocAsync(&p, total, s);
  if (e == cudaErrorNotSupported) {  // a device without memory pools
    cudaGetLastError();
    scratch.async = false;
    e = cudaMalloc(&p, total);
  }
  RESHARD_CUDA_CHECK(e);
  scratch.buffer = static_cast<char*>(p);
  RESHARD_CUDA_CHECK(cudaEventCreateWithFlags(&scratch.event, cudaEventDisableTiming));
  char* slot = scratch.buffer + size_t{rank_} * bytes;
  RESHARD_CUDA_CHECK(cudaMemcpyAsync(slot, mine, bytes, cudaMemcpyHostToDevice, s));
  // In place: rank r's bytes already sit at buffer + r * bytes.
  try {
    RESHARD_NCCL_CHECK(ncclAllGather(slot, scratch.buffer, bytes, ncclUint8, comm_[0], s));
  } catch (...) {
    Abort();
    throw;
  }
  // A non-blocking communicator may still be setting up the collective's
  // connections (ncclInProgress), which waits for every rank.
  Settle(deadline, doing, missing);
  RESHARD_CUDA_CHECK(cudaEventRecord(scratch.event, s));
  const auto since = Clock::now();
  for (;;) {
    const cudaError_t q = cudaEventQuery(scratch.event);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) {
      Abort();
      cuda::FailCuda(q, "cudaEventQuery(all-gather)", __FILE__, __LINE__);
    }
    CheckAsync(doing);
    if (Clock::now() >= deadline) {
      Abort();
      throw Error(missing + "; the communicators were aborted");
    }
    Pause(since);
  }
  // Only now: a copy to pageable host memory returns only once complete, so
  // queued behind the all-gather it would wait past the deadline.
  RESHARD_CUDA_CHECK(cudaMemcpyAsync(out, scratch.buffer, total, cudaMemcpyDeviceToHost, s));
  RESHARD_CUDA_CHECK(cudaStreamSynchronize(s));
  return true;
}

void NcclTransport::reset() {
  ops_.clear();
  started_ = false;
  lane_done_[0] = lane_done_[1] = false;
}

}  // namespace reshard
