#include "runtime/reshard.h"

#include <gtest/gtest.h>

#include <cstring>

#include "runtime/synthetic.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using testing::BuildPlan;
using testing::TempDir;

TEST(CApiTest, ReportsErrorsThroughLastError) {
  EXPECT_EQ(reshard_plan_open("/nonexistent/p.rsplan"), nullptr);
  EXPECT_STREQ(reshard_last_error(), "/nonexistent/p.rsplan: cannot open: No such file or directory");
  EXPECT_EQ(reshard_plan_open(nullptr), nullptr);
  EXPECT_STREQ(reshard_last_error(), "path is NULL");
  EXPECT_EQ(reshard_session_create(nullptr, 0, nullptr), nullptr);
  EXPECT_STREQ(reshard_last_error(), "plan is NULL");
}

// Both ranks of PackAndDirectPlan through the C API only, as Python would.
TEST(CApiTest, RunsTwoRanks) {
  TempDir dir;
  testing::WriteFile(dir.File("p.rsplan"), BuildPlan(testing::PackAndDirectPlan()));
  auto out = testing::RunRanks(2, [&](int r) -> std::string {
    reshard_plan* plan = reshard_plan_open(dir.File("p.rsplan").c_str());
    if (plan == nullptr) return reshard_last_error();
    if (reshard_plan_num_ranks(plan) != 2) return "num_ranks";
    if (reshard_plan_num_active_ranks(plan) != 2 || reshard_plan_active_rank(plan, 1) != 1 ||
        reshard_plan_active_rank(plan, 2) != UINT32_MAX || std::strlen(reshard_plan_content_digest(plan)) != 32)
      return "active ranks or digest";
    reshard_transport* t =
        reshard_gloo_transport_create(static_cast<uint32_t>(r), 2, dir.path().c_str(), "capi", nullptr, 10);
    if (t == nullptr) return reshard_last_error();
    reshard_session* s = reshard_session_create(plan, static_cast<uint32_t>(r), t);
    if (s == nullptr) return reshard_last_error();
    std::vector<float> cols(64);
    std::vector<uint16_t> w(128), rows(64);
    const uint64_t shape_w[] = {8, 16}, shape_cols[] = {8, 8}, shape_rows[] = {4, 16};
    if (r == 0) {
      if (reshard_session_num_buffers(s) != 1 || std::string(reshard_session_buffer_name(s, 0)) != "w") return "names";
      for (int i = 0; i < 128; ++i) w[i] = static_cast<uint16_t>(SyntheticBits(0, i, fb::Dtype::bf16));
      if (reshard_session_bind(s, "w", w.data(), RESHARD_BF16, shape_w, 2) != 0) return reshard_last_error();
    } else {
      if (reshard_session_bind(s, "w.cols", cols.data(), RESHARD_FP32, shape_w, 2) == 0) return "bad shape accepted";
      std::string err = reshard_last_error();
      if (err != "rank 1: buffer 'w.cols' is bound with shape [8,16], the plan expects [8,8]") return err;
      if (reshard_session_bind(s, "w.cols", cols.data(), RESHARD_FP32, shape_cols, 2) != 0) return reshard_last_error();
      if (reshard_session_bind(s, "w.rows", rows.data(), RESHARD_BF16, shape_rows, 2) != 0) return reshard_last_error();
    }
    reshard_stats stats;
    if (reshard_session_run(s, &stats) != 0) return reshard_last_error();
    if (stats.net_bytes_sent + stats.net_bytes_received != 256 || stats.rounds != 1) return "stats";
    if (r == 1) {
      for (int i = 0; i < 8; ++i) {
        for (int j = 0; j < 8; ++j) {
          if (cols[i * 8 + j] != SyntheticValue(0, i * 16 + 4 + j, fb::Dtype::bf16)) return "cols wrong";
        }
      }
      for (int i = 0; i < 64; ++i) {
        if (rows[i] != SyntheticBits(0, i, fb::Dtype::bf16)) return "rows wrong";
      }
    }
    reshard_session_destroy(s);
    reshard_transport_destroy(t);
    reshard_plan_close(plan);
    return "";
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(out[r].exit_code, 0) << out[r].message;
}

}  // namespace
}  // namespace reshard
