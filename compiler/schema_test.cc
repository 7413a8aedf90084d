// The plan schema evolves by adding fields at the end only: flatc --conform
// checks schema/plan.fbs against every released schema in schema/history/.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

struct Result {
  int code = -1;
  std::string out;
};

Result Conform(const std::string& base, const std::string& schema) {
  Result r;
  FILE* p = popen(("flatc --conform " + base + " " + schema + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[1024];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const std::string kSchemaDir = std::string(RESHARD_SOURCE_DIR) + "/schema";

TEST(Schema, ConformsToEveryReleasedSchema) {
  int released = 0;
  for (const auto& e : std::filesystem::directory_iterator(kSchemaDir + "/history")) {
    if (e.path().extension() != ".fbs") continue;
    Result r = Conform(e.path().string(), kSchemaDir + "/plan.fbs");
    EXPECT_EQ(r.code, 0) << e.path() << ": " << r.out;
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
  Result r = Conform(kSchemaDir + "/history/plan_v1.fbs", bad);
  std::filesystem::remove(bad);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("types differ for field: rank"), std::string::npos) << r.out;
}

}  // namespace
