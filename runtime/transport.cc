#include "runtime/transport.h"

#include <cstring>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace reshard {

void Transport::Fail(const std::string& why) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (failure_.empty()) {
      failure_ = why.empty() ? "a run failed" : why;
      failed_in_run_ = runs_;
      first = true;
    }
  }
  if (first) {
    try {
      Publish(why);
    } catch (const std::exception&) {  // the peers still see the connections close
    }
  }
  abandon();
}

std::string Transport::failure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

void Transport::CheckUsable(const std::string& who) const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  ThrowIfFailed(who);
}

void Transport::BeginRun(const std::string& who) {
  std::lock_guard<std::mutex> lock(failure_mu_);
  ThrowIfFailed(who);
  ++runs_;
}

void Transport::ThrowIfFailed(const std::string& who) const {
  if (failure_.empty()) return;
  const std::string when = failed_in_run_ == 0 ? "before its first run" : "in run " + std::to_string(failed_in_run_);
  throw Error(who + "this transport failed " + when + " (" + failure_ +
              "); its connections are closed: make a new transport, and a session on it, for the next refit");
}

bool Transport::Claim() {
  std::lock_guard<std::mutex> lock(failure_mu_);
  if (claimed_) return false;
  claimed_ = true;
  return true;
}

void Transport::Release() {
  std::lock_guard<std::mutex> lock(failure_mu_);
  claimed_ = false;
}

bool Transport::allgather(const void* mine, size_t bytes, void* all, Clock::time_point deadline) {
  MessageCalls calls;
  calls.post = [this](bool send, uint32_t peer, void* data, size_t n) { return post(send, 0, peer, kHelloSeq, data, n); };
  calls.start = [this] { start(); };
  calls.wait = [this](size_t h, Clock::time_point d) { wait(h, d); };
  calls.reset = [this] { reset(); };
  return GatherByMessages(calls, mine, bytes, all, deadline);
}

bool Transport::GatherByMessages(const MessageCalls& calls, const void* mine, size_t bytes, void* all,
                                 Clock::time_point deadline) {
  char* out = static_cast<char*>(all);
  const uint32_t me = rank(), n = size();
  std::memcpy(out + size_t{me} * bytes, mine, bytes);
  if (n == 1) return true;
  // Receives first, then sends (Gloo starts each as it is posted), then wait
  // for every receive in rank order: the first peer not heard from is named.
  std::vector<size_t> recvs(n), sends(n);
  std::vector<char> copy(static_cast<const char*>(mine), static_cast<const char*>(mine) + bytes);
  uint32_t p = 0;
  try {
    for (p = 0; p < n; ++p)
      if (p != me) recvs[p] = calls.post(false, p, out + size_t{p} * bytes, bytes);
    for (p = 0; p < n; ++p)
      if (p != me) sends[p] = calls.post(true, p, copy.data(), bytes);
    p = n;
    calls.start();
  } catch (const Error& e) {
    calls.reset();
    throw Error((p < n ? "cannot reach rank " + std::to_string(p) + ": " : std::string()) + e.what());
  }
  for (p = 0; p < n; ++p) {
    if (p == me) continue;
    try {
      calls.wait(recvs[p], deadline);
    } catch (const Error& e) {
      calls.reset();
      throw Error("no hello from rank " + std::to_string(p) + ": " + e.what());
    }
  }
  for (p = 0; p < n; ++p) {
    if (p == me) continue;
    try {
      calls.wait(sends[p], deadline);
    } catch (const Error& e) {
      calls.reset();
      throw Error("rank " + std::to_string(p) + " did not take the hello: " + e.what());
    }
  }
  calls.reset();
  return true;
}

}  // namespace reshard
