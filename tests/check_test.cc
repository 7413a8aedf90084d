// reshard check: a layout's buffers against a dump of a framework's real
// parameters (every kind of difference, the dump formats, bad dumps), and the
// recorded dumps of real Megatron-Core (tests/data/megatron) against the
// hand-written specs beside them, with zero differences.
#include <filesystem>
#include <map>
#include <set>

#include "compiler/state_dict_check.h"
#include "tests/test_util.h"

namespace reshard::testing {
namespace {

using nlohmann::json;

// Two layers at TP2: the projection split by rows, the fp32 norm and the embedding replicated.
const char* kModel = R"({"format": "reshard.model/1", "name": "m", "dtype": "bf16", "dims": {"layer": 2},
  "tensors": [{"name": "embed.weight", "shape": [8, 4]},
              {"name": "layers.{layer}.norm.weight", "shape": [4], "dtype": "fp32"},
              {"name": "layers.{layer}.proj.weight", "shape": [6, 4]}]})";
const char* kLayout = R"({"format": "reshard.layout/1", "name": "tp2", "model": "m", "ranks": 2,
  "meshes": {"m": [["tp", 2]]},
  "placements": [{"match": "layers.{layer}.proj.weight", "mesh": "m", "tp": {"shard": 0}},
                 {"match": "*", "mesh": "m", "tp": "replicate"}]})";

json Param(const std::string& name, const std::string& dtype, std::vector<int64_t> shape) {
  return {{"name", name}, {"dtype", dtype}, {"shape", shape}};
}

// What the layout says rank `r` holds, as a framework would dump it.
json TrueRank(int r) {
  return {
      {"rank", r},
      {"params",
       {Param("embed.weight", "torch.bfloat16", {8, 4}), Param("layers.0.norm.weight", "torch.float32", {4}),
        Param("layers.0.proj.weight", "torch.bfloat16", {3, 4}), Param("layers.1.norm.weight", "torch.float32", {4}),
        Param("layers.1.proj.weight", "torch.bfloat16", {3, 4})}}};
}

struct Fixture {
  TempDir dir;
  std::string model = dir.File("model.json"), layout = dir.File("layout.json");
  Fixture() {
    WriteText(model, kModel);
    WriteText(layout, kLayout);
  }
  static void WriteText(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  std::string Dump(const std::string& name, const json& j) {
    WriteText(dir.File(name), j.dump(1));
    return dir.File(name);
  }
  Result Check(const std::vector<std::string>& dumps, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"check", "--layout", layout, "--model", model, "--state-dict"};
    args.insert(args.end(), dumps.begin(), dumps.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return Reshard(dir, args);
  }
};

TEST(CheckTest, TorchDtypesMapToReshards) {
  EXPECT_EQ(TorchDtype("torch.bfloat16"), Dtype::bf16);
  EXPECT_EQ(TorchDtype("torch.float16"), Dtype::fp16);
  EXPECT_EQ(TorchDtype("torch.float32"), Dtype::fp32);
  EXPECT_EQ(TorchDtype("torch.float8_e4m3fn"), Dtype::fp8_e4m3);
  EXPECT_EQ(TorchDtype("torch.float8_e8m0fnu"), Dtype::e8m0);
  EXPECT_EQ(TorchDtype("bfloat16"), Dtype::bf16);
  EXPECT_EQ(TorchDtype("fp32"), Dtype::fp32);
  EXPECT_EQ(TorchDtype("torch.int64"), std::nullopt);
  EXPECT_EQ(TorchDtype("torch.float8_e5m2"), std::nullopt);
}

TEST(CheckTest, TrueDumpMatchesOneFilePerRankOrOneFile) {
  Fixture f;
  Result r = f.Check({f.Dump("r0.json", TrueRank(0)), f.Dump("r1.json", TrueRank(1))});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.out, f.layout +
                       ": matches the dump: 2 of 2 ranks (0,1), 10 layout buffers, 10 dumped parameters, same names, "
                       "dtypes and shapes\n");
  r = f.Check({f.Dump("all.json", json::array({TrueRank(1), TrueRank(0)}))});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  r = f.Check({f.Dump("all.json", json::array({TrueRank(1), TrueRank(0)}))}, {"--rank", "1"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.out, f.layout +
                       ": matches the dump: 1 of 2 ranks (1), 5 layout buffers, 5 dumped parameters, same names, "
                       "dtypes and shapes\n");
}

// Activation checkpointing, torch.compile and FSDP1 put wrapper segments into
// parameter names; the weights' names (the layout's) do not have them.
TEST(CheckTest, WrapperSegmentsAreNotPartOfTheNames) {
  Fixture f;
  json r0 = TrueRank(0), r1 = TrueRank(1);
  r0["params"][2]["name"] = "layers.0._checkpoint_wrapped_module.proj.weight";
  r0["params"][0]["name"] = "_orig_mod.embed.weight";
  r1["params"][4]["name"] = "_fsdp_wrapped_module.layers.1._fsdp_wrapped_module.proj.weight";
  // A segment is a whole dotted component: a parameter merely ending in the word keeps its name.
  r1["params"][1]["name"] = "layers.0.x_orig_mod.norm.weight";
  Result r = f.Check({f.Dump("r0.json", r0), f.Dump("r1.json", r1)});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 1: missing: layers.0.norm.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1: extra: layers.0.x_orig_mod.norm.weight"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("proj"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("embed"), std::string::npos) << r.out;
  // Two wrapped names of one parameter are one parameter listed twice.
  r0["params"][3]["name"] = "_orig_mod.layers.0.proj.weight";
  r = f.Check({f.Dump("r0.json", r0), f.Dump("r1.json", TrueRank(1))});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("parameter 'layers.0.proj.weight' is listed twice"), std::string::npos) << r.err;
}

TEST(CheckTest, EveryKindOfDifferenceIsPrinted) {
  Fixture f;
  json r0 = TrueRank(0), r1 = TrueRank(1);
  r0["params"].erase(1);                                                       // missing layers.0.norm.weight
  r0["params"].push_back(Param("layers.0.proj.bias", "torch.bfloat16", {3}));  // extra
  r1["params"][2]["shape"] = {6, 4};                                           // wrong shape (not split)
  r1["params"][3]["dtype"] = "torch.bfloat16";                                 // wrong dtype (norm kept bf16)
  r1["params"][4]["dtype"] = "torch.int64";                                    // a dtype reshard has not
  r1["params"][4]["shape"] = {3};                                              // ... and a wrong shape: both are listed
  Result r = f.Check({f.Dump("all.json", json::array({r0, r1}))});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out,
            "rank 0: missing: layers.0.norm.weight fp32[4]: the layout binds it, the dump does not have it\n"
            "rank 0: extra: layers.0.proj.bias bf16[3]: the dump has it, the layout does not bind it\n"
            "rank 1: wrong dtype: layers.1.norm.weight: the layout says fp32, the dump has bf16 (torch.bfloat16)\n"
            "rank 1: wrong shape: layers.0.proj.weight: the layout says bf16[3, 4], the dump has bf16[6, 4]\n"
            "rank 1: wrong shape: layers.1.proj.weight: the layout says bf16[3, 4], the dump has torch.int64[3]\n"
            "rank 1: wrong dtype: layers.1.proj.weight: the layout says bf16, the dump has torch.int64\n" +
                f.layout +
                ": 6 differences from the dump: 2 of 2 ranks (0,1), 10 layout buffers, 10 dumped parameters\n");
  r = f.Check({f.dir.File("all.json")}, {"--rank", "0", "--json"});
  EXPECT_EQ(r.code, 1) << r.err;
  json j = json::parse(r.out);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["ranks"], json::array({0}));
  ASSERT_EQ(j["differences"].size(), 2u);
  EXPECT_EQ(j["differences"][0],
            json({{"rank", 0},
                  {"kind", "missing"},
                  {"name", "layers.0.norm.weight"},
                  {"layout", "fp32[4]"},
                  {"dump", ""},
                  {"message",
                   "rank 0: missing: layers.0.norm.weight fp32[4]: the layout binds it, the dump does "
                   "not have it"}}));
  EXPECT_EQ(j["differences"][1]["kind"], "extra");
  EXPECT_EQ(j["differences"][1]["dump"], "bf16[3]");
}

TEST(CheckTest, RankSubsetChecksOnlyTheDumpedRanks) {
  Fixture f;
  Result r = f.Check({f.Dump("r1.json", TrueRank(1))});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("1 of 2 ranks (1)"), std::string::npos) << r.out;
  r = f.Check({f.dir.File("r1.json")}, {"--rank", "0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "reshard: error: --rank 0: the dump has no rank 0 (it has 1)\n");
}

// Bad dumps: the file and the JSON path of what is wrong, exit 2, nothing on stdout.
// A parameter that is the transposed view of the layout's memory (vLLM's
// per-channel FP8 `weight.t()`) is no difference where the layout declares it
// ("held": "transposed"), and an undeclared view where it does not; strides
// that are not a permutation of the layout's row-major memory stay a wrong shape.
TEST(CheckTest, TransposedViewsOfTheLayoutsMemory) {
  Fixture f;
  json r0 = TrueRank(0);
  r0["params"][2]["shape"] = {4, 3};
  r0["params"][2]["stride"] = {1, 4};  // layers.0.proj.weight.t(): [4, 3] over [3, 4] row-major
  r0["params"][4]["shape"] = {4, 3};
  r0["params"][4]["stride"] = {1, 1};  // no such memory
  Result r = f.Check({f.Dump("v.json", r0)});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out,
            "rank 0: undeclared view: layers.0.proj.weight: the dump has bf16[4, 3] with strides [1, 4], a permuted "
            "view of the layout's row-major bf16[3, 4]; declare it in the layout (\"held\": \"transposed\" in its "
            "buffer rule), or the binding copies through the view\n"
            "rank 0: wrong shape: layers.1.proj.weight: the layout says bf16[3, 4], the dump has bf16[4, 3]\n" +
                f.layout + ": 2 differences from the dump: 1 of 2 ranks (0), 5 layout buffers, 5 dumped parameters\n");
  // Declared: a buffer rule for each proj weight, held transposed.
  json layout = json::parse(kLayout);
  layout["default_buffers"] = true;
  layout["buffers"] = {{{"name", "layers.{layer}.proj.weight"}, {"tensor", "layers.{layer}.proj.weight"},
                        {"held", "transposed"}}};
  Fixture::WriteText(f.layout, layout.dump());
  r = f.Check({f.dir.File("v.json")});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out,
            "rank 0: wrong shape: layers.1.proj.weight: the layout says bf16[3, 4], the dump has bf16[4, 3]\n"
            "rank 0: view: layers.0.proj.weight: the dump has bf16[4, 3] with strides [1, 4], the transposed view of "
            "the layout's row-major bf16[3, 4] the layout declares (\"held\": \"transposed\"): binding it binds the "
            "memory\n" +
                f.layout + ": 1 differences from the dump: 1 of 2 ranks (0), 5 layout buffers, 5 dumped parameters\n");
  r0["params"][4]["stride"] = {1, 4};
  r = f.Check({f.Dump("v.json", r0)}, {"--json"});
  EXPECT_EQ(r.code, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["views"].size(), 2u);
  r0["params"][4]["stride"] = {1};
  r = f.Check({f.Dump("v.json", r0)});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "reshard: error: " + f.dir.File("v.json") +
                       ": /params/4/stride: expected 2 strides (one per shape dim), got [1]\n");
}

TEST(CheckTest, BadDumpsNameFileAndJsonPath) {
  Fixture f;
  auto expect_error = [&](const std::vector<std::string>& dumps, const std::string& msg) {
    Result r = f.Check(dumps);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "reshard: error: " + msg + "\n");
  };
  std::string bad = f.dir.File("bad.json");
  Fixture::WriteText(bad, "{\"rank\": 0, \"params\": [}\n");
  expect_error({bad}, bad +
                          ":1:24: syntax error while parsing value - unexpected '}'; expected '[', '{', or a "
                          "literal\n{\"rank\": 0, \"params\": [}\n                       ^");
  expect_error({f.dir.File("none.json")}, f.dir.File("none.json") + ": cannot open file: No such file or directory");
  expect_error({f.Dump("d.json", json(5))},
               f.dir.File("d.json") +
                   ": /: expected a rank's object {\"rank\": R, \"params\": [...]} or a list of them, got a number");
  expect_error({f.Dump("d.json", json::array())}, f.dir.File("d.json") + ": /: the dump lists no ranks");
  json j = json::array({TrueRank(0), TrueRank(1)});
  j[1].erase("rank");
  expect_error({f.Dump("d.json", j)}, f.dir.File("d.json") + ": /1: missing required field 'rank'");
  j = json::array({TrueRank(0), TrueRank(1)});
  j[1]["rank"] = -1;
  expect_error({f.Dump("d.json", j)}, f.dir.File("d.json") + ": /1/rank: expected an integer >= 0, got -1");
  j = TrueRank(0);
  j["params"][3].erase("shape");
  expect_error({f.Dump("d.json", j)}, f.dir.File("d.json") + ": /params/3: missing required field 'shape'");
  j = TrueRank(0);
  j["params"][2]["shape"][1] = "4";
  expect_error({f.Dump("d.json", j)},
               f.dir.File("d.json") + ": /params/2/shape/1: expected an integer >= 0, got a string");
  j = TrueRank(0);
  j["params"][2]["dtype"] = 16;
  expect_error({f.Dump("d.json", j)},
               f.dir.File("d.json") + ": /params/2/dtype: expected a string such as \"torch.bfloat16\", got a number");
  j = TrueRank(0);
  j["params"][4]["name"] = "embed.weight";
  expect_error({f.Dump("d.json", j)},
               f.dir.File("d.json") + ": /params/4/name: parameter 'embed.weight' is listed twice (also at /params/0)");
  j = TrueRank(0);
  j["params"] = json::object();
  expect_error({f.Dump("d.json", j)}, f.dir.File("d.json") + ": /params: expected an array, got an object");
  expect_error({f.Dump("a.json", TrueRank(1)), f.Dump("b.json", json::array({TrueRank(0), TrueRank(1)}))},
               f.dir.File("b.json") + ": /1/rank: rank 1 is dumped twice (also " + f.dir.File("a.json") + ")");
  expect_error({f.Dump("d.json", TrueRank(2))},
               f.dir.File("d.json") + ": /rank: rank 2 is not a rank of layout 'tp2' (" + f.layout + " has 2 ranks)");
}

// The recorded dumps of real Megatron-Core 0.19.2 (tests/megatron/dump_cases.py)
// against the hand-written specs beside them: zero differences.
std::string MegatronCase(const std::string& name, const std::string& file) {
  return SourceDir() + "/tests/data/megatron/" + name + "/" + file;
}

Result CheckMegatron(const TempDir& dir, const std::string& name, const std::string& dump = "dump.json") {
  return Reshard(dir, {"check", "--layout", MegatronCase(name, "train.json"), "--model",
                       MegatronCase(name, "model.json"), "--state-dict", MegatronCase(name, dump), "--json"});
}

TEST(CheckTest, RealMegatronDumpsMatchTheirSpecs) {
  TempDir dir;
  const std::map<std::string, std::pair<int, int>> cases = {
      // case -> (ranks, buffers over all ranks)
      {"dense-tp2-pp2", {4, 54}},
      {"dense-tp4-qg2", {4, 108}},     // linear_qkv sharded as a whole ("shard": "tp"), TP 4 > 2 query groups
      {"dense-tp4-padded", {4, 108}},  // ranks 2 and 3 hold only vocab padding, and still their buffers
      {"moe-tp2-pp2-ep2", {4, 94}},
      {"moe-tp2-pp2-dp2-ep2-etp2", {8, 188}},
  };
  for (const auto& [name, want] : cases) {
    Result r = CheckMegatron(dir, name);
    EXPECT_EQ(r.code, 0) << name << "\n" << r.out << r.err;
    json j = json::parse(r.out);
    EXPECT_EQ(j["ranks"].size(), static_cast<size_t>(want.first)) << name;
    EXPECT_EQ(j["layout_buffers"], want.second) << name;
    EXPECT_EQ(j["dump_params"], want.second) << name;
  }
}

// Without Float16Module (a bare GPTModel with params_dtype bf16), the local
// spec's norms (torch.nn.RMSNorm, built without a dtype) stay fp32: the only
// differences from the bf16 spec are those norms' dtypes.
TEST(CheckTest, RealMegatronWithoutFloat16ModuleKeepsNormsFp32) {
  TempDir dir;
  Result r = CheckMegatron(dir, "moe-tp2-pp2-ep2", "dump-no-float16module.json");
  EXPECT_EQ(r.code, 1) << r.err;
  json j = json::parse(r.out);
  std::set<std::string> kinds;
  for (const json& d : j["differences"]) {
    EXPECT_EQ(d["kind"], "wrong dtype") << d;
    std::string n = d["name"];
    EXPECT_TRUE(n.find("layernorm.weight") != std::string::npos) << n;
    EXPECT_EQ(d["dump"].get<std::string>().substr(0, 5), "fp32[") << d;
    kinds.insert(n.substr(n.find_last_of('.', n.size() - 8) + 1));
  }
  // rank by rank: 2 layers x (input, pre-MLP, q, k norms), plus the final norm on the last stage
  EXPECT_EQ(j["differences"].size(), 4u * 2 * 4 + 2);
  EXPECT_EQ(kinds, (std::set<std::string>{"input_layernorm.weight", "pre_mlp_layernorm.weight", "q_layernorm.weight",
                                          "k_layernorm.weight", "final_layernorm.weight"}));
}

}  // namespace
}  // namespace reshard::testing
