#include "compiler/keep_until_exit.h"

#include <gtest/gtest.h>

#include <vector>

namespace reshard {
namespace {

// Counts its live copies that own something (a moved-from one owns nothing).
struct Counted {
  static int alive;
  std::vector<int> data;
  explicit Counted(int n) : data(n, 1) { ++alive; }
  Counted(Counted&& o) noexcept : data(std::move(o.data)) { o.data.clear(); }
  ~Counted() {
    if (!data.empty()) --alive;
  }
};
int Counted::alive = 0;

// A library caller (the default): Dispose destroys at once.
TEST(KeepUntilExitTest, DisposeDestroysByDefault) {
  ASSERT_FALSE(KeepingUntilExit());
  const int before = Counted::alive;
  Counted c(1000);
  ASSERT_EQ(Counted::alive, before + 1);
  Dispose(std::move(c));
  EXPECT_EQ(Counted::alive, before);
  EXPECT_TRUE(c.data.empty());
}

// The CLI: what Dispose is given lives on (its memory left to the exit),
// the caller's object is emptied; switched off, destroying resumes.
TEST(KeepUntilExitTest, KeptUntilExitWhenAsked) {
  const int before = Counted::alive;
  SetKeepUntilExit(true);
  Counted c(1000);
  Dispose(std::move(c));
  EXPECT_EQ(Counted::alive, before + 1);
  EXPECT_TRUE(c.data.empty());
  SetKeepUntilExit(false);
  Counted d(10);
  Dispose(std::move(d));
  EXPECT_EQ(Counted::alive, before + 1);  // only the kept one
}

}  // namespace
}  // namespace reshard
