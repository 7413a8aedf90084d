// Routing of block-scaled FP8 tensors, the part of passes 3 and 4 that
// route.cc hands off: which box a piece's sender reads, who converts, how many
// bytes move, and the steps with their quant ops.
//
// A piece is a box a destination needs (`need`) from one source replica. When
// the destination stores the tensor quantized, someone must see whole blocks
// of the destination's grid: the piece reads the block cover of its need
// (`read`, clipped at the tensor's edge), and pieces of one destination are
// cut only at block edges, so that every block (and its scale) is quantized
// exactly once, when complete. Then either
// - the sender quantizes (its buffer holds the whole cover in a wide dtype):
//   it sends the FP8 values of `need` and the scales of the cover, and the
//   receiver unpacks both unchanged; about half the bytes of BF16; or
// - the receiver quantizes: the sender sends the cover in the tensor's dtype
//   (dequantizing first when its own buffer is FP8), the receiver quantizes it
//   into its buffer and scales.
// A quantized source with a plain destination dequantizes on the sender.
// What a piece stages is the same for every needer of its box, so relays
// forward it unchanged and each needer runs its own unpacks (EmitUnpack);
// relay stripes are cut at block edges (Stripes).
//
// A block whose cover no single training rank holds (TP cutting per-channel
// or per-tensor blocks, or shard edges inside 128x128 blocks) is quantized by
// the receiver from parts that several senders send in one round. Its need is
// cut into groups of whole blocks (Groups), each one of two ways:
// - the amax path (AmaxPath: the training side holds the tensor unquantized):
//   every source cell the group's cover touches sends the partial block
//   amaxes of its part (EmitAmax), and the cells the need touches send its
//   values; the receiver takes the scales of the largest amaxes and quantizes
//   the need with them (EmitScaledQuantize). The values, when they come from
//   several cells, are first unpacked into a frame of the need;
// - the frame path (FP8 training weights): every cell sends its part of the
//   cover, dequantized, in the tensor's dtype; the receiver unpacks each part
//   into its place in a row-major image of the whole cover in its staging
//   (the frame, EmitPartUnpack/EmitPartCopy) and quantizes the frame once,
//   after every part has landed (EmitUnpack of Assembled()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/expand.h"
#include "compiler/program.h"

namespace reshard {

struct QuantPiece {
  Box need;                    // lands in the destination fragment
  Box read;                    // what the sender reads: `need`, or its block cover
  bool dequantize = false;     // the sender's buffer is FP8: pack dequantizes
  bool quantize_sender = false;
  bool quantize_receiver = false;
  uint64_t bytes = 0;          // staged and sent
};

class QuantRouter {
 public:
  /// `src`/`dst` as route sees them: dst scale fragments already renumbered
  /// after the training side's scale tensors (compile.cc).
  QuantRouter(const ModelSpec& model, const LayoutSpec& src_layout, const Expansion& src, const LayoutSpec& dst_layout,
              const Expansion& dst, bool quantize_on_sender);

  /// Whether either layout stores tensor `t` quantized.
  bool Quantized(int t) const;

  /// The pieces that move `need` (inside source cell `cell`, held by `sf`) to
  /// `df`: block covers disjoint and inside the cell, at most `max_bytes`
  /// each (a piece of one block, which cannot be cut, at most
  /// `block_max_bytes` where that is larger), regions within 4 modes. The
  /// cover of `need` must lie in `cell` (otherwise the need is assembled: Groups).
  std::vector<QuantPiece> Pieces(int t, const FragmentRef& sf, const Box& cell, const FragmentRef& df,
                                 const Box& need, uint64_t max_bytes, uint64_t block_max_bytes = 0) const;

  /// The cover of `need` by the destination's blocks, clipped to the tensor (`need` when not quantized there).
  Box Cover(int t, const Box& need) const;

  /// The groups of an assembled need: `need` cut at block edges into boxes
  /// whose cover (or, `by_need`, the box itself) is at most `max_bytes` in the
  /// tensor's dtype (one block may exceed it: it cannot be cut) and whose
  /// regions fit the step format.
  std::vector<Box> Groups(int t, const FragmentRef& df, const Box& need, uint64_t max_bytes, bool by_need) const;
  /// What the sender of `part` (of an assembled cover) stages: its values in
  /// the tensor's dtype, dequantized when its buffer is FP8. For EmitPack.
  QuantPiece Part(int t, const Box& part) const;
  /// The receiver's quantize of an assembled group `need` from its frame: for EmitUnpack.
  QuantPiece Assembled(int t, const Box& need) const;
  /// A received part, at byte `slot` of B's staging, unpacked into its place
  /// in the frame of `cover` at byte `frame`.
  void EmitPartUnpack(int t, const Box& cover, const Box& part, RankProgram& B, size_t round, uint64_t slot,
                      uint64_t frame) const;
  /// A part the receiver holds itself (colocated): copied from its buffer
  /// (dequantized when FP8) into its place in the frame, before the round's messages.
  void EmitPartCopy(int t, const Box& cover, const Box& part, const FragmentRef& sf, RankProgram& P, size_t round,
                    uint64_t frame) const;

  /// Whether a need whose blocks training ranks split takes the amax path
  /// (below): the training side holds the tensor unquantized. Otherwise its
  /// parts are assembled in a frame (above).
  bool AmaxPath(int t) const;
  /// The bytes of the fp32 amax grid of `cover`'s blocks.
  uint64_t GridBytes(int t, const Box& cover) const;
  /// The amax path, for a need whose block cover training ranks split: each
  /// holder of a part of the cover sends the part's partial block amaxes (an
  /// fp32 grid over the cover's blocks, 0 where the part has none) and only
  /// what the receiver needs of the values, in BF16; the receiver takes the
  /// scales of the largest amaxes and quantizes its values with them. Bytes
  /// are the need's, not the cover's.
  /// The pack of `part`'s grid at byte `off` of P's staging (a sender's, or
  /// the receiver's own when colocated).
  void EmitAmax(int t, const Box& cover, const Box& part, const FragmentRef& sf, RankProgram& P, size_t round,
                uint64_t off) const;
  /// A grid of `bytes` received at byte `slot` of B's staging, copied to its place `at` in the grid area.
  void EmitGridUnpack(uint64_t bytes, RankProgram& B, size_t round, uint64_t slot, uint64_t at) const;
  /// The receiver's two unpacks: scales of `need`'s blocks from the `grids`
  /// grids at byte `area` (`slot` bytes apart), then its FP8 values from their
  /// BF16 image at byte `values`.
  void EmitScaledQuantize(int t, const Box& need, size_t grids, uint64_t area, uint64_t slot, uint64_t values,
                          const FragmentRef& df, RankProgram& B, size_t round) const;

  /// Cuts `box` into at most `n` stripes of about equal size at block edges
  /// of the destination's grid (for relaying: a stripe's pieces are then the
  /// same for every needer of the box).
  std::vector<Box> Stripes(int t, const Box& box, uint64_t n) const;

  /// The sender's step of a staged piece: a pack on `A` (training rank) into
  /// its staging at byte `oa`, `p.bytes` bytes, the same for every receiver.
  void EmitPack(int t, const QuantPiece& p, const FragmentRef& sf, RankProgram& A, size_t round, uint64_t oa) const;
  /// A receiver's steps: unpacks on `B` (an inference rank needing `p.need`
  /// through fragment `df`) of what EmitPack staged, now at byte `ob` of B's staging.
  void EmitUnpack(int t, const QuantPiece& p, const FragmentRef& df, RankProgram& B, size_t round, uint64_t ob) const;

  /// A piece whose sender and receiver are the same rank (colocated): one copy step.
  void EmitCopy(int t, const QuantPiece& p, const FragmentRef& sf, const FragmentRef& df, RankProgram& P,
                size_t round) const;

 private:
  struct Side {
    const Expansion* e;
    const LayoutSpec* layout;
    std::vector<int> scale_of;   // per model tensor: its scale tensor index in e->scales, -1 if none
    int first_scale = 0;         // plan tensor index of e->scales[0]
  };
  const ScaleTensor* Scale(const Side& s, int t) const;
  std::array<int64_t, 2> Block(const Side& s, int t) const;
  StridedRegion ScaleRegion(const Side& s, int rank, int t, const Box& blocks, uint32_t buffer_base) const;
  // A piece's quant ops, their scale region still to set.
  QuantOpIR DequantOp(int t, const Box& read) const;
  QuantOpIR QuantizeOp(int t, const QuantPiece& p) const;

  const ModelSpec& model_;
  Side src_, dst_;
  bool quantize_on_sender_;
};

}  // namespace reshard
