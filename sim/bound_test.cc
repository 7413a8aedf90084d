// The lower bound on hand-built plans whose bound is known: only fragments
// (what each rank holds and needs) matter, never the steps.
#include <gtest/gtest.h>

#include "compiler/spec.h"
#include "runtime/test.h"
#include "sim/bound.h"

namespace reshard {
namespace {

using testing::MakeFragment;
using testing::PlanSpec;

ClusterSpec Cluster(int gpus_per_domain) {
  ClusterSpec c;
  c.name = "test";
  c.gpus_per_domain = gpus_per_domain;
  c.nic_gbps = 80;      // 10 GB/s
  c.nvlink_GBps = 90;   // 90 GB/s
  c.nic_latency_us = 10;
  c.nvlink_latency_us = 2;
  return c;
}

// Tensor w fp32 [1000, 1000] (4 MB); `holds`/`needs`: per rank, row ranges.
PlanSpec Layout(uint32_t ranks, const std::vector<std::vector<std::pair<uint32_t, uint32_t>>>& holds,
                const std::vector<std::vector<std::pair<uint32_t, uint32_t>>>& needs) {
  PlanSpec spec;
  spec.tensors.push_back({"w", fb::Dtype::fp32, {0, 0}, {1000, 1000}});
  spec.programs.resize(ranks);
  for (uint32_t g = 0; g < ranks; ++g) {
    auto& p = spec.programs[g];
    p.rank = g;
    p.buffers = {{"w", fb::Dtype::fp32, {1000, 1000}}};
    for (auto [lo, hi] : holds[g]) p.fragments.push_back(MakeFragment(0, 0, lo * 1000, {lo, 0}, {hi, 1000}, {1000, 1}, 0));
    for (auto [lo, hi] : needs[g]) p.fragments.push_back(MakeFragment(0, 0, lo * 1000, {lo, 0}, {hi, 1000}, {1000, 1}, 1));
  }
  return spec;
}

sim::LowerBound Bound(const PlanSpec& spec, int gpus_per_domain) {
  Plan plan = Plan::from_bytes(testing::BuildPlan(spec), "b.rsplan");
  return sim::ComputeLowerBound(plan, Cluster(gpus_per_domain));
}

constexpr double kNic = 10e9, kNv = 90e9;

TEST(BoundTest, ADomainTakesInWhatItsGpusNeedOnceOverAllItsNics) {
  // Domains of 2: rank 0 holds all of w; ranks 2 and 3 (domain 1) both need all of it.
  auto lb = Bound(Layout(4, {{{0, 1000}}, {}, {}, {}}, {{}, {}, {{0, 1000}}, {{0, 1000}}}), 2);
  EXPECT_EQ(lb.ingress_bytes, 4000000u);  // once, not twice
  EXPECT_EQ(lb.ingress_domain, 1u);
  EXPECT_DOUBLE_EQ(lb.ingress_s, 4e6 / (2 * kNic));
  EXPECT_EQ(lb.egress_bytes, 4000000u);
  // Only domain 0 holds it: it leaves over the NICs of domain 0's GPUs in the job;
  // rank 1 holds and needs nothing, so its NIC does not count.
  EXPECT_DOUBLE_EQ(lb.egress_s, 4e6 / kNic);
  EXPECT_EQ(lb.needed_bytes, 8000000u);
  EXPECT_DOUBLE_EQ(lb.nvlink_s, 4e6 / (kNic + kNv));
  EXPECT_DOUBLE_EQ(lb.seconds, 4e6 / kNic + 10e-6);
  EXPECT_STREQ(lb.binding(), "source egress over NICs");
}

TEST(BoundTest, NeedsOfOneDomainAreUnitedAcrossItsGpus) {
  // Rank 2 needs rows 0..600, rank 3 rows 400..1000: the domain takes in 1000 rows.
  auto lb = Bound(Layout(4, {{{0, 1000}}, {}, {}, {}}, {{}, {}, {{0, 600}}, {{400, 1000}}}), 2);
  EXPECT_EQ(lb.ingress_bytes, 4000000u);
  EXPECT_EQ(lb.needed_bytes, 4800000u);
}

TEST(BoundTest, WhatTheDomainHoldsNeverCrossesTheNetwork) {
  // One domain of 4: rank 1 holds rows 0..500, rank 0 rows 500..1000; rank 2 needs all: no ingress.
  auto lb = Bound(Layout(4, {{{500, 1000}}, {{0, 500}}, {}, {}}, {{}, {}, {{0, 1000}}, {}}), 4);
  EXPECT_EQ(lb.ingress_bytes, 0u);
  EXPECT_EQ(lb.egress_bytes, 0u);
  // The job is on one domain: rank 2's NIC has no peer to take anything
  // from, so it takes all 4 MB in over NVLink.
  EXPECT_DOUBLE_EQ(lb.nvlink_s, 4e6 / kNv);
  EXPECT_DOUBLE_EQ(lb.latency_s, 2e-6);  // NVLink only
}

TEST(BoundTest, AGpusNicCountsWhereTheJobSpansDomains) {
  // The same needs, with an idle rank 4 in a second domain that holds one row:
  // a plan could bring that row to rank 2 over its NIC, so the NIC counts.
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> holds = {{{500, 1000}}, {{0, 500}}, {}, {}, {{0, 1}}};
  auto lb = Bound(Layout(5, holds, {{}, {}, {{0, 1000}}, {}, {}}), 4);
  EXPECT_DOUBLE_EQ(lb.nvlink_s, 4e6 / (kNic + kNv));
}

TEST(BoundTest, ReplicatedSourcesShareTheEgressOfEverySourceNic) {
  // Domains of 1: ranks 0 and 1 both hold all of w; rank 2 needs it. Nothing is held by one
  // domain only, so egress is 4 MB over both source NICs.
  auto lb = Bound(Layout(3, {{{0, 1000}}, {{0, 1000}}, {}}, {{}, {}, {{0, 1000}}}), 1);
  EXPECT_DOUBLE_EQ(lb.egress_s, 4e6 / (2 * kNic));
  EXPECT_DOUBLE_EQ(lb.ingress_s, 4e6 / kNic);
  EXPECT_STREQ(lb.binding(), "destination NVLink domain ingress over NICs");
}

TEST(BoundTest, AnFp8DestinationNeedsOneBytePerElement) {
  // Rank 1 (domain 1) needs all of w into an FP8 buffer: 1 MB must arrive, not the 4 MB of fp32.
  PlanSpec spec = Layout(2, {{{0, 1000}}, {}}, {{}, {{0, 1000}}});
  spec.programs[1].buffers[0].dtype = fb::Dtype::fp8_e4m3;
  auto lb = Bound(spec, 1);
  EXPECT_EQ(lb.ingress_bytes, 1000000u);
  EXPECT_EQ(lb.needed_bytes, 1000000u);
}

TEST(BoundTest, ARankHoldingWhatItNeedsNeedsNothing) {
  // Colocated: rank 0 holds and needs rows 0..1000, in the same memory.
  auto lb = Bound(Layout(1, {{{0, 1000}}}, {{{0, 1000}}}), 8);
  EXPECT_EQ(lb.needed_bytes, 0u);
  EXPECT_EQ(lb.local_bytes, 0u);
  EXPECT_DOUBLE_EQ(lb.seconds, 0);
}

TEST(BoundTest, ARankCopiesWhatItHoldsInOtherMemoryThroughItsHbm) {
  // Colocated: rank 0's training buffer holds rows 0..1000, its inference
  // buffer (another buffer) needs them: nothing crosses a link, but every
  // byte is read once and written once in its HBM (3350 GB/s by default).
  PlanSpec spec = Layout(1, {{{0, 1000}}}, {{{0, 1000}}});
  spec.programs[0].buffers.push_back({"w_infer", fb::Dtype::fp32, {1000, 1000}});
  spec.programs[0].fragments[1] = testing::MakeFragment(0, 1, 0, {0, 0}, {1000, 1000}, {1000, 1}, 1);
  auto lb = Bound(spec, 8);
  EXPECT_EQ(lb.needed_bytes, 0u);
  EXPECT_EQ(lb.local_bytes, 4000000u);
  EXPECT_DOUBLE_EQ(lb.local_s, 2 * 4e6 / 3350e9);
  EXPECT_DOUBLE_EQ(lb.seconds, lb.local_s);  // no link: no latency
  EXPECT_STREQ(lb.binding(), "a GPU's local copy of what it holds");
}

TEST(BoundTest, ALocalCopyThatBindsTakesNoLatency) {
  // Rank 0 copies rows 0..1000 into its inference buffer at 1 GB/s of HBM
  // (8 ms) and sends 10 rows to rank 1 over NVLink meanwhile (0.44 us and
  // a 2 us latency): the copy alone sets the bound.
  PlanSpec spec = Layout(2, {{{0, 1000}}, {}}, {{}, {{0, 10}}});
  spec.programs[0].buffers.push_back({"w_infer", fb::Dtype::fp32, {1000, 1000}});
  spec.programs[0].fragments.push_back(testing::MakeFragment(0, 1, 0, {0, 0}, {1000, 1000}, {1000, 1}, 1));
  ClusterSpec c = Cluster(2);
  c.hbm_GBps = 1;
  Plan plan = Plan::from_bytes(testing::BuildPlan(spec), "b.rsplan");
  auto lb = sim::ComputeLowerBound(plan, c);
  EXPECT_DOUBLE_EQ(lb.latency_s, 2e-6);
  EXPECT_DOUBLE_EQ(lb.local_s, 2 * 4e6 / 1e9);
  EXPECT_DOUBLE_EQ(lb.seconds, lb.local_s);
  EXPECT_STREQ(lb.binding(), "a GPU's local copy of what it holds");
}

}  // namespace
}  // namespace reshard
