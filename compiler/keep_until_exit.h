// Large structures a short-lived process leaves to its exit instead of
// freeing them one block at a time, as compilers do (clang's -disable-free).
// A DeepSeek-V3 compile's plan IR and expansions are about 1.2M blocks: their
// destructors took 30-40 ms on one core at the end of `reshard compile`,
// every other thread idle. The CLI's compile opts in; a library caller
// (Python, the tests) does not, and everything is freed as usual there.
#pragma once

#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace reshard {

/// Whether Dispose keeps what it is given until the process exits. Off
/// unless the program sets it.
void SetKeepUntilExit(bool keep);
bool KeepingUntilExit();

namespace detail {
// What Dispose kept: reachable from a global until the exit (so that leak
// checkers count it in use, not lost), never destroyed. Locks `lock`.
std::vector<void*>& Kept(std::unique_lock<std::mutex>& lock);
}  // namespace detail

/// Ends the use of `x` (an rvalue: the caller gives it up): destroys it now
/// or, while KeepingUntilExit(), moves it aside, never to be destroyed.
template <class T, class = std::enable_if_t<!std::is_lvalue_reference_v<T>>>
void Dispose(T&& x) {
  if (!KeepingUntilExit()) {
    T dead = std::move(x);
    return;
  }
  void* kept = new T(std::move(x));
  std::unique_lock<std::mutex> lock;
  detail::Kept(lock).push_back(kept);
}

}  // namespace reshard
