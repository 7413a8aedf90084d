// NVLink exchange and placement: a region several GPUs of one destination
// domain need enters the domain once and is forwarded over NVLink; plans with
// and without exchange validate and move the same destination elements.
#include <gtest/gtest.h>

#include "compiler/random_specs.h"
#include "compiler/test.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using testing::CompileJson;
using testing::LoadSample;

nlohmann::json Cluster(int gpus_per_domain, nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json c = testing::TinyCluster(gpus_per_domain);
  c.update(extra);
  return c;
}

struct Totals {
  uint64_t net = 0, nvlink = 0, forwards = 0;
  ValidateReport report;
};

Totals Compile(const std::string& infer, const nlohmann::json& cluster, bool exchange) {
  auto bytes = CompileJson(LoadSample("tiny-dense/model.json"), LoadSample("tiny-dense/train.json"),
                           LoadSample("tiny-dense/" + infer), cluster, "direct", 64, exchange);
  Totals t;
  Plan plan = Plan::from_bytes(bytes, "x.rsplan");
  t.net = plan.root().total_net_bytes();
  t.nvlink = plan.root().total_nvlink_bytes();
  for (uint32_t g = 0; g < plan.num_ranks(); ++g)
    for (const fb::Step* s : *plan.program(g).steps()) t.forwards += s->kind() == fb::StepKind::forward;
  t.report = testing::ValidateBytes(bytes);
  return t;
}

// tiny-dense: 8 training ranks (domains 0 and 1 of 4 GPUs), 4 inference ranks
// TP1 x DP4 in domain 2, each needing the whole model.
TEST(ExchangeTest, AReplicatedRegionEntersTheDomainOnceAndIsForwarded) {
  Totals on = Compile("infer-tp1-dp4.json", Cluster(4), true);
  Totals off = Compile("infer-tp1-dp4.json", Cluster(4), false);
  ASSERT_TRUE(on.report.ok()) << on.report.errors[0];
  ASSERT_TRUE(off.report.ok()) << off.report.errors[0];
  EXPECT_EQ(on.report.dest_elements, off.report.dest_elements);
  // Without exchange every inference GPU pulls the model over the network.
  EXPECT_EQ(off.nvlink, 0u);
  EXPECT_EQ(off.forwards, 0u);
  // With it the model crosses the network once and three copies go over NVLink
  // (forwards of several pieces carry the 256-byte alignment gaps between them).
  EXPECT_EQ(on.nvlink, 3 * on.net);
  EXPECT_GE(on.net * 4, off.net);
  EXPECT_LE(on.net * 4, off.net + 4 * 256 * on.forwards);
  EXPECT_GT(on.forwards, 0u);
}

TEST(ExchangeTest, OnlyRegionsSeveralGpusNeedAreForwarded) {
  // TP4: the four inference GPUs need disjoint shards of the matrices; only the
  // replicated norms are shared.
  Totals on = Compile("infer.json", Cluster(4), true);
  Totals off = Compile("infer.json", Cluster(4), false);
  ASSERT_TRUE(on.report.ok()) << on.report.errors[0];
  EXPECT_GT(on.forwards, 0u);
  EXPECT_LT(on.net, off.net);
  EXPECT_GE(on.net + on.nvlink, off.net);
  EXPECT_LE(on.net + on.nvlink, off.net + 256 * on.forwards);
  EXPECT_LT(on.nvlink * 5, on.net);  // norms are a small part of the model
}

TEST(ExchangeTest, RandomLayoutsValidateWithAndWithoutExchange) {
  int forwarded = 0;
  for (int seed = 1; seed <= 120; ++seed) {
    RandomSpecs s = MakeRandomSpecs(seed);
    for (bool exchange : {true, false}) {
      std::vector<uint8_t> bytes;
      std::string err = testing::ErrorOf([&] { bytes = CompileJson(s.model, s.train, s.infer, s.cluster, "direct", 2, exchange); });
      ASSERT_EQ(err, "") << "seed " << seed;
      ValidateReport rep = testing::ValidateBytes(bytes);
      ASSERT_TRUE(rep.ok()) << "seed " << seed << " exchange " << exchange << ": " << rep.errors[0];
      Plan plan = Plan::from_bytes(bytes, "r.rsplan");
      if (exchange && plan.root().total_nvlink_bytes() > 0) ++forwarded;
    }
  }
  EXPECT_GT(forwarded, 10);  // the generator does produce replicas inside destination domains
}

TEST(PlacementTest, PerDomainCountsLeaveSparesAndStartInferenceOnAFreshDomain) {
  // 8 training ranks, 3 per domain of 4: global 0-2, 4-6, 8-9; inference (4 ranks, 2 per
  // domain) starts on the next fresh domain (12): 12-13, 16-17.
  auto bytes = CompileJson(LoadSample("tiny-dense/model.json"), LoadSample("tiny-dense/train.json"),
                           LoadSample("tiny-dense/infer.json"),
                           Cluster(4, {{"train_gpus_per_domain", 3}, {"infer_gpus_per_domain", 2}}));
  Plan plan = Plan::from_bytes(bytes, "p.rsplan");
  std::vector<uint32_t> src(plan.root().src_global()->begin(), plan.root().src_global()->end());
  std::vector<uint32_t> dst(plan.root().dst_global()->begin(), plan.root().dst_global()->end());
  EXPECT_EQ(src, (std::vector<uint32_t>{0, 1, 2, 4, 5, 6, 8, 9}));
  EXPECT_EQ(dst, (std::vector<uint32_t>{12, 13, 16, 17}));
  EXPECT_EQ(plan.num_ranks(), 18u);
  EXPECT_EQ(plan.program(3).steps()->size(), 0u);  // a spare GPU does nothing
  EXPECT_TRUE(testing::ValidateBytes(bytes).ok());
}

TEST(PlacementTest, BadPerDomainCountsAreClearErrors) {
  auto err = [](nlohmann::json extra) {
    return testing::ErrorOf([&] {
      CompileJson(LoadSample("tiny-dense/model.json"), LoadSample("tiny-dense/train.json"),
                  LoadSample("tiny-dense/infer.json"), Cluster(4, extra));
    });
  };
  EXPECT_EQ(err({{"infer_gpus_per_domain", 5}}),
            "cluster.json: /infer_gpus_per_domain: 5 is more than the 4 GPUs of a domain (/gpus_per_domain)");
  EXPECT_EQ(err({{"train_gpus_per_domain", 0}}), "cluster.json: /train_gpus_per_domain: expected an integer >= 1, got 0");
  EXPECT_EQ(err({{"placement", "colocated"}, {"infer_gpus_per_domain", 2}}),
            "cluster.json: /infer_gpus_per_domain: only with \"placement\": \"disjoint\" (colocated ranks share every GPU)");
}

}  // namespace
}  // namespace reshard

namespace reshard {
namespace {

// Domains of 2: training ranks 0-7 in domains 0-3, inference ranks 8-11 (TP1 x DP4,
// each needing the whole model) in domains 4 and 5. A source sends each stripe once
// into one of the two domains; its entry GPU forwards it over the network to the
// other domain's entry and over NVLink to its domain mate.
TEST(ExchangeTest, RegionsNeededInSeveralDomainsAreRelayedBetweenThem) {
  Totals on = Compile("infer-tp1-dp4.json", Cluster(2), true);
  Totals off = Compile("infer-tp1-dp4.json", Cluster(2), false);
  ASSERT_TRUE(on.report.ok()) << on.report.errors[0];
  EXPECT_EQ(on.report.dest_elements, off.report.dest_elements);
  // Each domain still takes the model in over the network once (two domains: half
  // of what four GPUs pulling it themselves cost), plus alignment gaps of batched forwards.
  EXPECT_GE(on.net * 2, off.net);
  EXPECT_LE(on.net * 2, off.net + 2 * 256 * on.forwards);
  EXPECT_GE(on.nvlink * 4, off.net);  // one NVLink copy per domain
  auto bytes = CompileJson(LoadSample("tiny-dense/model.json"), LoadSample("tiny-dense/train.json"),
                           LoadSample("tiny-dense/infer-tp1-dp4.json"), Cluster(2));
  Plan plan = Plan::from_bytes(bytes, "relay.rsplan");
  uint64_t source_sent = 0, relayed = 0;
  for (uint32_t g = 0; g < plan.num_ranks(); ++g) {
    for (const fb::Step* s : *plan.program(g).steps()) {
      if (s->kind() == fb::StepKind::send && s->channel() == fb::Channel::net) source_sent += s->bytes();
      if (s->kind() == fb::StepKind::forward && s->channel() == fb::Channel::net) relayed += s->bytes();
      if (s->kind() == fb::StepKind::forward) {
        EXPECT_GE(plan.program(g).dst_rank(), 0) << "only inference GPUs relay";
      }
    }
  }
  EXPECT_GT(relayed, 0u);
  // The sources send the model once, not once per domain.
  EXPECT_LE(source_sent * 2, off.net + 2 * 256 * on.forwards);
  // And it runs: every destination byte checked over Gloo.
  testing::TempDir dir;
  testing::WriteFile(dir.File("relay.rsplan"), bytes);
  testing::ShellResult run = testing::Shell(std::string(RESHARD_BINARY) + " run " + dir.File("relay.rsplan") + " --local");
  EXPECT_EQ(run.exit_code, 0) << run.out;
}

// Relay trees save the sources' NICs. Where the sources have plenty to
// spare - here tiny-dense trained on 8 DP replicas (32 GPUs) for 4 inference
// GPUs in two domains - each domain takes its stripes from the sources
// themselves: no GPU relays, the sources send the model once per domain.
TEST(ExchangeTest, PlentifulSourcesSendToEveryDomainThemselves) {
  nlohmann::json train = LoadSample("tiny-dense/train.json");
  train["ranks"] = 32;
  train["meshes"]["dense"] = nlohmann::json::array({nlohmann::json::array({"pp", 2}), nlohmann::json::array({"dp", 8}),
                                                    nlohmann::json::array({"tp", 2})});
  auto relayed_bytes = [](const std::vector<uint8_t>& bytes, uint64_t& source_sent) {
    Plan plan = Plan::from_bytes(bytes, "p.rsplan");
    uint64_t relayed = 0;
    source_sent = 0;
    for (uint32_t g = 0; g < plan.num_ranks(); ++g) {
      for (const fb::Step* s : *plan.program(g).steps()) {
        if (s->kind() == fb::StepKind::send && s->channel() == fb::Channel::net) source_sent += s->bytes();
        if (s->kind() == fb::StepKind::forward && s->channel() == fb::Channel::net) relayed += s->bytes();
      }
    }
    return relayed;
  };
  auto many = CompileJson(LoadSample("tiny-dense/model.json"), train, LoadSample("tiny-dense/infer-tp1-dp4.json"),
                          Cluster(2));
  ValidateReport v = testing::ValidateBytes(many);
  ASSERT_TRUE(v.ok()) << v.errors[0];
  uint64_t sent_many = 0, sent_few = 0;
  EXPECT_EQ(relayed_bytes(many, sent_many), 0u);
  // The same model from the 8 GPUs of the sample: relayed (the test above), half the source bytes.
  auto few = CompileJson(LoadSample("tiny-dense/model.json"), LoadSample("tiny-dense/train.json"),
                         LoadSample("tiny-dense/infer-tp1-dp4.json"), Cluster(2));
  EXPECT_GT(relayed_bytes(few, sent_few), 0u);
  EXPECT_GT(sent_many, sent_few * 3 / 2);
  testing::TempDir dir;
  testing::WriteFile(dir.File("many.rsplan"), many);
  testing::ShellResult run = testing::Shell(std::string(RESHARD_BINARY) + " run " + dir.File("many.rsplan") + " --local");
  EXPECT_EQ(run.exit_code, 0) << run.out;
}

}  // namespace
}  // namespace reshard
