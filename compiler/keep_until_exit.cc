#include "compiler/keep_until_exit.h"

#include <atomic>
#include <mutex>
#include <vector>

namespace reshard {
namespace {
std::atomic<bool> keep{false};
}  // namespace

void SetKeepUntilExit(bool on) { keep = on; }
bool KeepingUntilExit() { return keep; }

namespace detail {
void Keep(void* kept) {
  // Both made once and never destroyed: no destructor of theirs runs at the exit.
  static std::mutex* mu = new std::mutex;
  static std::vector<void*>* all = new std::vector<void*>;
  std::lock_guard<std::mutex> lock(*mu);
  all->push_back(kept);
}
}  // namespace detail

}  // namespace reshard
