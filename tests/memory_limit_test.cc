// Layouts too large for the memory the process may use are refused before
// anything is allocated for them, with the count that makes them large, not
// with std::bad_alloc (issue 17). The limit here is `ulimit -v`.
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace reshard {
namespace {

using testing::Quote;
using testing::Result;
using testing::TempDir;

void Write(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(); }

// A 5-tensor model (one of 4 layers) replicated over `ranks` data-parallel ranks.
void WriteSpecs(const TempDir& dir, int64_t ranks) {
  Write(dir.File("model.json"), {{"format", "reshard.model/1"},
                                 {"name", "m"},
                                 {"dims", {{"layer", 4}}},
                                 {"tensors", {{{"name", "l{layer}.w"}, {"shape", {64, 64}}}, {{"name", "e"}, {"shape", {128, 64}}}}}});
  auto layout = [](const std::string& name, int64_t n) {
    return nlohmann::json::parse(R"({"format": "reshard.layout/1", "name": ")" + name + R"(", "model": "m", "ranks": )" +
                                 std::to_string(n) + R"(, "meshes": {"m": [["dp", )" + std::to_string(n) +
                                 R"(]]}, "placements": [{"match": "*"}]})");
  };
  Write(dir.File("train.json"), layout("big", ranks));
  Write(dir.File("infer.json"), layout("one", 1));
}

// AddressSanitizer reserves terabytes of address space for its shadow memory
// at start, which no `ulimit -v` leaves room for: under RESHARD_SANITIZE these
// tests skip (they run in every plain build).
#ifdef RESHARD_SANITIZE
#define RESHARD_SKIP_UNDER_ASAN() GTEST_SKIP() << "ulimit -v cannot apply under AddressSanitizer (shadow memory)"
#else
#define RESHARD_SKIP_UNDER_ASAN() (void)0
#endif

Result CompileUnder(const TempDir& dir, int64_t ulimit_kb) {
  return testing::Shell(dir, "ulimit -v " + std::to_string(ulimit_kb) + "; " + Quote(RESHARD_BINARY) +
                                 " compile -q --model " + Quote(dir.File("model.json")) + " --from " +
                                 Quote(dir.File("train.json")) + " --to " + Quote(dir.File("infer.json")) +
                                 " --cluster " + Quote(testing::Sample("clusters/dgx-h100.json")) + " -o " +
                                 Quote(dir.File("p.rsplan")));
}

TEST(MemoryLimit, LayoutTooLargeIsRefusedBeforeExpanding) {
  RESHARD_SKIP_UNDER_ASAN();
  TempDir dir;
  WriteSpecs(dir, int64_t{1} << 20);
  Result r = CompileUnder(dir, 1500000);  // 1.4 GiB
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.err, "reshard: error: " + dir.File("train.json") +
                       ": /placements/0: layout 'big' makes about 5.24e+06 (rank, tensor) holdings ('l{layer}.w' "
                       "alone: 4 instance(s) on each of 1048576 ranks), about 5.0 GiB to compile at 1 KiB each, more "
                       "than the 1.4 GiB this process may use (the machine's memory or ulimit -v); nothing was "
                       "allocated for it. Compile on a larger machine, or check the layout's ranks and placements\n");
  EXPECT_FALSE(std::filesystem::exists(dir.File("p.rsplan")));
}

TEST(MemoryLimit, LayoutThatFitsCompiles) {
  RESHARD_SKIP_UNDER_ASAN();
  TempDir dir;
  WriteSpecs(dir, 1024);
  Result r = CompileUnder(dir, 1500000);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir.File("p.rsplan")));
}

}  // namespace
}  // namespace reshard
