// reshard diff: equivalence, and the changed figures of known layout, staging
// and cluster edits checked against what `reshard show --json` reports.
#include <cstring>
#include <map>
#include <regex>

#include "tests/test_util.h"

namespace reshard::testing {
namespace {

using nlohmann::json;

json DiffJson(const TempDir& dir, const std::string& a, const std::string& b, int expect_code,
              const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"diff", a, b, "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  Result r = Reshard(dir, args);
  EXPECT_EQ(r.code, expect_code) << r.out << r.err;
  return json::parse(r.out);
}

// The one input field named `field` in a diff's "inputs" list (null when absent).
json Input(const json& d, const std::string& field) {
  for (const json& x : d["inputs"])
    if (x["field"] == field) return x;
  return nullptr;
}

// Bytes rank `from` sends to `to` over `channel`, summed from its program as `show --rank` lists it.
uint64_t PairBytes(const TempDir& dir, const std::string& plan, uint32_t from, uint32_t to, const std::string& channel) {
  json s = ShowJson(dir, plan, static_cast<int>(from));
  uint64_t sum = 0;
  for (const json& st : s["per_rank"][0]["program"])
    if ((st["kind"] == "send" || st["kind"] == "forward") && st["peer"] == to && st["channel"] == channel)
      sum += st["bytes"].get<uint64_t>();
  return sum;
}

const json* FindTensor(const json& d, const std::string& name) {
  for (const json& t : d["tensors"])
    if (t["name"] == name) return &t;
  return nullptr;
}

TEST(DiffTest, PlanWithItselfIsEquivalent) {
  TempDir dir;
  std::string a = TinyDense(dir, "a.rsplan");
  Result r = Reshard(dir, {"diff", a, a});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("equivalent: all 12 ranks run the same programs step for step"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("note:"), std::string::npos) << r.out;
  json d = DiffJson(dir, a, a, 0);
  EXPECT_TRUE(d["equivalent"].get<bool>());
  EXPECT_TRUE(d["inputs"].empty());
  EXPECT_EQ(d["programs"]["differing"], 0);
  EXPECT_EQ(d["ranks_changed"], 0);
  EXPECT_EQ(d["pairs_changed"], 0);
  EXPECT_EQ(d["tensors_changed"], 0);
  EXPECT_EQ(d["totals"]["net"]["bytes"]["delta"], 0);
}

TEST(DiffTest, SamePlanCompiledTwiceIsEquivalent) {
  TempDir dir;
  std::string a = TinyDense(dir, "a.rsplan"), b = TinyDense(dir, "b.rsplan");
  json d = DiffJson(dir, a, b, 0);
  EXPECT_TRUE(d["equivalent"].get<bool>());
}

TEST(DiffTest, OnlyCompilerVersionDiffersIsEquivalentWithNote) {
  TempDir dir;
  std::string a = TinyDense(dir, "a.rsplan");
  std::string version = ShowJson(dir, a)["compiler_version"];
  ASSERT_FALSE(version.empty());
  // Patch the version string in place: a flatbuffers string is a 32-bit length,
  // the bytes and a NUL; the plan stays valid and every program stays the same.
  std::string bytes = ReadText(a);
  std::string pattern(4, '\0');
  uint32_t len = static_cast<uint32_t>(version.size());
  std::memcpy(pattern.data(), &len, 4);
  pattern += version + '\0';
  size_t at = bytes.find(pattern);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(bytes.find(pattern, at + 1), std::string::npos) << "version string is not unique in the plan";
  char& last = bytes[at + 4 + version.size() - 1];
  last = last == '9' ? '8' : static_cast<char>(last + 1);
  std::string b = dir.File("b.rsplan");
  std::ofstream(b, std::ios::binary) << bytes;
  std::string patched = ShowJson(dir, b)["compiler_version"];
  ASSERT_NE(patched, version);

  Result r = Reshard(dir, {"diff", a, b});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("equivalent"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note: compiler_version differs: " + version + " -> " + patched), std::string::npos) << r.out;
  json d = DiffJson(dir, a, b, 0);
  EXPECT_TRUE(d["equivalent"].get<bool>());
  ASSERT_EQ(d["inputs"].size(), 1u) << d["inputs"].dump();
  EXPECT_EQ(Input(d, "compiler_version")["b"], patched);
}

// TP4 -> DP2 x TP2 on the same four inference GPUs: every tensor is needed
// twice instead of once (k/v were already replicated under TP4).
TEST(DiffTest, TensorParallelChangeGivesShowFigures) {
  TempDir dir;
  std::string a = TinyDense(dir, "tp4.rsplan", "infer.json");
  std::string b = TinyDense(dir, "tp2dp2.rsplan", "infer-tp2-dp2.json");
  json sa = ShowJson(dir, a), sb = ShowJson(dir, b);
  json d = DiffJson(dir, a, b, 1);
  EXPECT_FALSE(d["equivalent"].get<bool>());
  EXPECT_EQ(Input(d, "dest_layout")["a"], sa["dest_layout"]);
  EXPECT_EQ(Input(d, "dest_layout")["b"], sb["dest_layout"]);
  EXPECT_EQ(Input(d, "dest_layout")["b"], "vllm-tp2-dp2");
  EXPECT_TRUE(Input(d, "source_layout").is_null());
  EXPECT_TRUE(Input(d, "cluster").is_null());
  for (const char* ch : {"net", "nvlink"}) {
    EXPECT_EQ(d["totals"][ch]["bytes"]["a"], sa[ch]["bytes"]) << ch;
    EXPECT_EQ(d["totals"][ch]["bytes"]["b"], sb[ch]["bytes"]) << ch;
    EXPECT_EQ(d["totals"][ch]["messages"]["a"], sa[ch]["messages"]) << ch;
    EXPECT_EQ(d["totals"][ch]["messages"]["b"], sb[ch]["messages"]) << ch;
    EXPECT_EQ(d["totals"][ch]["bytes"]["delta"].get<int64_t>(),
              sb[ch]["bytes"].get<int64_t>() - sa[ch]["bytes"].get<int64_t>());
  }
  // Per rank: each inference rank receives what show says, largest change first.
  ASSERT_FALSE(d["per_rank"].empty());
  int64_t last = INT64_MAX;
  for (const json& r : d["per_rank"]) {
    uint32_t rank = r["rank"];
    EXPECT_EQ(r["net_received"]["a"], sa["per_rank"][rank]["net_received"]) << rank;
    EXPECT_EQ(r["net_received"]["b"], sb["per_rank"][rank]["net_received"]) << rank;
    EXPECT_EQ(r["net_sent"]["a"], sa["per_rank"][rank]["net_sent"]) << rank;
    EXPECT_EQ(r["net_sent"]["b"], sb["per_rank"][rank]["net_sent"]) << rank;
    int64_t change = 0;
    for (const char* f : {"net_sent", "net_received", "nvlink_sent", "nvlink_received"})
      change += std::llabs(r[f]["delta"].get<int64_t>());
    EXPECT_LE(change, last);
    last = change;
  }
  // Per pair: the largest changes, checked against the sender's program.
  ASSERT_GE(d["per_pair"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const json& p = d["per_pair"][i];
    EXPECT_EQ(p["bytes"]["a"], PairBytes(dir, a, p["from"], p["to"], p["channel"])) << p.dump();
    EXPECT_EQ(p["bytes"]["b"], PairBytes(dir, b, p["from"], p["to"], p["channel"])) << p.dump();
    if (i > 0) {
      EXPECT_GE(std::llabs(d["per_pair"][i - 1]["bytes"]["delta"].get<int64_t>()),
                std::llabs(p["bytes"]["delta"].get<int64_t>()));
    }
  }
  // Tensors: q_proj (4 layers of 64x64 BF16) is written once under TP4, twice under DP2 x TP2.
  const json* q = FindTensor(d, "model.layers.{layer}.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr) << d["tensors"].dump();
  EXPECT_EQ((*q)["layout"], "(4,64,64):(4096,64,1)");
  EXPECT_EQ((*q)["written"]["a"], 4 * 64 * 64 * 2);
  EXPECT_EQ((*q)["written"]["b"], 2 * 4 * 64 * 64 * 2);
  EXPECT_EQ((*q)["destinations"]["a"], "8-11");
  EXPECT_EQ(d["unattributed_bytes"]["a"], 0);
  EXPECT_EQ(d["unattributed_bytes"]["b"], 0);

  Result r = Reshard(dir, {"diff", a, b, "--top", "20"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("different: 12 of 12 ranks run different programs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dest_layout      vllm-tp4 -> vllm-tp2-dp2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.layers.{layer}.self_attn.q_proj.weight (4,64,64):(4096,64,1)"), std::string::npos)
      << r.out;
  // A differing step is printed with its regions in CuTe notation.
  EXPECT_NE(r.out.find("):("), std::string::npos) << r.out;
  json top2 = DiffJson(dir, a, b, 1, {"--top", "2"});
  EXPECT_EQ(top2["per_pair"].size(), 2u);
  EXPECT_EQ(top2["per_rank"].size(), 2u);
  EXPECT_GT(top2["pairs_changed"].get<int>(), 2);
}

// Skipped under the sanitizers: two 256-rank compiles take a minute there
// (diff's code runs there on the other tests' smaller plans); every plain build
// runs it.
TEST(DiffTest, StagingChangeChangesRoundsNotBytes) {
#ifdef RESHARD_SANITIZE
  GTEST_SKIP() << "two 256-rank compiles: a minute under AddressSanitizer";
#endif
  TempDir dir;
  const char *m = "qwen3-235b/model.json", *from = "qwen3-235b/train-tp4-pp8-ep16.json",
             *to = "qwen3-235b/infer-tp8-dp16.json", *c = "clusters/dgx-h100.json";
  std::string a = CompileSample(dir, "s1024.rsplan", m, from, to, c, {"--staging-mb", "1024"});
  std::string b = CompileSample(dir, "s256.rsplan", m, from, to, c, {"--staging-mb", "256"});
  json sa = ShowJson(dir, a), sb = ShowJson(dir, b);
  ASSERT_NE(sa["rounds"], sb["rounds"]);
  json d = DiffJson(dir, a, b, 1);
  EXPECT_EQ(d["rounds"]["a"], sa["rounds"]);
  EXPECT_EQ(d["rounds"]["b"], sb["rounds"]);
  EXPECT_EQ(d["staging"]["limit"]["a"], 1024ull << 20);
  EXPECT_EQ(d["staging"]["limit"]["b"], 256ull << 20);
  EXPECT_LE(d["staging"]["max_per_rank"]["b"].get<uint64_t>(), 256ull << 20);
  EXPECT_EQ(Input(d, "staging_limit")["b"], "268435456 (256.00 MiB)");
  EXPECT_TRUE(Input(d, "digest").is_null()) << "the digest covers the specs, not the options";
  // The same bytes move, in more rounds.
  for (const char* ch : {"net", "nvlink"}) {
    EXPECT_EQ(d["totals"][ch]["bytes"]["a"], sa[ch]["bytes"]);
    EXPECT_EQ(d["totals"][ch]["bytes"]["b"], sb[ch]["bytes"]);
    EXPECT_EQ(d["totals"][ch]["bytes"]["delta"], 0);
  }
  EXPECT_EQ(d["totals"]["net"]["messages"]["b"], sb["net"]["messages"]);
  EXPECT_GT(d["rounds_changed"].get<int>(), 0);
  // Per round figures are show's per-round figures.
  for (const json& r : d["per_round"]) {
    size_t rd = r["round"];
    uint64_t na = rd < sa["per_round"].size() ? sa["per_round"][rd]["net"].get<uint64_t>() : 0;
    uint64_t nb = rd < sb["per_round"].size() ? sb["per_round"][rd]["net"].get<uint64_t>() : 0;
    EXPECT_EQ(r["net"]["a"], na) << rd;
    EXPECT_EQ(r["net"]["b"], nb) << rd;
  }
}

// dgx-h100 puts the 8 training and 4 inference ranks of tiny-dense in two
// NVLink domains (all traffic over the network); a shared GB200 NVL72 rack in one (all NVLink).
TEST(DiffTest, ClusterChangeMovesBytesBetweenChannels) {
  TempDir dir;
  std::string a = TinyDense(dir, "dgx.rsplan", "infer.json", "clusters/dgx-h100.json");
  std::string b = TinyDense(dir, "nvl72.rsplan", "infer.json", "../tests/data/nvl72-shared.json");
  json sa = ShowJson(dir, a), sb = ShowJson(dir, b);
  json d = DiffJson(dir, a, b, 1);
  EXPECT_EQ(Input(d, "cluster")["a"], "dgx-h100");
  EXPECT_EQ(Input(d, "cluster")["b"], "gb200-nvl72-shared");
  EXPECT_EQ(Input(d, "domains")["a"], "2 NVLink domains");
  EXPECT_EQ(Input(d, "domains")["b"], "1 NVLink domain");
  EXPECT_FALSE(Input(d, "digest").is_null());
  EXPECT_EQ(d["totals"]["net"]["bytes"]["a"], sa["net"]["bytes"]);
  EXPECT_EQ(d["totals"]["net"]["bytes"]["b"], sb["net"]["bytes"]);
  EXPECT_EQ(d["totals"]["nvlink"]["bytes"]["a"], sa["nvlink"]["bytes"]);
  EXPECT_EQ(d["totals"]["nvlink"]["bytes"]["b"], sb["nvlink"]["bytes"]);
  // One NVLink domain: nothing needs the network.
  EXPECT_GT(d["totals"]["net"]["bytes"]["a"].get<uint64_t>(), 0u);
  EXPECT_EQ(d["totals"]["net"]["bytes"]["b"], 0);
  EXPECT_GT(d["totals"]["nvlink"]["bytes"]["b"].get<uint64_t>(), 0u);
  json all = DiffJson(dir, a, b, 1, {"--top", "1000"});
  ASSERT_EQ(all["per_pair"].size(), all["pairs_changed"].get<size_t>());
  int64_t net_delta = 0, nvlink_delta = 0;
  for (const json& p : all["per_pair"])
    (p["channel"] == "net" ? net_delta : nvlink_delta) += p["bytes"]["delta"].get<int64_t>();
  EXPECT_EQ(net_delta, all["totals"]["net"]["bytes"]["delta"].get<int64_t>());
  EXPECT_EQ(nvlink_delta, all["totals"]["nvlink"]["bytes"]["delta"].get<int64_t>());
  for (size_t i = 0; i < 3 && i < all["per_pair"].size(); ++i) {
    const json& p = all["per_pair"][i];
    EXPECT_EQ(p["bytes"]["a"], PairBytes(dir, a, p["from"], p["to"], p["channel"])) << p.dump();
    EXPECT_EQ(p["bytes"]["b"], PairBytes(dir, b, p["from"], p["to"], p["channel"])) << p.dump();
  }
  // The destinations need the same elements whatever the cluster.
  for (const json& t : all["tensors"]) EXPECT_EQ(t["written"]["a"], t["written"]["b"]) << t.dump();
  Result r = Reshard(dir, {"diff", a, b});
  EXPECT_NE(r.out.find("cluster          dgx-h100 -> gb200-nvl72"), std::string::npos) << r.out;
}

// Plans that differ only in how a step converts (its quant op) are not equivalent.
TEST(DiffTest, QuantOpChangeIsADifference) {
  TempDir dir;
  PlanSpec spec = QuantPlan(QuantPath::requantize);
  WriteFile(dir.File("a.rsplan"), BuildPlan(spec));
  fb::QuantOp& op = spec.programs[1].quant_ops[0];
  op = MakeQuant(op.step(), op.kind(), op.scale(), {2, 0}, {2, 4});  // rows 2..4 of the block cover, not 1..3
  WriteFile(dir.File("b.rsplan"), BuildPlan(spec));
  json d = DiffJson(dir, dir.File("a.rsplan"), dir.File("b.rsplan"), 1);
  EXPECT_FALSE(d["equivalent"].get<bool>());
  Result r = Reshard(dir, {"diff", dir.File("a.rsplan"), dir.File("b.rsplan")});
  EXPECT_NE(r.out.find("quant op of step 1: quantize -> step 1: quantize (kind, blocks, origin or scales)"),
            std::string::npos)
      << r.out;
}

TEST(DiffTest, ErrorsExitTwoWithMessage) {
  TempDir dir;
  std::string a = TinyDense(dir, "a.rsplan");
  Result missing = Reshard(dir, {"diff", a, dir.File("nope.rsplan")});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("nope.rsplan"), std::string::npos) << missing.err;
  EXPECT_EQ(missing.out, "");
  std::string not_plan = dir.File("model.rsplan");
  std::ofstream(not_plan) << ReadText(Sample("tiny-dense/model.json"));
  Result bad = Reshard(dir, {"diff", not_plan, a});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("reshard: error: " + not_plan + ":"), std::string::npos) << bad.err;
  Result usage = Reshard(dir, {"diff", a});
  EXPECT_NE(usage.code, 0);
  EXPECT_NE(usage.code, 1) << "a usage error must not read as 'different'";
}

TEST(DiffTest, HelpTeachesWithAnExample) {
  TempDir dir;
  Result r = Reshard(dir, {"diff", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("reshard diff tp4.rsplan tp2.rsplan"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0 equivalent, 1 different, 2 error"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace reshard::testing

namespace reshard::testing {
namespace {

TEST(ShowTest, RankProgramPrintsRegionsWithBufferNamesInCuteNotation) {
  TempDir dir;
  std::string plan = TinyDense(dir, "tiny.rsplan");
  Result r = Reshard(dir, {"show", plan, "--rank", "9"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::regex region(R"('model\.[a-z_.0-9]+' @[0-9]+ \([0-9]+(,[0-9]+)*\):\(b?[0-9]+(,b?[0-9]+)*\))");
  EXPECT_TRUE(std::regex_search(r.out, region)) << r.out;
  EXPECT_NE(r.out.find("rank 9 (infer 1, NVLink domain 1)"), std::string::npos) << r.out;
  nlohmann::json j = ShowJson(dir, plan, 9);
  bool found = false;
  for (const nlohmann::json& s : j["per_rank"][0]["program"])
    if (s.contains("dst")) found = found || std::regex_search(s["dst"].get<std::string>(), region);
  EXPECT_TRUE(found) << j.dump();
}

}  // namespace
}  // namespace reshard::testing
