// The plan schema evolves by adding fields at the end only: flatc --conform
// checks schema/plan.fbs against every released schema in schema/history/.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/test.h"

namespace {

using reshard::testing::ShellResult;

ShellResult Conform(const std::string& base, const std::string& schema) {
  return reshard::testing::Shell("flatc --conform " + base + " " + schema);
}

const std::string kSchemaDir = std::string(RESHARD_SOURCE_DIR) + "/schema";

TEST(Schema, ConformsToEveryReleasedSchema) {
  int released = 0;
  for (const auto& e : std::filesystem::directory_iterator(kSchemaDir + "/history")) {
    if (e.path().extension() != ".fbs") continue;
    ShellResult r = Conform(e.path().string(), kSchemaDir + "/plan.fbs");
    EXPECT_EQ(r.exit_code, 0) << e.path() << ": " << r.out;
    ++released;
  }
  EXPECT_GE(released, 1);
}

TEST(Schema, AChangedFieldTypeDoesNotConform) {
  std::ifstream in(kSchemaDir + "/plan.fbs");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const std::string field = "  rank: uint;";
  size_t at = text.find(field);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, field.size(), "  rank: ulong;");
  std::string bad = (std::filesystem::temp_directory_path() / "reshard-schema-bad.fbs").string();
  std::ofstream(bad) << text;
  ShellResult r = Conform(kSchemaDir + "/history/plan_v1.fbs", bad);
  std::filesystem::remove(bad);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("types differ for field: rank"), std::string::npos) << r.out;
}

}  // namespace
