// Ctrl-C during connect or run(). A blocking call (connecting, the hello,
// run) opens an InterruptScope: for its length SIGINT, SIGTERM and SIGHUP only
// mark the call interrupted. The waits the runtime controls poll the mark
// (InterruptCheck, at least every 100 ms), and blocking transport waits are
// ended by an aborter the scope's watcher thread calls (Gloo's abortWaitRecv).
// The call then throws Interrupted; the caller re-raises the signal once the
// scope has restored the previous handlers (Python: KeyboardInterrupt; the
// CLI: exit 128 + signal).
#pragma once

#include <functional>
#include <string>

#include "runtime/error.h"

namespace reshard {

/// What a call that was interrupted throws.
class Interrupted : public Error {
 public:
  Interrupted(int signal, const std::string& what) : Error(what), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

/// Installs the handlers (process-wide; nested and concurrent scopes share
/// one installation) and starts the watcher; the destructor restores the
/// previous handlers. Where a handler other than the default or Python's is
/// installed (a framework's own), it is left in place: this scope then only
/// sees signals that reach it another way.
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
  /// The signal that arrived while the scope was open (0: none).
  int signal() const;
};

/// The signal that arrived during the open scopes (0: none, or no scope open).
int InterruptSignal();
/// Throws Interrupted ("interrupted (SIGINT) while `doing`") if a signal arrived.
void InterruptCheck(const std::string& doing);

/// Registers `abort`, called from the watcher thread when a signal arrives
/// (at once if one has already arrived); returns a handle for Unregister.
/// `abort` must be safe to call from another thread while the owner waits.
int RegisterAborter(std::function<void()> abort);
void UnregisterAborter(int handle);

/// "SIGINT", "SIGTERM", ...
std::string SignalName(int signal);

}  // namespace reshard
