// A Gloo rendezvous store that waits for the transport's timeout. Gloo's
// FileStore waits 30 s (Store::kDefaultTimeout) for a key in get(), whatever
// the context's timeout, so ranks started more than 30 s apart failed to
// connect through a shared directory. Every wait ends at one deadline, the
// store's creation plus the timeout: connecting waits for peers' keys more
// than once, and with a fresh timeout per wait a rank that never came made
// connecting outlast the stated timeout (3.1 s at --timeout 2 with 11 ranks
// missing; 2.15 s with the deadline).
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace reshard {

class WaitingStore : public gloo::rendezvous::Store {
 public:
  WaitingStore(std::unique_ptr<gloo::rendezvous::Store> base, std::chrono::milliseconds timeout)
      : base_(std::move(base)), deadline_(std::chrono::steady_clock::now() + timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { base_->set(key, data); }
  std::vector<char> get(const std::string& key) override {
    base_->wait({key}, Left());
    return base_->get(key);
  }
  void wait(const std::vector<std::string>& keys) override { base_->wait(keys, Left()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    base_->wait(keys, std::min(timeout, Left()));
  }

 private:
  // What is left until the deadline; at least 1 ms (Gloo reads 0 as "forever").
  std::chrono::milliseconds Left() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - std::chrono::steady_clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  }

  std::unique_ptr<gloo::rendezvous::Store> base_;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace reshard
