// Quantized layouts: the `quant` rule, scale buffers and scale fragments.
#include <gtest/gtest.h>

#include "compiler/expand.h"
#include "compiler/quant_route.h"
#include "compiler/test.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using nlohmann::json;
using testing::ErrorOf;

json Model() {
  return json::parse(R"({"format": "reshard.model/1", "name": "q", "dtype": "bf16", "dims": {"layer": 2},
    "tensors": [{"name": "layers.{layer}.gate", "shape": [8, 12]},
                {"name": "layers.{layer}.up", "shape": [8, 12]},
                {"name": "layers.{layer}.down", "shape": [12, 8]},
                {"name": "layers.{layer}.norm", "shape": [12]}]})");
}

json Train() {
  return json::parse(R"({"format": "reshard.layout/1", "name": "train", "ranks": 2,
    "meshes": {"dense": [["tp", 2]]},
    "placements": [{"match": "*", "mesh": "dense"}]})");
}

// TP2 over rows of gate/up (4 rows each per rank) and columns of down.
json Infer(json quant) {
  json i = json::parse(R"({"format": "reshard.layout/1", "name": "infer", "ranks": 2, "default_buffers": true,
    "meshes": {"dense": [["tp", 2]]},
    "placements": [{"match": "layers.{layer}.down", "tp": {"shard": 1}},
                   {"match": "layers.{layer}.norm"},
                   {"match": "*", "tp": {"shard": 0}}],
    "buffers": [{"name": "layers.{layer}.gate_up", "parts": ["layers.{layer}.gate", "layers.{layer}.up"], "concat": 0},
                {"name": "layers.{layer}.down", "tensor": "layers.{layer}.down"}]})");
  i["buffers"][0]["quant"] = quant;
  i["buffers"][0]["quant"]["scale_name"] = "layers.{layer}.gate_up_scale";
  return i;
}

CompileInputs Inputs(const json& infer) { return ParseInputs(Model(), Train(), infer, testing::TinyCluster()); }

std::string ParseError(const json& infer) { return ErrorOf([&] { Expand(Inputs(infer).model, Inputs(infer).dst); }); }

const BufferDesc* Find(const RankLayout& rl, const std::string& name) {
  for (const BufferDesc& b : rl.buffers)
    if (b.name == name) return &b;
  return nullptr;
}

TEST(QuantLayout, BlockScalesCoverTheBlocksARankTouches) {
  // Blocks of 2x8: rank 1 holds rows 4..8 of gate and of up: block rows 2..4, block cols 0..2 (12 = 8 + 4).
  CompileInputs in = Inputs(Infer(json::parse(R"({"format": "fp8_e4m3", "scale": "block", "block": [2, 8]})")));
  Expansion e = Expand(in.model, in.dst);
  ASSERT_EQ(e.scales.size(), 2u);
  EXPECT_EQ(e.scales[0].name, "layers.{layer}.gate#scale");
  EXPECT_EQ(e.scales[0].of, 0);
  EXPECT_EQ(e.scales[0].dtype, Dtype::fp32);
  EXPECT_EQ(e.scales[0].box.str(), "[0:2, 0:4, 0:2]");
  const RankLayout& r1 = e.ranks[1];
  const BufferDesc* data = Find(r1, "layers.0.gate_up");
  const BufferDesc* scale = Find(r1, "layers.0.gate_up_scale");
  ASSERT_TRUE(data && scale);
  EXPECT_EQ(data->dtype, Dtype::fp8_e4m3);
  EXPECT_EQ(data->shape, (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(scale->dtype, Dtype::fp32);
  EXPECT_EQ(scale->shape, (std::vector<int64_t>{4, 2}));  // gate's 2 block rows, then up's
  // The down buffer stays bf16 and gets no scales.
  EXPECT_EQ(Find(r1, "layers.0.down")->dtype, Dtype::bf16);
  int scale_frags = 0;
  for (const Fragment& f : r1.fragments) {
    if (f.tensor < 4) continue;
    ++scale_frags;
    const bool up = f.tensor == 5;
    EXPECT_EQ(f.box.str(), "[0:2, 2:4, 0:2]");  // one buffer per layer
    EXPECT_EQ(f.buffer_dims, 1u);
    EXPECT_EQ(f.offset, up ? 4u : 0u);  // up's scales after gate's two rows of 2
    EXPECT_EQ(f.stride[1], 2);
  }
  EXPECT_EQ(scale_frags, 2);
  for (const auto& list : e.by_tensor)
    for (const FragmentRef& fr : list) EXPECT_LT(e.ranks[fr.rank].fragments[fr.index].tensor, 4);
}

TEST(QuantLayout, ShardEdgesCuttingABlockShareItsScale) {
  // Blocks of 8 rows: both ranks hold half of block row 0 and both keep its scale.
  CompileInputs in = Inputs(Infer(json::parse(R"({"format": "fp8_e4m3", "scale": "block", "block": [8, 8]})")));
  Expansion e = Expand(in.model, in.dst);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(Find(e.ranks[r], "layers.1.gate_up_scale")->shape, (std::vector<int64_t>{2, 2}));
    for (const Fragment& f : e.ranks[r].fragments) {
      if (f.tensor >= 4) {
        EXPECT_EQ(f.box.str(), "[0:2, 0:1, 0:2]");
      }
    }
  }
}

TEST(QuantLayout, ChannelTensorAndMxfp8Scales) {
  CompileInputs ch = Inputs(Infer(json::parse(R"({"format": "fp8_e4m3", "scale": "channel"})")));
  Expansion e = Expand(ch.model, ch.dst);
  EXPECT_EQ(e.scales[0].box.str(), "[0:2, 0:8, 0:1]");
  EXPECT_EQ(Find(e.ranks[0], "layers.0.gate_up_scale")->shape, (std::vector<int64_t>{8, 1}));
  CompileInputs te = Inputs(Infer(json::parse(R"({"format": "fp8_e4m3", "scale": "tensor"})")));
  e = Expand(te.model, te.dst);
  EXPECT_EQ(e.scales[1].box.str(), "[0:2, 0:1, 0:1]");
  EXPECT_EQ(Find(e.ranks[0], "layers.0.gate_up_scale")->shape, (std::vector<int64_t>{2, 1}));
  CompileInputs mx = Inputs(Infer(json::parse(R"({"format": "mxfp8"})")));
  e = Expand(mx.model, mx.dst);
  EXPECT_EQ(e.scales[0].dtype, Dtype::e8m0);
  EXPECT_EQ(e.scales[0].block[1], 1);
  EXPECT_EQ(e.scales[0].block[2], 12);  // a block of 32 clipped to the 12 columns
  EXPECT_EQ(Find(e.ranks[1], "layers.1.gate_up_scale")->shape, (std::vector<int64_t>{8, 1}));
  EXPECT_EQ(Find(e.ranks[1], "layers.1.gate_up_scale")->dtype, Dtype::e8m0);
}

TEST(QuantLayout, BadQuantRules) {
  auto with = [](const char* q) { return Infer(json::parse(q)); };
  // Suggestions stay within the format's kind: E5M2 is not E4M3, MXFP4 not MXFP8.
  EXPECT_EQ(ParseError(with(R"({"format": "fp8_e5m2", "scale": "block"})")),
            "infer.json: /buffers/0/quant/format: unknown quant format 'fp8_e5m2', expected 'fp8_e4m3' or 'mxfp8'");
  EXPECT_EQ(ParseError(with(R"({"format": "mxfp4"})")),
            "infer.json: /buffers/0/quant/format: unknown quant format 'mxfp4', expected 'fp8_e4m3' or 'mxfp8'");
  EXPECT_EQ(ParseError(with(R"({"format": "fp8", "scale": "block"})")),
            "infer.json: /buffers/0/quant/format: unknown quant format 'fp8', expected 'fp8_e4m3' or 'mxfp8'; "
            "did you mean 'fp8_e4m3'?");
  EXPECT_EQ(ParseError(with(R"({"format": "fp8-e4m3", "scale": "block"})")),
            "infer.json: /buffers/0/quant/format: unknown quant format 'fp8-e4m3', expected 'fp8_e4m3' or 'mxfp8'; "
            "did you mean 'fp8_e4m3'?");
  EXPECT_EQ(ParseError(with(R"({"format": "fp8_e4m3"})")),
            "infer.json: /buffers/0/quant: missing required field 'scale'");
  EXPECT_EQ(ParseError(with(R"({"format": "fp8_e4m3", "scale": "blok", "block": [2, 2]})")),
            "infer.json: /buffers/0/quant/scale: unknown scale 'blok', expected 'block', 'channel' or 'tensor'; did you "
            "mean 'block'?");
  EXPECT_EQ(ParseError(with(R"({"format": "fp8_e4m3", "scale": "block", "block": [128]})")),
            "infer.json: /buffers/0/quant/block: expected [rows, cols], got 1 entries");
  EXPECT_EQ(ParseError(with(R"({"format": "fp8_e4m3", "scale": "block", "block": [0, 128]})")),
            "infer.json: /buffers/0/quant/block/0: expected an integer >= 1, got 0");
  EXPECT_EQ(ParseError(with(R"({"format": "fp8_e4m3", "scale": "tensor", "block": [1, 1]})")),
            "infer.json: /buffers/0/quant/block: only \"scale\": \"block\" takes a block shape");
  EXPECT_EQ(ParseError(with(R"({"format": "mxfp8", "block": [1, 32]})")),
            "infer.json: /buffers/0/quant/block: mxfp8 always has e8m0 scales over blocks of 1x32; leave out \"block\"");
  EXPECT_EQ(ParseError(with(R"({"format": "mxfp8", "scales": "x"})")),
            "infer.json: /buffers/0/quant/scales: unknown field 'scales'; did you mean 'scale'?");
  json i = with(R"({"format": "mxfp8"})");
  i["buffers"][0]["quant"]["scale_name"] = "gate_up_scale";
  EXPECT_EQ(ParseError(i),
            "infer.json: /buffers/0/quant/scale_name: placeholders must be those of the buffer's name, in the same order");
  i["buffers"][0]["quant"]["scale_name"] = "layers.{layer}.gate_up";
  EXPECT_EQ(ParseError(i), "infer.json: /buffers/0/quant/scale_name: the scale buffer needs a name of its own");
  i = with(R"({"format": "mxfp8"})");
  i["buffers"][0]["dtype"] = "bf16";
  EXPECT_EQ(ParseError(i), "infer.json: /buffers/0/dtype: a quantized buffer holds fp8_e4m3, not bf16");
  i = with(R"({"format": "mxfp8"})");
  i["buffers"][0].erase("concat");
  i["buffers"][0]["interleave"] = {{"dim", 0}, {"groups", 2}};
  EXPECT_EQ(ParseError(i), "infer.json: /buffers/0/quant: a buffer fused with \"interleave\" cannot be quantized");
  i = with(R"({"format": "mxfp8"})");
  i["buffers"][0]["shape"] = {8, 16};
  EXPECT_EQ(ParseError(i), "infer.json: /buffers/0/quant: a padded buffer (\"shape\") cannot be quantized");
  i = with(R"({"format": "mxfp8"})");
  i["buffers"].push_back({{"name", "layers.{layer}.norm"}, {"tensor", "layers.{layer}.norm"},
                          {"quant", {{"format", "mxfp8"}, {"scale_name", "layers.{layer}.norm_scale"}}}});
  EXPECT_EQ(ParseError(i),
            "infer.json: /buffers/2/quant: tensor 'layers.{layer}.norm' has 1 dim in its shape; quantized tensors need "
            "at least 2 (rows, cols)");
  i = with(R"({"format": "fp8_e4m3", "scale": "block", "block": [2, 2]})");
  i["placements"][2]["tp"] = {{"shard", 0}, {"cyclic", 1}};
  EXPECT_EQ(ParseError(i),
            "infer.json: /buffers/0/quant: rank 0 holds dim 0 of 'layers.{layer}.gate' in 4 pieces; a quantized dim "
            "must be held in one piece");
}

// QuantRouter::Pieces on gate (tensor 0): rank 1 needs rows 4..8 of both layers.
struct PieceFixture {
  CompileInputs in;
  Expansion src, dst;
  FragmentRef sf{0, 0}, df{1, 0};
  Box cell, need;
  explicit PieceFixture(const json& quant) : in(Inputs(Infer(quant))), src(Expand(in.model, in.src)), dst(Expand(in.model, in.dst)) {
    cell = src.ranks[0].fragments[0].box;
    need = dst.ranks[1].fragments[0].box;
  }
  std::vector<std::string> Pieces(bool on_sender, uint64_t max_bytes, uint64_t block_max_bytes = 0) const {
    QuantRouter q(in.model, in.src, src, in.dst, dst, on_sender);
    std::vector<std::string> out;
    for (const QuantPiece& p : q.Pieces(0, sf, cell, df, need, max_bytes, block_max_bytes))
      out.push_back(p.need.str() + " reads " + p.read.str() + " " + std::to_string(p.bytes) + " B" +
                    (p.quantize_sender ? " sender" : "") + (p.quantize_receiver ? " receiver" : ""));
    return out;
  }
};

TEST(QuantPieces, SenderSendsFp8AndScalesReceiverReadsTheBlockCover) {
  PieceFixture whole(json::parse(R"({"format": "fp8_e4m3", "scale": "block", "block": [2, 8]})"));
  EXPECT_EQ(whole.need.str(), "[0:2, 4:8, 0:12]");
  // 96 FP8 values (aligned to 256 bytes) and 2 x 2 x 2 fp32 scales; or 96 bf16 values.
  EXPECT_EQ(whole.Pieces(true, 1 << 20), std::vector<std::string>{"[0:2, 4:8, 0:12] reads [0:2, 4:8, 0:12] 288 B sender"});
  EXPECT_EQ(whole.Pieces(false, 1 << 20),
            std::vector<std::string>{"[0:2, 4:8, 0:12] reads [0:2, 4:8, 0:12] 192 B receiver"});
  // Blocks of 8 rows: rank 1's rows 4..8 are half a block; its piece reads the whole block.
  PieceFixture cut(json::parse(R"({"format": "fp8_e4m3", "scale": "block", "block": [8, 8]})"));
  EXPECT_EQ(cut.Pieces(false, 1 << 20),
            std::vector<std::string>{"[0:2, 4:8, 0:12] reads [0:2, 0:8, 0:12] 384 B receiver"});
}

TEST(QuantPieces, SplitOnlyAtBlockEdges) {
  PieceFixture f(json::parse(R"({"format": "fp8_e4m3", "scale": "block", "block": [2, 8]})"));
  EXPECT_EQ(f.Pieces(false, 50), (std::vector<std::string>{"[0:1, 4:6, 0:12] reads [0:1, 4:6, 0:12] 48 B receiver",
                                                           "[0:1, 6:8, 0:12] reads [0:1, 6:8, 0:12] 48 B receiver",
                                                           "[1:2, 4:6, 0:12] reads [1:2, 4:6, 0:12] 48 B receiver",
                                                           "[1:2, 6:8, 0:12] reads [1:2, 6:8, 0:12] 48 B receiver"}));
  PieceFixture big(json::parse(R"({"format": "fp8_e4m3", "scale": "block", "block": [8, 8]})"));
  EXPECT_EQ(ErrorOf([&] { big.Pieces(false, 100); }),
            "infer.json: tensor 'layers.{layer}.gate': the piece [0:1, 4:8, 0:8] for inference rank 1 is one block of "
            "8x8 and does not fit 100 staging bytes; raise --staging-mb");
  // The finer routing cuts pieces to a sixteenth of an arena
  // (kQuantPiecesPerArena) but lets a piece of one block, which cannot be
  // cut, take half of it.
  EXPECT_EQ(big.Pieces(false, 100, 200), (std::vector<std::string>{"[0:1, 4:8, 0:8] reads [0:1, 0:8, 0:8] 128 B receiver",
                                                                    "[0:1, 4:8, 8:12] reads [0:1, 0:8, 8:12] 64 B receiver",
                                                                    "[1:2, 4:8, 0:8] reads [1:2, 0:8, 0:8] 128 B receiver",
                                                                    "[1:2, 4:8, 8:12] reads [1:2, 0:8, 8:12] 64 B receiver"}));
  EXPECT_EQ(ErrorOf([&] { big.Pieces(false, 100, 120); }),
            "infer.json: tensor 'layers.{layer}.gate': the piece [0:1, 4:8, 0:8] for inference rank 1 is one block of "
            "8x8 and does not fit 120 staging bytes; raise --staging-mb");
}

// Training TP2 over the columns of gate and up (6 of 12 each): a per-tensor
// or per-channel block of gate_up lies on both training ranks. With
// `fp8_source`, training holds gate and up as FP8 (blocks of 2x6), which
// takes the frame path; otherwise the amax path.
struct AssembleFixture {
  explicit AssembleFixture(json quant, bool fp8_source = false, uint64_t staging_mb = 2, json model = Model(),
                           json cluster = testing::TinyCluster()) {
    json train = Train();
    train["default_buffers"] = true;
    train["placements"] = json::parse(R"([{"match": "layers.{layer}.gate", "mesh": "dense", "tp": {"shard": 1}},
                                          {"match": "layers.{layer}.up", "mesh": "dense", "tp": {"shard": 1}},
                                          {"match": "*", "mesh": "dense"}])");
    if (fp8_source) {
      for (const char* t : {"gate", "up"}) {
        const std::string name = std::string("layers.{layer}.") + t;
        train["buffers"].push_back(
            {{"name", name},
             {"tensor", name},
             {"quant",
              {{"format", "fp8_e4m3"}, {"scale", "block"}, {"block", {2, 6}}, {"scale_name", name + "_scale_inv"}}}});
      }
    }
    if (cluster.contains("placement")) {  // colocated: the training side's buffers need names of their own
      for (const char* t : {"gate", "up", "down", "norm"}) {
        const std::string name = std::string("layers.{layer}.") + t;
        train["buffers"].push_back({{"name", "train." + name}, {"tensor", name}});
      }
    }
    in = ParseInputs(model, train, Infer(quant), cluster);
    CompileOptions opt;
    opt.staging_mb = staging_mb;
    error = ErrorOf([&] { ir = BuildPlan(in, opt); });
  }
  ValidateReport Validate() { return testing::ValidateBytes(EmitPlan(in, ir)); }
  // The first round of `rank`'s program with an unpack of quant kind `kind`.
  Round* RoundWith(uint32_t rank, QuantKind kind) {
    for (Round& r : ir.ranks[rank].rounds)
      for (const Step& u : r.unpack)
        if (u.quant >= 0 && ir.ranks[rank].quant_ops[u.quant].kind == kind) return &r;
    return nullptr;
  }
  int Count(uint32_t rank, const Round& r, QuantKind kind) const {
    int n = 0;
    for (const std::vector<Step>* v : {&r.local, &r.unpack})
      for (const Step& s : *v) n += s.quant >= 0 && ir.ranks[rank].quant_ops[s.quant].kind == kind;
    return n;
  }
  bool IntoStaging(uint32_t rank, const Step& s) const { return ir.ranks[rank].regions[s.dst].buffer == kStaging; }
  CompileInputs in;
  PlanIR ir;
  std::string error;
};

TEST(QuantAssemble, AmaxPathSendsGridsAndTheNeedOnly) {
  for (const char* scale : {"tensor", "channel"}) {
    AssembleFixture f(json{{"format", "fp8_e4m3"}, {"scale", scale}});
    ASSERT_EQ(f.error, "") << scale;
    ValidateReport r = f.Validate();
    EXPECT_TRUE(r.ok()) << scale << ": " << (r.errors.empty() ? "" : r.errors[0]);
    // Inference rank 0 (global 2), per tensor (gate, up; both layers in one
    // group): two grids arrive, one from each training rank, then the scales
    // of their largest amaxes, then the need quantized with them.
    Round* round = f.RoundWith(2, QuantKind::scale_from_amax);
    ASSERT_NE(round, nullptr) << scale;
    EXPECT_EQ(f.Count(2, *round, QuantKind::scale_from_amax), 2) << scale;
    EXPECT_EQ(f.Count(2, *round, QuantKind::quantize_scaled), 2) << scale;
    // The grids ride in the senders' messages and are copied into the area.
    int grids = 0;
    for (const Step& u : round->unpack) grids += u.quant < 0 && u.wire == Dtype::fp32 && f.IntoStaging(2, u);
    EXPECT_EQ(grids, 4) << scale;
    // Scales before the values that use them.
    for (size_t k = 0; k < round->unpack.size(); ++k) {
      const Step& u = round->unpack[k];
      if (u.quant < 0 || f.ir.ranks[2].quant_ops[u.quant].kind != QuantKind::quantize_scaled) continue;
      bool before = false;
      for (size_t j = 0; j < k; ++j)
        before = before || (round->unpack[j].quant >= 0 &&
                            f.ir.ranks[2].quant_ops[round->unpack[j].quant].kind == QuantKind::scale_from_amax);
      EXPECT_TRUE(before) << scale;
    }
    // The senders: each packs one grid per tensor for each of the 2 receivers.
    int packs = 0;
    for (const Round& x : f.ir.ranks[0].rounds) packs += f.Count(0, x, QuantKind::amax);
    EXPECT_EQ(packs, 4) << scale;
  }
}

// Colocated, GPU 0 is training rank 0 (columns 0..6 of gate and up) and
// inference rank 0 (rows 0..4): the grid of its own part is packed straight
// into its grid area and its own values copied into the frame; only GPU 1's
// part arrives by message.
TEST(QuantAssemble, ColocatedPartsStayLocal) {
  json cluster = testing::TinyCluster();
  cluster["placement"] = "colocated";
  AssembleFixture f(json{{"format", "fp8_e4m3"}, {"scale", "channel"}}, false, 2, Model(), cluster);
  ASSERT_EQ(f.error, "");
  ValidateReport r = f.Validate();
  EXPECT_TRUE(r.ok()) << (r.errors.empty() ? "" : r.errors[0]);
  Round* round = f.RoundWith(0, QuantKind::scale_from_amax);
  ASSERT_NE(round, nullptr);
  const RankProgram& p = f.ir.ranks[0];
  // The byte spans of the grid areas the round's scale_from_amax ops read.
  std::vector<std::pair<uint64_t, uint64_t>> areas;
  for (const Step& u : round->unpack)
    if (u.quant >= 0 && p.quant_ops[u.quant].kind == QuantKind::scale_from_amax) {
      const StridedRegion& g = p.regions[u.src];
      areas.push_back({g.offset * 4, (g.offset + g.shape[0] * g.stride[0]) * 4});
    }
  int local_grids = 0, local_values = 0;
  for (const Step& l : round->local) {
    if (l.quant >= 0 && p.quant_ops[l.quant].kind == QuantKind::amax)
      for (const auto& [lo, hi] : areas) local_grids += l.staging >= lo && l.staging < hi;
    local_values += l.kind == StepKind::copy && f.IntoStaging(0, l);
  }
  EXPECT_EQ(areas.size(), 2u);  // gate and up
  EXPECT_EQ(local_grids, 2);
  EXPECT_EQ(local_values, 2);
}

TEST(QuantAssemble, Fp8SourcePartsAreAssembledInOneRound) {
  AssembleFixture f(json{{"format", "fp8_e4m3"}, {"scale", "channel"}}, true);
  ASSERT_EQ(f.error, "");
  ValidateReport r = f.Validate();
  EXPECT_TRUE(r.ok()) << (r.errors.empty() ? "" : r.errors[0]);
  Round* round = f.RoundWith(2, QuantKind::quantize);
  ASSERT_NE(round, nullptr);
  int parts = 0, quantizes = 0;
  bool seen_quantize = false;
  for (const Step& u : round->unpack) {
    if (u.quant >= 0) {
      ++quantizes, seen_quantize = true;
      EXPECT_EQ(f.ir.ranks[2].regions[u.src].buffer, kStaging);
    } else if (f.IntoStaging(2, u)) {
      ++parts;
      EXPECT_FALSE(seen_quantize) << "a part unpacked after the quantize that reads its frame";
    }
  }
  // gate and up, each assembled from 2 parts (both layers in one frame).
  EXPECT_EQ(parts, 4);
  EXPECT_EQ(quantizes, 2);
}

TEST(QuantAssemble, ValidateCatchesBrokenFrames) {
  AssembleFixture f(json{{"format", "fp8_e4m3"}, {"scale", "tensor"}}, true);
  ASSERT_EQ(f.error, "");
  ASSERT_TRUE(f.Validate().ok());
  Round* round = f.RoundWith(2, QuantKind::quantize);
  ASSERT_NE(round, nullptr);
  auto first_part = [&] {
    for (size_t i = 0; i < round->unpack.size(); ++i)
      if (round->unpack[i].quant < 0 && f.IntoStaging(2, round->unpack[i])) return i;
    return round->unpack.size();
  };
  const std::vector<Step> good = round->unpack;
  // A part never unpacked: its frame is incomplete when quantized.
  round->unpack.erase(round->unpack.begin() + static_cast<long>(first_part()));
  std::vector<std::string> errors = f.Validate().errors;
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors[0].find("the rest of the block cover was never written"), std::string::npos) << errors[0];
  // The quantize before the parts: the frame holds nothing yet.
  round->unpack = good;
  std::stable_partition(round->unpack.begin(), round->unpack.end(), [](const Step& u) { return u.quant >= 0; });
  errors = f.Validate().errors;
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors[0].find("holds no data"), std::string::npos) << errors[0];
  // A part unpacked twice.
  round->unpack = good;
  round->unpack.insert(round->unpack.begin() + static_cast<long>(first_part()), good[first_part()]);
  errors = f.Validate().errors;
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors[0].find("overlap"), std::string::npos) << errors[0];
}

TEST(QuantAssemble, ValidateCatchesBrokenAmaxPaths) {
  AssembleFixture f(json{{"format", "fp8_e4m3"}, {"scale", "channel"}});
  ASSERT_EQ(f.error, "");
  ASSERT_TRUE(f.Validate().ok());
  Round* round = f.RoundWith(2, QuantKind::scale_from_amax);
  ASSERT_NE(round, nullptr);
  RankProgram& p = f.ir.ranks[2];
  auto first = [&](QuantKind kind) {
    for (size_t i = 0; i < round->unpack.size(); ++i)
      if (round->unpack[i].quant >= 0 && p.quant_ops[round->unpack[i].quant].kind == kind) return i;
    return round->unpack.size();
  };
  const std::vector<Step> good = round->unpack;
  // Scales from one grid of two: half of each row's amax is missing.
  const uint32_t grids = good[first(QuantKind::scale_from_amax)].src;
  const StridedRegion both = p.regions[grids];
  p.regions[grids].shape[0] = 1;
  std::vector<std::string> errors = f.Validate().errors;
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors[0].find("out of its blocks' amaxes"), std::string::npos) << errors[0];
  p.regions[grids] = both;
  // Values quantized before their scales were taken.
  std::swap(round->unpack[first(QuantKind::scale_from_amax)], round->unpack[first(QuantKind::quantize_scaled)]);
  errors = f.Validate().errors;
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors[0].find("taken from amaxes before it"), std::string::npos) << errors[0];
  round->unpack = good;
  // The grid of one sender read as another's: the same part twice.
  p.regions[grids].stride[0] = 0;
  errors = f.Validate().errors;
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors[0].find("both hold the amax"), std::string::npos) << errors[0];
}

// The bundled per-channel FP8 sample: o_proj's rows lie on the 4 ranks of
// training TP, so every inference rank's o_proj takes the amax path; the
// plan is proven, and moves about half the bytes of the BF16 one.
TEST(QuantAssemble, Qwen3PerChannelSampleTakesTheAmaxPath) {
  const std::string train = testing::Sample("qwen3-235b/train-tp4-pp8-ep16.json");
  const std::string model = testing::Sample("qwen3-235b/model.json"), cluster = testing::Sample("clusters/dgx-h100.json");
  CompileInputs fp8 = LoadInputs(model, train, testing::Sample("qwen3-235b/infer-tp8-dp16-fp8-channel.json"), cluster);
  CompileInputs bf16 = LoadInputs(model, train, testing::Sample("qwen3-235b/infer-tp8-dp16.json"), cluster);
  const PlanIR ir = BuildPlan(fp8, CompileOptions{});
  // Every one of the 128 inference ranks, at least one group per pipeline stage of o_proj.
  EXPECT_GE(ir.amax_assemblies, 128u * 8u);
  EXPECT_EQ(ir.amax_assemblies % 128, 0u);
  EXPECT_EQ(ir.frame_assemblies, 0u);
  const ValidateReport r = testing::ValidateBytes(EmitPlan(fp8, ir));
  EXPECT_TRUE(r.ok()) << (r.errors.empty() ? "" : r.errors[0]);
  const PlanIR ref = BuildPlan(bf16, CompileOptions{});
  EXPECT_LT(ir.net_bytes, ref.net_bytes * 53 / 100);
  EXPECT_GT(ir.net_bytes, ref.net_bytes * 50 / 100);
}

TEST(QuantAssemble, CoverLargerThanTheStagingBudgetIsRefused) {
  // One per-tensor block of 2048 x 2048 bf16 (8 MiB) that training TP2 splits
  // by columns; each inference rank needs half of its rows (4 MiB), from both
  // training ranks: the two halves and the frame they land in, and two amax grids.
  json model = json::parse(R"({"format": "reshard.model/1", "name": "big", "dtype": "bf16", "dims": {"layer": 1},
    "tensors": [{"name": "layers.{layer}.gate", "shape": [2048, 2048]},
                {"name": "layers.{layer}.up", "shape": [2048, 2048]},
                {"name": "layers.{layer}.down", "shape": [2048, 2048]},
                {"name": "layers.{layer}.norm", "shape": [2048]}]})");
  AssembleFixture f(json{{"format", "fp8_e4m3"}, {"scale", "tensor"}}, false, 8, model);
  EXPECT_EQ(f.error,
            "infer.json: tensor 'layers.{layer}.gate': inference rank 0 quantizes [0:1, 0:1024, 0:2048] over "
            "blocks that 2 training cells share; receiving it takes 8389632 bytes of staging in one round, "
            "more than the 4194304 a round may use (half of --staging-mb 8); raise --staging-mb to at least 17");
  // From FP8 sources the whole cover is assembled: its frame and its two halves.
  AssembleFixture frame(json{{"format", "fp8_e4m3"}, {"scale", "tensor"}}, true, 8, model);
  EXPECT_EQ(frame.error,
            "infer.json: tensor 'layers.{layer}.gate': inference rank 0 quantizes [0:1, 0:1024, 0:2048] "
            "over blocks that 2 training cells share; assembling their cover [0:1, 0:2048, 0:2048] takes "
            "16777216 bytes of staging in one round, more than the 4194304 a round may use (half of "
            "--staging-mb 8); raise --staging-mb to at least 32");
  AssembleFixture roomy(json{{"format", "fp8_e4m3"}, {"scale", "tensor"}}, false, 64, model);
  EXPECT_EQ(roomy.error, "");
  EXPECT_TRUE(roomy.Validate().ok());
}

}  // namespace
}  // namespace reshard

namespace reshard {
namespace {

using testing::QuantPath;
using testing::QuantPlan;

std::vector<std::string> Problems(const testing::PlanSpec& spec) {
  ValidateReport r = testing::ValidateBytes(testing::BuildPlan(spec));
  return r.errors;
}

TEST(QuantValidate, HandBuiltPathsAreCorrect) {
  for (QuantPath path : {QuantPath::requantize, QuantPath::sender_quantizes, QuantPath::fp8_source}) {
    ValidateReport r = testing::ValidateBytes(testing::BuildPlan(QuantPlan(path)));
    EXPECT_TRUE(r.ok()) << static_cast<int>(path) << ": " << (r.errors.empty() ? "" : r.errors[0]);
    // The destination's 16 values, and its 4 scales where it is quantized.
    EXPECT_EQ(r.dest_elements, path == QuantPath::fp8_source ? 16u : 20u);
  }
}

TEST(QuantValidate, PlantedFaults) {
  testing::PlanSpec spec = QuantPlan(QuantPath::requantize);
  fb::QuantOp& op = spec.programs[1].quant_ops[0];
  op = testing::MakeQuant(op.step(), op.kind(), op.scale(), {2, 0}, {2, 4});
  EXPECT_EQ(Problems(spec), (std::vector<std::string>{
                                "rank 1 round 0 step 1 (unpack): writes w [2:4, 0:8] into the place of w [1:3, 0:8]",
                                "rank 1: w [1:3, 0:8]: 16 of 16 elements are never written"}));
  // The sender quantizes rows 1..4, which start inside block row 0.
  spec = QuantPlan(QuantPath::sender_quantizes);
  spec.programs[0].regions[0] = testing::MakeRegion(0, 8, {3, 8}, {8, 1});
  spec.programs[0].quant_ops[0] = testing::MakeQuant(0, fb::QuantKind::quantize, 2, {0, 0}, {2, 4});
  EXPECT_EQ(Problems(spec)[0], "rank 0 round 0 step 0 (pack): quantizes w [1:4, 0:8], which is not whole blocks of 2x4");
  // The receiver never unpacks the scales the sender computed.
  spec = QuantPlan(QuantPath::sender_quantizes);
  spec.programs[1].steps.pop_back();
  EXPECT_EQ(Problems(spec), std::vector<std::string>{"rank 1: w#scale [0:2, 0:2]: 4 of 4 elements are never written"});
  // Dequantizing with blocks the source was not quantized over.
  spec = QuantPlan(QuantPath::fp8_source);
  spec.programs[0].quant_ops[0] = testing::MakeQuant(0, fb::QuantKind::dequantize, 3, {1, 0}, {2, 8});
  spec.programs[0].regions[3] = testing::MakeRegion(1, 0, {2, 1}, {2, 1});
  EXPECT_EQ(Problems(spec)[0],
            "rank 0 round 0 step 0 (pack): dequantizes w [1:3, 0:8], which are not FP8 values over blocks of 2x8");
}

}  // namespace
}  // namespace reshard
