// Large structures a short-lived process leaves to its exit instead of
// freeing them one block at a time, as compilers do (clang's -disable-free).
// A large compile's plan IR and expansions are over a million blocks: their
// destructors would run on one core at the end of `reshard compile`, every
// other thread idle. The CLI's compile opts in; a library caller
// (Python, the tests) does not, and everything is freed as usual there.
#pragma once

#include <type_traits>
#include <utility>

namespace reshard {

/// Whether Dispose keeps what it is given until the process exits. Off
/// unless the program sets it.
void SetKeepUntilExit(bool keep);
bool KeepingUntilExit();

namespace detail {
// Holds `kept` reachable from a global until the exit (so that leak
// checkers count it in use, not lost), never destroyed.
void Keep(void* kept);
}  // namespace detail

/// Ends the use of `x` (an rvalue: the caller gives it up): destroys it now
/// or, while KeepingUntilExit(), moves it aside, never to be destroyed.
template <class T, class = std::enable_if_t<!std::is_lvalue_reference_v<T>>>
void Dispose(T&& x) {
  if (!KeepingUntilExit()) {
    T dead = std::move(x);
    return;
  }
  detail::Keep(new T(std::move(x)));
}

}  // namespace reshard
