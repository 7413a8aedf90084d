// A Gloo rendezvous store that waits for the transport's timeout. Gloo's
// FileStore waits 30 s (Store::kDefaultTimeout) for a key in get(), whatever
// the context's timeout, so ranks started more than 30 s apart failed to
// connect through a shared directory.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace reshard {

class WaitingStore : public gloo::rendezvous::Store {
 public:
  WaitingStore(std::unique_ptr<gloo::rendezvous::Store> base, std::chrono::milliseconds timeout)
      : base_(std::move(base)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { base_->set(key, data); }
  std::vector<char> get(const std::string& key) override {
    base_->wait({key}, timeout_);
    return base_->get(key);
  }
  void wait(const std::vector<std::string>& keys) override { base_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    base_->wait(keys, timeout);
  }

 private:
  std::unique_ptr<gloo::rendezvous::Store> base_;
  std::chrono::milliseconds timeout_;
};

}  // namespace reshard
