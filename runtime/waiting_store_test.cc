// WaitingStore: get() waits for the transport's timeout, not Gloo
// FileStore's fixed 30 s, both ways: it gives up after a short one and finds
// a key set later within a long one.
#include "runtime/waiting_store.h"

#include <gtest/gtest.h>

#include <gloo/rendezvous/file_store.h>

#include <thread>

#include "runtime/test.h"

namespace reshard {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;

std::unique_ptr<gloo::rendezvous::Store> Files(const TempDir& dir) {
  return std::make_unique<gloo::rendezvous::FileStore>(dir.path());
}

TEST(WaitingStore, GivesUpAfterTheTransportsTimeout) {
  TempDir dir;
  WaitingStore store(Files(dir), 300ms);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_ANY_THROW(store.get("never"));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 10s);  // FileStore alone: 30 s
}

TEST(WaitingStore, FindsAKeySetLaterWithinTheTimeout) {
  TempDir dir;
  WaitingStore store(Files(dir), 20s);
  std::thread late([&] {
    std::this_thread::sleep_for(500ms);
    WaitingStore other(Files(dir), 20s);
    other.set("addr", {'4', '2'});
  });
  EXPECT_EQ(store.get("addr"), (std::vector<char>{'4', '2'}));
  late.join();
}

}  // namespace
}  // namespace reshard
