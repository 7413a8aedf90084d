// Expand on threads (expand.cc: ExpandOnThreads): the ranks of a layout
// expand on several threads, and the expansion - every rank's buffers and
// fragments, each tensor's fragment list, the scale tensors - and every
// error message are what one thread gives.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "compiler/compile.h"
#include "compiler/expand.h"
#include "compiler/random_specs.h"
#include "compiler/test.h"

namespace reshard {
namespace {

using nlohmann::json;

// Everything an expansion holds, as text, so that two compare in one EXPECT.
std::string Dump(const Expansion& e) {
  std::ostringstream o;
  for (size_t r = 0; r < e.ranks.size(); ++r) {
    o << "rank " << r << "\n";
    for (const BufferDesc& b : e.ranks[r].buffers) {
      o << " buffer " << b.name << " " << static_cast<int>(b.dtype) << " " << b.held_transposed;
      for (int64_t s : b.shape) o << " " << s;
      o << "\n";
    }
    for (const Fragment& f : e.ranks[r].fragments) {
      o << " fragment t" << f.tensor << " b" << f.buffer << " +" << f.offset << " dims" << static_cast<int>(f.buffer_dims);
      for (int d = 0; d < f.box.ndim; ++d) o << " [" << f.box.lo[d] << "," << f.box.hi[d] << ")*" << f.stride[d];
      o << "\n";
    }
  }
  for (size_t t = 0; t < e.by_tensor.size(); ++t) {
    o << "tensor " << t << ":";
    for (const FragmentRef& x : e.by_tensor[t]) o << " " << x.rank << "/" << x.index;
    o << "\n";
  }
  for (const ScaleTensor& s : e.scales) o << "scale " << s.name << " of " << s.of << "\n";
  return o.str();
}

TEST(ExpandThreads, GiveTheSameExpansion) {
  int compared = 0, quantized = 0;
  for (int seed = 1; seed <= 40; ++seed) {
    const RandomSpecs s = seed % 2 ? MakeRandomSpecs(seed) : MakeRandomQuantSpecs(seed);
    const CompileInputs in = ParseInputs(s.model, s.train, s.infer, s.cluster);
    for (const LayoutSpec* layout : {&in.src, &in.dst}) {
      const std::string one = Dump(Expand(in.model, *layout, 1));
      for (size_t threads : {2, 3, 5})
        EXPECT_EQ(Dump(Expand(in.model, *layout, threads)), one) << "seed " << seed << " on " << threads << " threads";
      if (layout->ranks >= 4) ++compared;
      quantized += one.find("scale ") != std::string::npos;
    }
  }
  // The generator makes layouts of several ranks, some quantized: the threads had ranks to share.
  EXPECT_GE(compared, 40);
  EXPECT_GE(quantized, 5);
}

// Rule 0 fails on ranks 8-15 only (they hold 2 rows, its shape says 1); rule
// 1 fails on every rank. In rule and rank order the first mistake is rule
// 0's on rank 8, though a thread that owns rank 0 meets rule 1's first.
TEST(ExpandThreads, ReportTheFirstMistakeInRuleAndRankOrder) {
  const ModelSpec m = ParseModel(json::parse(R"({"format": "reshard.model/1", "name": "m", "dtype": "bf16",
      "dims": {"layer": 1}, "tensors": [{"name": "a", "shape": [24, 4]}, {"name": "b", "shape": [32, 4]}]})"),
                                 "model.json");
  const json layout = json::parse(R"({"format": "reshard.layout/1", "name": "l", "ranks": 16,
      "meshes": {"tp": [["tp", 16]]},
      "placements": [{"match": "a", "tp": {"shard": 0, "sizes": [1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2]}},
                     {"match": "b", "tp": {"shard": 0}}],
      "buffers": [{"name": "a", "tensor": "a", "shape": [1, 4]}, {"name": "b", "tensor": "b", "shape": [1, 4]}]})");
  const LayoutSpec l = ParseLayout(layout, "infer.json", m);
  const std::string first =
      "infer.json: /buffers/0/shape: buffer content on rank 8 is [2, 4], larger than the declared shape [1, 4]";
  for (int round = 0; round < 20; ++round)
    for (size_t threads : {1, 2, 3, 5, 16})
      EXPECT_EQ(testing::ErrorOf([&] { Expand(m, l, threads); }), first) << threads << " threads";
}

}  // namespace
}  // namespace reshard
