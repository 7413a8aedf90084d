// Quantized refit end to end: tiny-dense compiled with FP8 layouts, proven by
// `reshard validate`, run over Gloo by `reshard run --local`, every FP8 value
// and every scale compared with the reference quantization of the source.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "compiler/test.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using nlohmann::json;
using testing::TempDir;

using Result = testing::ShellResult;
using testing::Shell;

const std::string kBinary = RESHARD_BINARY;
const std::string kSamples = std::string(RESHARD_SOURCE_DIR) + "/samples";

using testing::LoadSample;

json Quant(const std::string& scale_name, const std::string& format, const std::string& scale = "",
           std::vector<int> block = {}) {
  json q = {{"format", format}, {"scale_name", scale_name}};
  if (!scale.empty()) q["scale"] = scale;
  if (!block.empty()) q["block"] = block;
  return q;
}

// Adds `quant` to the buffer rule named `name` (or a rule for tensor `name`).
void Quantize(json& layout, const std::string& name, const json& quant) {
  for (json& b : layout["buffers"])
    if (b["name"] == name) {
      b["quant"] = quant;
      return;
    }
  layout["buffers"].push_back({{"name", name}, {"tensor", name}, {"quant", quant}});
}

// The placement rule of tensor family `tensor` (the generated samples place
// each family by its own rule).
json& PlacementOf(json& layout, const std::string& tensor) {
  for (json& p : layout["placements"])
    if (p["match"] == tensor) return p;
  throw Error("no placement for " + tensor);
}

// Compiles, validates and runs; returns the run's JSON summary.
json CompileValidateRun(const json& train, const json& infer, const std::string& flags = "",
                        const json& cluster = LoadSample("clusters/dgx-h100.json"), const std::string& model = "tiny-dense") {
  TempDir dir;
  std::ofstream(dir.File("train.json")) << train.dump();
  std::ofstream(dir.File("infer.json")) << infer.dump();
  std::ofstream(dir.File("cluster.json")) << cluster.dump();
  const std::string plan = dir.File("q.rsplan");
  Result c = Shell(kBinary + " compile --model " + kSamples + "/" + model + "/model.json --from " + dir.File("train.json") +
                   " --to " + dir.File("infer.json") + " --cluster " + dir.File("cluster.json") + " -q -o " + plan +
                   " " + flags);
  EXPECT_EQ(c.exit_code, 0) << c.out;
  if (c.exit_code != 0) return json();
  Result v = Shell(kBinary + " validate " + plan);
  EXPECT_EQ(v.exit_code, 0) << v.out;
  Result r = Shell(kBinary + " run " + plan + " --local --timeout 20 --json");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  json out = json::parse(r.out.substr(r.out.find('{')), nullptr, false);
  EXPECT_EQ(out.value("wrong", -1), 0) << r.out;
  return out;
}

const std::string kGateUp = "model.layers.{layer}.mlp.gate_up_proj.weight";
const std::string kGateUpScale = "model.layers.{layer}.mlp.gate_up_proj.weight_scale_inv";

// Block-scaled FP8 where TP4 cuts blocks of 64 rows (32 rows per rank) and
// where blocks of 32 rows are whole on every rank; the sender quantizes
// (half the bytes) or the receiver does.
TEST(QuantE2eTest, Fp8BlockScalesWithAndWithoutCutBlocks) {
  const json train = LoadSample("tiny-dense/train.json");
  const json bf16 = CompileValidateRun(train, LoadSample("tiny-dense/infer.json"));
  for (int rows : {64, 32}) {
    json infer = LoadSample("tiny-dense/infer.json");
    Quantize(infer, kGateUp, Quant(kGateUpScale, "fp8_e4m3", "block", {rows, 32}));
    const json sender = CompileValidateRun(train, infer);
    const json receiver = CompileValidateRun(train, infer, "--requantize-on-receiver");
    // gate and up: 4 layers x 2 x 128 x 64 values, plus the scales every rank keeps.
    const int64_t scales = 4 * 2 * 4 * (rows == 64 ? 1 : 1) * 2;
    EXPECT_EQ(sender.value("checked", 0), bf16.value("checked", 0) + scales) << rows;
    EXPECT_EQ(receiver.value("checked", 0), sender.value("checked", 0));
    // BF16 gate/up is 4 x 2 x 128 x 64 x 2 bytes = 128 KiB; FP8 halves it, the
    // receiver path sends BF16 (twice the rows of each rank where blocks are cut).
    const int64_t gate_up = 4 * 2 * 128 * 64 * 2;
    EXPECT_LT(sender.value("bytes", 0), bf16.value("bytes", 0) - gate_up / 2 + 8192) << rows;
    EXPECT_EQ(receiver.value("bytes", 0), bf16.value("bytes", 0) + (rows == 64 ? gate_up : 0)) << rows;
  }
}

// Domains of 2 GPUs: the four TP1 replicas sit in two domains; each FP8
// stripe (whole blocks) leaves the sources once, is relayed to the other
// domain's entry GPU and forwarded over NVLink, FP8 values and scales alike.
TEST(QuantE2eTest, Fp8StripesAreRelayedBetweenDomains) {
  json cluster = LoadSample("clusters/dgx-h100.json");
  cluster["gpus_per_domain"] = 2;
  json infer = LoadSample("tiny-dense/infer-tp1-dp4.json");
  Quantize(infer, kGateUp, Quant(kGateUpScale, "fp8_e4m3", "block", {32, 32}));
  const json train = LoadSample("tiny-dense/train.json");
  const json relayed = CompileValidateRun(train, infer, "", cluster);
  const json direct = CompileValidateRun(train, infer, "--no-nvlink-exchange", cluster);
  EXPECT_EQ(relayed.value("checked", 0), direct.value("checked", 0));
  EXPECT_GT(relayed.value("nvlink_bytes", 0), 0);
  EXPECT_LT(relayed.value("net_bytes", 0), direct.value("net_bytes", 0));
  CompileValidateRun(train, infer, "--requantize-on-receiver", cluster);
}

TEST(QuantE2eTest, Mxfp8PerChannelAndPerTensor) {
  // o_proj and down_proj whole on every training rank of a stage, so that one
  // rank holds o_proj's one block and every row (channel) of down_proj.
  json train = LoadSample("tiny-dense/train.json");
  PlacementOf(train, "model.layers.{layer}.self_attn.o_proj.weight").erase("tp");
  PlacementOf(train, "model.layers.{layer}.mlp.down_proj.weight").erase("tp");
  json infer = LoadSample("tiny-dense/infer.json");
  Quantize(infer, "model.layers.{layer}.self_attn.qkv_proj.weight",
           Quant("model.layers.{layer}.self_attn.qkv_proj.weight_scale", "mxfp8"));
  Quantize(infer, "model.layers.{layer}.mlp.down_proj.weight",
           Quant("model.layers.{layer}.mlp.down_proj.weight_scale", "fp8_e4m3", "channel"));
  Quantize(infer, "model.layers.{layer}.self_attn.o_proj.weight",
           Quant("model.layers.{layer}.self_attn.o_proj.weight_scale", "fp8_e4m3", "tensor"));
  const json out = CompileValidateRun(train, infer);
  EXPECT_EQ(out.value("ok", false), true);
  CompileValidateRun(train, infer, "--requantize-on-receiver");
}

// FP8 on the training side: dequantized on the sender for a BF16 destination,
// and requantized on the receiver over its own blocks for an FP8 one.
TEST(QuantE2eTest, Fp8Source) {
  json train = LoadSample("tiny-dense/train.json");
  Quantize(train, "decoder.layers.{layer.local}.mlp.linear_fc1.weight",
           Quant("decoder.layers.{layer.local}.mlp.linear_fc1.weight_scale_inv", "fp8_e4m3", "block", {64, 32}));
  const json plain = CompileValidateRun(train, LoadSample("tiny-dense/infer.json"));
  EXPECT_EQ(plain.value("ok", false), true);
  json infer = LoadSample("tiny-dense/infer.json");
  Quantize(infer, kGateUp, Quant(kGateUpScale, "mxfp8"));
  const json both = CompileValidateRun(train, infer);
  EXPECT_EQ(both.value("ok", false), true);
}

Result CompileOnly(const json& train, const json& infer, const std::string& flags = "") {
  TempDir dir;
  std::ofstream(dir.File("train.json")) << train.dump();
  std::ofstream(dir.File("infer.json")) << infer.dump();
  Result c = Shell(kBinary + " compile --model " + kSamples + "/tiny-dense/model.json --from " + dir.File("train.json") +
                   " --to " + dir.File("infer.json") + " --cluster " + kSamples + "/clusters/dgx-h100.json -o " +
                   dir.File("q.rsplan") + " " + flags);
  const std::string prefix = dir.path() + "/";
  for (size_t at; (at = c.out.find(prefix)) != std::string::npos;) c.out.erase(at, prefix.size());
  return c;
}

// Blocks that several training ranks hold parts of: training TP2 cuts
// o_proj's and down_proj's columns, so the one per-tensor block of o_proj and
// every per-channel row of down_proj lie on two ranks (of each stage). Each
// sends its partial block amaxes and what the receiver needs of the values;
// the receiver takes the scales of the largest amaxes and quantizes once.
TEST(QuantE2eTest, BlocksSplitAcrossTrainingRanksTakeTheAmaxPath) {
  const json train = LoadSample("tiny-dense/train.json");
  json infer = LoadSample("tiny-dense/infer.json");
  Quantize(infer, "model.layers.{layer}.self_attn.o_proj.weight",
           Quant("model.layers.{layer}.self_attn.o_proj.weight_scale", "fp8_e4m3", "tensor"));
  Quantize(infer, "model.layers.{layer}.mlp.down_proj.weight",
           Quant("model.layers.{layer}.mlp.down_proj.weight_scale", "fp8_e4m3", "channel"));
  const json bf16 = CompileValidateRun(train, LoadSample("tiny-dense/infer.json"));
  for (const char* flags : {"", "--requantize-on-receiver"}) {
    const json out = CompileValidateRun(train, infer, flags);
    // Every rank checks its values plus its scales: 4 layers x (1 of o_proj + 64 rows of down_proj) x 4 ranks.
    EXPECT_EQ(out.value("checked", 0), bf16.value("checked", 0) + 4 * (1 + 64) * 4) << flags;
    // The values move as in BF16 (inference TP4 takes a quarter of each row);
    // on top, per receiver and pipeline stage (layer 0; layers 1..3), one
    // grid of fp32 amaxes from each of the 2 training ranks for o_proj (1
    // block per layer) and for down_proj (64 rows per layer), each padded to
    // the 256-byte alignment of pieces in a message.
    auto padded = [](int64_t b) { return (b + 255) / 256 * 256; };
    const int64_t grids = 4 * 2 * (padded(1 * 4) + padded(3 * 4) + padded(64 * 4) + padded(3 * 64 * 4));
    EXPECT_EQ(out.value("bytes", 0), bf16.value("bytes", 0) + grids) << flags;
  }
}

// Training shards gate/up at row 64 of 128; blocks of 48 rows put rows 48:96
// on both training ranks (assembled) while rows 0:48 and 96:128 are whole on
// one (the sender quantizes those). MXFP8 (1x32 blocks) on o_proj, whose
// columns training cuts unevenly at 48: the blocks 32:64 are assembled.
TEST(QuantE2eTest, ShardEdgesInsideBlocksMixAssembledAndSenderQuantized) {
  json train = LoadSample("tiny-dense/train.json");
  PlacementOf(train, "model.layers.{layer}.self_attn.o_proj.weight")["tp"]["sizes"] = {48, 16};
  json infer = LoadSample("tiny-dense/infer.json");
  Quantize(infer, kGateUp, Quant(kGateUpScale, "fp8_e4m3", "block", {48, 32}));
  Quantize(infer, "model.layers.{layer}.self_attn.o_proj.weight",
           Quant("model.layers.{layer}.self_attn.o_proj.weight_scale", "mxfp8"));
  const json sender = CompileValidateRun(train, infer);
  const json receiver = CompileValidateRun(train, infer, "--requantize-on-receiver");
  EXPECT_EQ(sender.value("checked", 0), receiver.value("checked", 0));
  // The sender quantizes the whole blocks: fewer bytes than the receiver path.
  EXPECT_LT(sender.value("bytes", 0), receiver.value("bytes", 0));
}

// FP8 on the training side: the parts of a split block are dequantized by
// their senders and assembled at the receiver into a frame of the block's
// cover (BF16), quantized once when complete; colocated, the receiver's own
// part is copied (dequantized) into the frame before the others arrive.
TEST(QuantE2eTest, SplitBlocksFromFp8SourcesAreAssembledInAFrame) {
  json train = LoadSample("tiny-dense/train.json");
  Quantize(
      train, "decoder.layers.{layer.local}.self_attention.linear_proj.weight",
      Quant("decoder.layers.{layer.local}.self_attention.linear_proj.weight_scale_inv", "fp8_e4m3", "block", {32, 32}));
  json infer = LoadSample("tiny-dense/infer.json");
  Quantize(infer, "model.layers.{layer}.self_attn.o_proj.weight",
           Quant("model.layers.{layer}.self_attn.o_proj.weight_scale", "fp8_e4m3", "channel"));
  const json bf16 = CompileValidateRun(train, LoadSample("tiny-dense/infer.json"));
  const json disjoint = CompileValidateRun(train, infer);
  EXPECT_EQ(disjoint.value("ok", false), true);
  // Each receiver takes whole rows of o_proj (its per-channel blocks) instead
  // of its quarter: 3 quarters more per receiver and layer, in BF16.
  EXPECT_EQ(disjoint.value("bytes", 0), bf16.value("bytes", 0) + 4 * 4 * 3 * 64 * 16 * 2);
  json cluster = LoadSample("clusters/dgx-h100.json");
  cluster["placement"] = "colocated";
  const json colocated = CompileValidateRun(train, infer, "", cluster);
  EXPECT_EQ(colocated.value("ok", false), true);
  EXPECT_EQ(colocated.value("checked", 0), disjoint.value("checked", 0));
}

// Colocated on the amax path: a receiver that holds a part of the cover
// itself packs that part's amaxes straight into its grid area and copies its
// own values into the frame.
TEST(QuantE2eTest, AmaxPathColocated) {
  json infer = LoadSample("tiny-dense/infer.json");
  Quantize(infer, "model.layers.{layer}.self_attn.o_proj.weight",
           Quant("model.layers.{layer}.self_attn.o_proj.weight_scale", "fp8_e4m3", "tensor"));
  Quantize(infer, kGateUp, Quant(kGateUpScale, "fp8_e4m3", "channel"));
  json cluster = LoadSample("clusters/dgx-h100.json");
  cluster["placement"] = "colocated";
  const json out = CompileValidateRun(LoadSample("tiny-dense/train.json"), infer, "", cluster);
  EXPECT_EQ(out.value("ok", false), true);
}

// One pack, many sends: four TP1 replicas without NVLink exchange each get
// the same blocks from every source, which quantizes each block (FP8 values
// and scales) and computes each amax grid once for all four; the refit is
// still exact.
TEST(QuantE2eTest, ReplicasShareOneQuantizePerRound) {
  json infer = LoadSample("tiny-dense/infer-tp1-dp4.json");
  Quantize(infer, kGateUp, Quant(kGateUpScale, "fp8_e4m3", "block", {32, 32}));
  Quantize(infer, "model.layers.{layer}.mlp.down_proj.weight",
           Quant("model.layers.{layer}.mlp.down_proj.weight_scale", "fp8_e4m3", "channel"));
  TempDir dir;
  std::ofstream(dir.File("infer.json")) << infer.dump();
  const std::string plan = dir.File("q.rsplan");
  Result c = Shell(kBinary + " compile --json --no-nvlink-exchange --model " + kSamples + "/tiny-dense/model.json --from " +
                   kSamples + "/tiny-dense/train.json --to " + dir.File("infer.json") + " --cluster " + kSamples +
                   "/clusters/dgx-h100.json -o " + plan);
  ASSERT_EQ(c.exit_code, 0) << c.out;
  const json shared = json::parse(c.out)["shared_packs"];
  // Each source sends the same pieces to the replicas it serves, in one round.
  EXPECT_GT(shared.value("quantizing", 0), 0) << c.out;
  EXPECT_GT(shared.value("steps", 0), shared.value("quantizing", 0)) << c.out;
  EXPECT_EQ(Shell(kBinary + " validate " + plan).exit_code, 0);
  Result r = Shell(kBinary + " run " + plan + " --local --timeout 20 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json out = json::parse(r.out.substr(r.out.find('{')), nullptr, false);
  EXPECT_EQ(out.value("wrong", -1), 0) << r.out;
  EXPECT_GT(out.value("checked", 0), 0) << r.out;
}

// vLLM's stacked experts (w13_weight[E_local, 2I, H], the expert dim kept as a
// physical dim): block scales per expert, TP4 cutting the 32-row blocks of
// the 96-row experts, or EP8 with whole experts; MXFP8 attention.
TEST(QuantE2eTest, StackedExperts) {
  for (const char* layout : {"tiny-moe/infer.json", "tiny-moe/infer-ep.json"}) {
    json infer = LoadSample(layout);
    for (json& b : infer["buffers"]) {
      const std::string name = b["name"];
      if (name.find(".w13_weight") != std::string::npos || name.find(".w2_weight") != std::string::npos)
        b["quant"] = Quant(name + "_scale_inv", "fp8_e4m3", "block", {32, 32});
      else if (name.find("qkv") != std::string::npos)
        b["quant"] = Quant(name + "_scale", "mxfp8");
    }
    for (const char* flags : {"", "--requantize-on-receiver"}) {
      const json out = CompileValidateRun(LoadSample("tiny-moe/train.json"), infer, flags, LoadSample("clusters/dgx-h100.json"),
                                          "tiny-moe");
      EXPECT_EQ(out.value("ok", false), true) << layout << " " << flags;
    }
  }
}

TEST(QuantE2eTest, ShowNamesQuantOps) {
  TempDir dir;
  json infer = LoadSample("tiny-dense/infer.json");
  Quantize(infer, kGateUp, Quant(kGateUpScale, "fp8_e4m3", "block", {64, 32}));
  std::ofstream(dir.File("infer.json")) << infer.dump();
  const std::string compile = kBinary + " compile -q --model " + kSamples + "/tiny-dense/model.json --from " +
                              kSamples + "/tiny-dense/train.json --to " + dir.File("infer.json") + " --cluster " +
                              kSamples + "/clusters/dgx-h100.json -o " + dir.File("q.rsplan");
  ASSERT_EQ(Shell(compile + " --requantize-on-receiver").exit_code, 0);
  Result r = Shell(kBinary + " show " + dir.File("q.rsplan") + " --rank 8");
  EXPECT_NE(r.out.find(" into 'model.layers.0.mlp.gate_up_proj.weight' @0 (32,64):(64,1), quantizing over blocks of "
                       "64x32 from (0,0), scales fp32 into 'model.layers.0.mlp.gate_up_proj.weight_scale_inv' @0 "
                       "(1,2):(2,1)"),
            std::string::npos)
      << r.out;
  ASSERT_EQ(Shell(compile).exit_code, 0);
  r = Shell(kBinary + " show " + dir.File("q.rsplan") + " --rank 0");
  EXPECT_NE(r.out.find(" pack 2.00 KiB fp8_e4m3 from 'decoder.layers.0.mlp.linear_fc1.weight' @0 (64,64):(64,1) into "
                       "staging @"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(32,64):(64,1), quantizing over blocks of 64x32 from (32,0), scales fp32 into staging @"),
            std::string::npos)
      << r.out;
}

TEST(QuantE2eTest, ShowNamesAmaxOps) {
  TempDir dir;
  json infer = LoadSample("tiny-dense/infer.json");
  Quantize(infer, "model.layers.{layer}.mlp.down_proj.weight",
           Quant("model.layers.{layer}.mlp.down_proj.weight_scale", "fp8_e4m3", "channel"));
  std::ofstream(dir.File("infer.json")) << infer.dump();
  Result c = Shell(kBinary + " compile --model " + kSamples + "/tiny-dense/model.json --from " + kSamples +
                   "/tiny-dense/train.json --to " + dir.File("infer.json") + " --cluster " + kSamples +
                   "/clusters/dgx-h100.json -o " + dir.File("q.rsplan"));
  ASSERT_EQ(c.exit_code, 0) << c.out;
  // 4 inference ranks x 2 groups (layer 0; layers 1..3, the pipeline stages).
  EXPECT_NE(c.out.find("\n  8 groups of scale blocks that several training ranks hold parts of, quantized by their "
                       "receivers: 8 with scales from partial amaxes, 0 assembled whole in a frame (FP8 sources)\n"),
            std::string::npos)
      << c.out;
  // Training rank 0 (stage 0, TP rank 0) sends layer 0's partial amaxes over columns 0..64 of 128.
  Result r = Shell(kBinary + " show " + dir.File("q.rsplan") + " --rank 0");
  EXPECT_NE(
      r.out.find(" pack 256 B fp32 from 'decoder.layers.0.mlp.linear_fc2.weight' @0 (64,64):(64,1) into staging @"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(64,1):(1,1), block amaxes over blocks of 1x128 from (0,0)"), std::string::npos) << r.out;
  r = Shell(kBinary + " show " + dir.File("q.rsplan") + " --rank 8");
  EXPECT_NE(r.out.find(" into 'model.layers.0.mlp.down_proj.weight_scale' @0 (64,1):(1,1), fp32 scales of the largest "
                       "amaxes (blocks of 1x128)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(" into 'model.layers.0.mlp.down_proj.weight' @0 (64,32):(32,1), quantizing over blocks of 1x128 "
                       "from (0,0) with the scales 'model.layers.0.mlp.down_proj.weight_scale' @0 (64,1):(1,1)"),
            std::string::npos)
      << r.out;
  r = Shell(kBinary + " show " + dir.File("q.rsplan") + " --rank 8 --json");
  const json j = json::parse(r.out);
  std::map<std::string, int> kinds;
  for (const json& s : j["per_rank"][0]["program"])
    if (s.contains("quant")) ++kinds[s["quant"]["kind"].get<std::string>()];
  // Layer 0 and layers 1..3 (two pipeline stages): one group each.
  EXPECT_EQ(kinds["scale_from_amax"], 2) << r.out;
  EXPECT_EQ(kinds["quantize_scaled"], 2) << r.out;
}

TEST(QuantE2eTest, GatherRefusesQuantizedLayouts) {
  json infer = LoadSample("tiny-dense/infer.json");
  Quantize(infer, kGateUp, Quant(kGateUpScale, "mxfp8"));
  Result c = CompileOnly(LoadSample("tiny-dense/train.json"), infer, "--strategy gather");
  EXPECT_EQ(c.exit_code, 2) << c.out;
  EXPECT_EQ(c.out, "reshard: error: --strategy gather: tensor 'model.layers.{layer}.mlp.gate_proj.weight' is stored "
                   "quantized; quantized layouts are routed by the direct strategy only\n");
}

}  // namespace
}  // namespace reshard
