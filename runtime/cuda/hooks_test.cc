// CPU tests of what the GPU path adds to the executor and session: staging
// from the transport's kernels (exactly the plan's size), local steps through
// Kernels::Copy and one Finish per run, bind checking memory with the
// kernels, channels reaching the transport, one start() per round. The
// loopback plan the GPU test replays runs here through a CPU loopback.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "runtime/cuda/loopback_plan.h"
#include "runtime/error.h"
#include "runtime/session.h"
#include "runtime/synthetic.h"

namespace reshard {
namespace {

// CPU kernels that count what the executor asks of them.
class CountingKernels : public Kernels {
 public:
  std::string name() const override { return "counting"; }
  char* Allocate(size_t bytes) override {
    allocated.push_back(bytes);
    return CpuKernels().Allocate(bytes);
  }
  void Release(char* p) noexcept override {
    ++released;
    CpuKernels().Release(p);
  }
  void CheckMemory(const void* p, size_t bytes, const std::string& what) const override {
    if (refused.count(p)) throw Error(what + " is not memory of " + name());
  }
  void Copy(const RegionView& src, const RegionView& dst) override {
    ++copies;
    CopyRegion(src, dst);
  }
  void Finish() override { ++finishes; }

  std::vector<size_t> allocated;
  int released = 0, copies = 0, finishes = 0;
  std::set<const void*> refused;
};

// Every message goes back to this rank: at start() the k-th send of a
// channel lands in the k-th receive of that channel.
class LoopbackTransport : public Transport {
 public:
  LoopbackTransport(uint32_t rank, uint32_t size, Kernels& kernels) : rank_(rank), size_(size), kernels_(kernels) {}
  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1000); }
  size_t post_send(uint32_t peer, uint64_t seq, const void* data, size_t bytes) override {
    return post(true, 0, peer, seq, const_cast<void*>(data), bytes);
  }
  size_t post_recv(uint32_t peer, uint64_t seq, void* data, size_t bytes) override {
    return post(false, 0, peer, seq, data, bytes);
  }
  size_t post(bool send, int channel, uint32_t peer, uint64_t seq, void* data, size_t bytes) override {
    ops_.push_back({send, channel, data, bytes});
    ++posted[channel];
    return ops_.size() - 1;
  }
  void start() override {
    ++starts;
    for (int c = 0; c < 2; ++c) {
      std::vector<const Op*> sends, recvs;
      for (const Op& op : ops_) {
        if (op.channel == c) (op.send ? sends : recvs).push_back(&op);
      }
      if (sends.size() != recvs.size()) throw Error("unmatched messages");
      for (size_t k = 0; k < sends.size(); ++k) {
        if (sends[k]->bytes != recvs[k]->bytes) throw Error("message sizes differ");
        std::memcpy(recvs[k]->data, sends[k]->data, sends[k]->bytes);
      }
    }
  }
  void wait(size_t, Clock::time_point) override {}
  void reset() override { ops_.clear(); }
  // One process stands for every rank: there is no one to say hello to.
  bool allgather(const void*, size_t, void*, Clock::time_point) override { return false; }
  Kernels& kernels() override { return kernels_; }

  int starts = 0;
  int posted[2] = {0, 0};

 private:
  struct Op {
    bool send;
    int channel;
    void* data;
    size_t bytes;
  };
  uint32_t rank_, size_;
  Kernels& kernels_;
  std::vector<Op> ops_;
};

TEST(GpuHooksTest, LoopbackPlanRunsThroughTheTransportsKernels) {
  Plan plan = Plan::from_bytes(testing::BuildPlan(testing::LoopbackPlan()), "loopback.rsplan");
  CountingKernels kernels;
  {
    LoopbackTransport transport(0, 2, kernels);
    SyntheticRun run = RunSynthetic(plan, 0, transport);
    EXPECT_EQ(run.check.wrong, 0u) << (run.check.first.empty() ? "" : FormatWrong(run.check.first[0]));
    EXPECT_EQ(run.check.checked, 64u * 32 + 16 * 96 + 48 * 64 + 64 * 16 + 1024 + 64 * 8);
    EXPECT_EQ(transport.starts, 2);           // one per round with messages
    EXPECT_EQ(transport.posted[0], 2 + 4);    // net
    EXPECT_EQ(transport.posted[1], 2 + 2);    // nvlink
    EXPECT_EQ(run.stats.channels[1].bytes_sent, 3072u + 2048);
  }
  EXPECT_EQ(kernels.allocated, std::vector<size_t>{40960});  // exactly the plan's staging, once
  EXPECT_EQ(kernels.released, 1);
  EXPECT_EQ(kernels.copies, 1 + 1 + 3 + 1 + 3);
  EXPECT_EQ(kernels.finishes, 1);
}

TEST(GpuHooksTest, BindAsksTheKernelsWhetherTheyReachTheMemory) {
  Plan plan = Plan::from_bytes(testing::BuildPlan(testing::LoopbackPlan()), "loopback.rsplan");
  CountingKernels kernels;
  LoopbackTransport transport(0, 2, kernels);
  Session session(plan, 0, transport);
  std::vector<uint16_t> w(64 * 96);
  kernels.refused.insert(w.data());
  try {
    session.bind("w", w.data(), fb::Dtype::bf16, {64, 96});
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 0: buffer 'w' is not memory of counting");
  }
}

TEST(GpuHooksTest, CpuKernelsAllocateAtLeastOneByte) {
  char* p = CpuKernels().Allocate(0);
  EXPECT_NE(p, nullptr);
  CpuKernels().Release(p);
  EXPECT_EQ(CpuKernels().name(), "cpu");
}

}  // namespace
}  // namespace reshard
