#include "compiler/write_file.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/error.h"
#include "runtime/test.h"

namespace reshard {
namespace {

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

TEST(WriteFileTest, WritesTheWholeFileAndReplacesAnOldOne) {
  testing::TempDir dir;
  const std::string path = dir.File("out.bin");
  WriteFileAtomic(path, std::string("old contents, longer than the new"));
  WriteFileAtomic(path, std::vector<uint8_t>{1, 2, 3});
  EXPECT_EQ(std::filesystem::file_size(path), 3u);
  EXPECT_EQ(Names(dir.path()), std::vector<std::string>{"out.bin"});
}

TEST(WriteFileTest, AFailureNamesThePathAndLeavesNothing) {
  testing::TempDir dir;
  try {
    WriteFileAtomic(dir.File("missing/out.bin"), std::string("x"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), dir.File("missing/out.bin") + ": cannot write: No such file or directory");
  }
  // The target is a directory: the temporary is written, the rename fails
  // and the temporary goes.
  std::filesystem::create_directory(dir.File("taken"));
  std::filesystem::create_directory(dir.File("taken/inside"));
  EXPECT_THROW(WriteFileAtomic(dir.File("taken"), std::string("x")), Error);
  EXPECT_EQ(Names(dir.path()), std::vector<std::string>{"taken"});
}

// A process writing a 32 MiB file over and over is sent SIGTERM at random
// moments: each time it dies, the directory holds the whole file or nothing,
// never a temporary or a part. (With the signals not held, the first kill
// already left the temporary behind.)
TEST(WriteFileTest, ATerminatedWriteLeavesTheWholeFileOrNothing) {
  testing::TempDir dir;
  const std::string path = dir.File("plan.rsplan");
  const std::vector<uint8_t> bytes(32u << 20, 0x5a);
  int whole = 0;
  for (int attempt = 0; attempt < 12; ++attempt) {
    std::filesystem::remove(path);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (;;) WriteFileAtomic(path, bytes);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 37 * attempt % 150));
    kill(pid, SIGTERM);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
    for (const std::string& name : Names(dir.path())) {
      ASSERT_EQ(name, "plan.rsplan") << "left after SIGTERM (attempt " << attempt << ")";
      ASSERT_EQ(std::filesystem::file_size(path), bytes.size());
      ++whole;
    }
  }
  // Nearly every kill lands after at least one whole write (the first takes
  // tens of ms): the check above saw files, not an always-empty directory.
  EXPECT_GT(whole, 0);
}

}  // namespace
}  // namespace reshard
