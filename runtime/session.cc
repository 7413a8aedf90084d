#include "runtime/session.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <optional>
#include <unordered_map>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/hello.h"
#include "runtime/interrupt.h"
#include "runtime/rank_map.h"

namespace reshard {
namespace {

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The transport the executor talks through: `transport` itself, or, over the
// active ranks only, a view of it that names peers by plan rank.
std::unique_ptr<Transport> MapRanks(const Plan& plan, Transport& transport) {
  const uint32_t size = transport.size();
  if (size == plan.num_ranks() || size != plan.active_ranks().size() || transport.rank() >= size) return nullptr;
  return std::make_unique<RankMappedTransport>(plan, transport);
}

}  // namespace

Session::Session(const Plan& plan, uint32_t global_rank, Transport& transport)
    : plan_(plan),
      program_(plan.program(global_rank)),
      rank_(global_rank),
      transport_(transport),
      staging_bytes_(program_.staging_bytes()),
      kernels_(transport.kernels()),
      mapped_(MapRanks(plan, transport)),
      executor_(program_, mapped_ ? *mapped_ : transport) {
  const std::string at = "rank " + std::to_string(rank_) + ": ";
  transport.CheckUsable(at);
  if (!transport.Claim()) {
    throw Error(at + "this transport already serves a session: one session per transport at a time (a second one "
                "would take the first one's messages); close the other session first (Session.close()), or make a "
                "new transport");
  }
  struct ReleaseOnThrow {
    Transport& t;
    bool armed = true;
    ~ReleaseOnThrow() {
      if (armed) t.Release();
    }
  } release{transport};
  // First, while every rank is here: one plan, distinct ranks (a mismatch
  // found only locally would leave the peers waiting for this rank).
  try {
    proven_ = ExchangeHellos(plan, global_rank, transport);
  } catch (const Error&) {
    if (int sig = InterruptSignal()) {
      transport.abandon();  // the peers' hello waits fail now, naming this rank
      throw Interrupted(sig, at + "interrupted (" + SignalName(sig) + ") during the hello at connect");
    }
    throw;
  }
  if (std::string why = RankMismatch(plan, global_rank, transport); !why.empty()) throw Error(at + why);
  // Every dtype of the schema moves; which conversions a step may ask for
  // Plan::program has checked.
  const uint32_t nbuf = program_.buffers() ? program_.buffers()->size() : 0;
  staging_ = kernels_.Allocate(staging_bytes_);
  bound_.assign(nbuf, nullptr);
  release.armed = false;
}

Session::~Session() {
  kernels_.Release(staging_);
  transport_.Release();
}

std::vector<std::string> Session::buffer_names() const {
  std::vector<std::string> names;
  if (program_.buffers() == nullptr) return names;
  for (const fb::Buffer* b : *program_.buffers()) names.push_back(b->name()->str());
  return names;
}

void Session::bind(const std::string& name, void* ptr, fb::Dtype dtype, std::vector<uint64_t> shape) {
  const std::string at = "rank " + std::to_string(rank_) + ": ";
  const uint32_t nbuf = program_.buffers() ? program_.buffers()->size() : 0;
  uint32_t index = nbuf;
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (uint32_t b = 0; b < nbuf; ++b) {
    const std::string candidate = program_.buffers()->Get(b)->name()->str();
    if (candidate == name) {
      index = b;
      break;
    }
    size_t d = EditDistance(candidate, name);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  if (index == nbuf) {
    // Colocated plans write a name both sides use on one GPU as train:NAME and infer:NAME.
    bool both = false;
    for (uint32_t b = 0; b < nbuf && !both; ++b) both = program_.buffers()->Get(b)->name()->str() == "train:" + name;
    if (both)
      throw Error(at + "buffer '" + name + "' is on this GPU for both sides (colocated): bind 'train:" + name +
                  "' (the training side's) or 'infer:" + name + "' (the inference side's); Python: "
                  "bind_module(module, side=\"train\") or side=\"infer\"");
    std::string msg = at + "the plan has no buffer '" + name + "' for this rank";
    if (!best.empty() && best_distance <= std::max<size_t>(3, name.size() / 4)) msg += " (did you mean '" + best + "'?)";
    throw Error(msg);
  }
  bind_index(index, ptr, dtype, std::move(shape));
}

void Session::bind_index(uint32_t index, void* ptr, fb::Dtype dtype, std::vector<uint64_t> shape) {
  const std::string at = "rank " + std::to_string(rank_) + ": ";
  const uint32_t nbuf = program_.buffers() ? program_.buffers()->size() : 0;
  if (index >= nbuf) {
    throw Error(at + "buffer index " + std::to_string(index) + " out of range (" + std::to_string(nbuf) + " buffers)");
  }
  const fb::Buffer& b = *program_.buffers()->Get(index);
  const std::string name = b.name()->str();
  if (dtype != b.dtype()) {
    throw Error(at + "buffer '" + name + "' is bound with dtype " + DtypeName(dtype) + ", the plan expects " +
                DtypeName(b.dtype()));
  }
  std::vector<uint64_t> want(b.shape()->begin(), b.shape()->end());
  if (shape != want) {
    throw Error(at + "buffer '" + name + "' is bound with shape " + ShapeString(shape) + ", the plan expects " +
                ShapeString(want));
  }
  if (ptr == nullptr && BufferElements(b) != 0) throw Error(at + "buffer '" + name + "' is bound to a null pointer");
  const uint64_t bytes = BufferElements(b) * DtypeSize(b.dtype());
  if (ptr != nullptr) kernels_.CheckMemory(ptr, bytes, at + "buffer '" + name + "'");
  if (executor_.writes(index)) BindDestination(index, reinterpret_cast<uintptr_t>(ptr), bytes, at);
  bound_[index] = static_cast<char*>(ptr);
}

void Session::BindDestination(uint32_t index, uintptr_t start, uint64_t bytes, const std::string& at) {
  // Rebinding replaces the buffer's previous memory: it is left out of the
  // check, and put back if the new memory is refused.
  std::optional<std::pair<uintptr_t, std::pair<uintptr_t, uint32_t>>> old;
  if (char* was = bound_[index]; was != nullptr) {
    auto it = destinations_.find(reinterpret_cast<uintptr_t>(was));
    if (it != destinations_.end() && it->second.second == index) {
      old = *it;
      destinations_.erase(it);
    }
  }
  if (bytes == 0 || start == 0) return;
  const uintptr_t end = start + bytes;
  // Ranges in the map never overlap, so only the neighbours by start address
  // can overlap the new one: the first starting at or after it, and the one before.
  auto next = destinations_.lower_bound(start);
  auto hit = destinations_.end();
  if (next != destinations_.end() && next->first < end) hit = next;
  if (hit == destinations_.end() && next != destinations_.begin() && std::prev(next)->second.first > start) {
    hit = std::prev(next);
  }
  if (hit != destinations_.end()) {
    if (old) destinations_.insert(*old);
    auto range = [](uintptr_t a, uintptr_t b) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "[0x%zx, 0x%zx)", static_cast<size_t>(a), static_cast<size_t>(b));
      return std::string(buf);
    };
    throw Error(at + "buffer '" + program_.buffers()->Get(index)->name()->str() + "' is bound to memory " +
                range(start, end) + " that overlaps buffer '" +
                program_.buffers()->Get(hit->second.second)->name()->str() + "' " +
                range(hit->first, hit->second.first) +
                ": both are destinations, so each would overwrite the other's weights; bind each to its own tensor");
  }
  destinations_.emplace(start, std::make_pair(end, index));
}

void Session::abort(const std::string& why) { transport_.Fail(why); }

RunStats Session::run() {
  const std::string at = "rank " + std::to_string(rank_) + ": ";
  if (running_.exchange(true)) {
    throw Error(at + "run() is already in progress on this session in another thread: a session runs one refit at a "
                "time (wait for it to return)");
  }
  struct Done {
    std::atomic<bool>& running;
    ~Done() { running = false; }
  } done{running_};
  transport_.BeginRun(at);
  std::vector<std::string> missing;
  for (size_t b = 0; b < bound_.size(); ++b) {
    if (bound_[b] == nullptr && BufferElements(*program_.buffers()->Get(b)) != 0) {
      missing.push_back(program_.buffers()->Get(b)->name()->str());
    }
  }
  if (!missing.empty()) {
    std::string msg = "rank " + std::to_string(rank_) + ": ";
    if (missing.size() == 1) {
      msg += "buffer '" + missing[0] + "' is not bound";
    } else {
      msg += std::to_string(missing.size()) + " of " + std::to_string(bound_.size()) + " buffers are not bound: ";
      constexpr size_t kShow = 5;
      for (size_t i = 0; i < missing.size() && i < kShow; ++i) {
        msg += i ? ", '" : "'";
        msg += missing[i];
        msg += "'";
      }
      if (missing.size() > kShow) msg += ", ...";
    }
    transport_.Fail(msg + " (nothing was sent)");  // the peers stop waiting for this rank now
    throw Error(msg);
  }
  try {
    return executor_.Run(bound_, staging_);
  } catch (const Error& e) {
    if (int sig = InterruptSignal()) {
      const std::string why =
          at + "interrupted (" + SignalName(sig) + ") during run(); the transport is closed: " + e.what();
      transport_.Fail(why);  // the peers' waits on this rank fail now, naming it
      throw Interrupted(sig, why);
    }
    transport_.Fail(e.what());
    throw;
  }
}

}  // namespace reshard
