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

// Gloo's FileStore, with its protected check() open as the store's probe.
class Probing : public gloo::rendezvous::FileStore {
 public:
  using gloo::rendezvous::FileStore::FileStore;
  bool Has(const std::vector<std::string>& keys) { return check(keys); }
};

WaitingStore Files(const TempDir& dir, std::chrono::milliseconds timeout) {
  auto files = std::make_unique<Probing>(dir.path());
  Probing* p = files.get();
  return WaitingStore(std::move(files), timeout, [p](const std::vector<std::string>& keys) { return p->Has(keys); });
}

TEST(WaitingStore, GivesUpAfterTheTransportsTimeout) {
  TempDir dir;
  WaitingStore store = Files(dir, 300ms);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_ANY_THROW(store.get("never"));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 800ms);  // FileStore alone: 30 s; its wait(300 ms): 1 s
}

TEST(WaitingStore, FindsAKeySetLaterWithinTheTimeout) {
  TempDir dir;
  WaitingStore store = Files(dir, 20s);
  std::thread late([&] {
    std::this_thread::sleep_for(500ms);
    WaitingStore other = Files(dir, 20s);
    other.set("addr", {'4', '2'});
  });
  EXPECT_EQ(store.get("addr"), (std::vector<char>{'4', '2'}));
  late.join();
}

}  // namespace
}  // namespace reshard
