// Work split over the machine's threads: the compiler's independent passes
// (packing programs, sharing packs, working out regions) use it alike.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace reshard {

/// The threads to use for `items` independent items: the machine's, at
/// least 1, at most 16 and at most `items`.
inline size_t ThreadsFor(size_t items) {
  return std::max<size_t>(1, std::min({static_cast<size_t>(std::thread::hardware_concurrency()), size_t{16}, items}));
}

/// Runs work(t) for t in [0, threads): t = 0 on the calling thread, the
/// others on threads of their own. Returns once all have ended; rethrows
/// the first exception one of them threw.
template <class Work>
void OnThreads(size_t threads, Work work) {
  std::exception_ptr error;
  std::mutex mu;
  auto run = [&](size_t t) {
    try {
      work(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(run, t);
  run(0);
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace reshard
