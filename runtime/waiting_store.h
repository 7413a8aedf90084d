// A Gloo rendezvous store that waits for the transport's timeout. Gloo's
// FileStore waits 30 s (Store::kDefaultTimeout) for a key in get(), whatever
// the context's timeout, so ranks started more than 30 s apart would fail to
// connect through a shared directory. Every wait ends at one deadline, the
// store's creation plus the timeout: connecting waits for peers' keys more
// than once, and with a fresh timeout per wait a rank that never came would
// make connecting outlast the stated timeout.
//
// Waits poll the keys every 10 ms (Gloo's FileStore::wait sleeps whole
// seconds, overshooting a short timeout); every 100 ms the store asks
// `aborted` (a peer's abort key: a duplicate rank, an interrupted peer) and
// checks for an interrupt (runtime/interrupt.h), so that either ends
// connecting at once.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>

#include "runtime/error.h"
#include "runtime/interrupt.h"

namespace reshard {

/// Connecting stopped for a reason a rank gave (a duplicate rank, an
/// interrupted peer), not at the timeout.
class ConnectAborted : public Error {
 public:
  using Error::Error;
};

class WaitingStore : public gloo::rendezvous::Store {
 public:
  /// Whether every key is there now, without waiting.
  using Probe = std::function<bool(const std::vector<std::string>& keys)>;
  /// `has` probes `base` for keys (it must: Gloo's FileStore::wait sleeps
  /// in whole seconds, whatever the timeout asked); `aborted` returns why
  /// connecting must stop ("" to go on) and may be empty.
  WaitingStore(std::unique_ptr<gloo::rendezvous::Store> base, std::chrono::milliseconds timeout, Probe has,
               std::function<std::string()> aborted = {})
      : base_(std::move(base)),
        deadline_(std::chrono::steady_clock::now() + timeout),
        has_(std::move(has)),
        aborted_(std::move(aborted)) {}
  void set(const std::string& key, const std::vector<char>& data) override { base_->set(key, data); }
  std::vector<char> get(const std::string& key) override {
    Wait({key}, deadline_);
    return base_->get(key);
  }
  void wait(const std::vector<std::string>& keys) override { Wait(keys, deadline_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    Wait(keys, std::min(deadline_, std::chrono::steady_clock::now() + timeout));
  }

 private:
  // Polls every 10 ms; checks for an interrupt and the abort reason every 100 ms.
  void Wait(const std::vector<std::string>& keys, std::chrono::steady_clock::time_point until) {
    using namespace std::chrono;
    for (int k = 0;; ++k) {
      if (k % 10 == 0) {
        InterruptCheck("connecting");
        if (aborted_) {
          if (std::string why = aborted_(); !why.empty()) throw ConnectAborted(why);
        }
      }
      if (has_(keys)) return;
      if (steady_clock::now() >= until) {
        std::string missing;  // in Gloo's words, which GlooTransport reads back
        for (const std::string& key : keys)
          if (!has_({key})) missing += (missing.empty() ? "" : ", ") + key;
        throw Error("Wait timeout for key(s): " + missing);
      }
      std::this_thread::sleep_for(std::min(milliseconds(10), duration_cast<milliseconds>(until - steady_clock::now()) +
                                                                 milliseconds(1)));
    }
  }

  std::unique_ptr<gloo::rendezvous::Store> base_;
  std::chrono::steady_clock::time_point deadline_;
  Probe has_;
  std::function<std::string()> aborted_;
};

}  // namespace reshard
