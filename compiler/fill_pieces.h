// The pieces as one fill of the rounds sees them (route_schedule.cc): the
// router's pieces, shared by every fill and never changed while they run,
// and what this fill changed - the pieces it split (their first parts), the
// parts it split off, and every piece's round. The fill that is kept is
// applied to the router's pieces at the end (ApplyTo).
//
// The fills share the router's pieces instead of each copying them all: a
// large plan has over a hundred thousand pieces, three fills run at once,
// and copies grown by doubling as parts are split off cost page faults and
// peak memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "compiler/router.h"

namespace reshard::routing {

class FillPieces {
 public:
  explicit FillPieces(const std::vector<DPiece>& base)
      : base_(&base), n_(static_cast<uint32_t>(base.size())), where_(base.size(), kNone), rounds_(base.size()) {
    for (uint32_t i = 0; i < n_; ++i) rounds_[i] = base[i].round;
    // Address space only: pages are touched as pieces come. Grown by
    // doubling instead, each copy would land in fresh pages (page faults).
    edited_.reserve(n_);
    added_.reserve(n_);
    rounds_.reserve(2 * size_t{n_});
  }

  size_t size() const { return rounds_.size(); }

  /// Piece i as this fill has it. Its `round` is not kept up to date: see
  /// Round(). The reference lasts until the next Edit or Append.
  const DPiece& operator[](uint32_t i) const {
    if (i >= n_) return added_[i - n_];
    return where_[i] == kNone ? (*base_)[i] : edited_[where_[i]];
  }

  /// Piece i, to change (the router's piece is copied on the first change).
  DPiece& Edit(uint32_t i) {
    if (i >= n_) return added_[i - n_];
    if (where_[i] == kNone) {
      where_[i] = static_cast<uint32_t>(edited_.size());
      edited_.push_back((*base_)[i]);
    }
    return edited_[where_[i]];
  }

  /// Adds a piece in round `round`; returns its index.
  uint32_t Append(const DPiece& p, size_t round) {
    added_.push_back(p);
    rounds_.push_back(round);
    return static_cast<uint32_t>(rounds_.size() - 1);
  }

  size_t Round(uint32_t i) const { return rounds_[i]; }
  void SetRound(uint32_t i, size_t round) { rounds_[i] = round; }

  /// Makes `pieces` (the router's pieces this fill started from) what the
  /// fill made of them: the split pieces' first parts in place, the parts
  /// split off after them in the order they were made, every round set.
  void ApplyTo(std::vector<DPiece>& pieces) const {
    for (uint32_t i = 0; i < n_; ++i)
      if (where_[i] != kNone) pieces[i] = edited_[where_[i]];
    pieces.insert(pieces.end(), added_.begin(), added_.end());
    for (size_t i = 0; i < pieces.size(); ++i) pieces[i].round = rounds_[i];
  }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  const std::vector<DPiece>* base_;
  uint32_t n_;                   // base_->size() when the fill started
  std::vector<uint32_t> where_;  // per base piece: its index in edited_, or kNone
  std::vector<DPiece> edited_;   // base pieces this fill changed
  std::vector<DPiece> added_;    // pieces n_, n_ + 1, ...: parts split off
  std::vector<size_t> rounds_;   // per piece
};

}  // namespace reshard::routing
