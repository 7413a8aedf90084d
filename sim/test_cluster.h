// A cluster for the simulator's unit tests: DGX H100 links (NIC 50 GB/s,
// NVLink 150 GB/s a direction, HBM 3.35 TB/s) and no latencies, so that a
// message's time is its bytes over the bandwidth it gets.
#pragma once

#include "compiler/spec.h"

namespace reshard::sim::testing {

inline ClusterSpec NoLatencyCluster(int gpus_per_domain) {
  ClusterSpec cluster;
  cluster.name = "test";
  cluster.gpus_per_domain = gpus_per_domain;
  cluster.nic_gbps = 400;  // 50 GB/s
  cluster.nvlink_GBps = 150;
  cluster.nic_latency_us = cluster.nvlink_latency_us = 0;
  cluster.hbm_GBps = 3350;
  return cluster;
}

}  // namespace reshard::sim::testing
