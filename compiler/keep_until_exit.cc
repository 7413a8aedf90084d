#include "compiler/keep_until_exit.h"

#include <atomic>

namespace reshard {
namespace {
std::atomic<bool> keep{false};
}  // namespace

void SetKeepUntilExit(bool on) { keep = on; }
bool KeepingUntilExit() { return keep; }

namespace detail {
std::vector<void*>& Kept(std::unique_lock<std::mutex>& lock) {
  // Both made once and never destroyed: no destructor of theirs runs at the exit.
  static std::mutex* mu = new std::mutex;
  static std::vector<void*>* kept = new std::vector<void*>;
  lock = std::unique_lock<std::mutex>(*mu);
  return *kept;
}
}  // namespace detail

}  // namespace reshard
