// CPU kernels: copy a strided region into another, converting dtypes. These are
// the reference the GPU kernels are tested against, and the Gloo path's kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/plan.h"

namespace reshard {

/// A region (see Region in schema/plan.fbs) resolved against memory: element
/// (i0..i3) lives in `buffers[buffer + sum i_k*stride_k over buffer modes]` at
/// element offset `offset + sum i_k*stride_k over the other modes`. For
/// staging, `buffers` points at the single staging base and `buffer` is 0.
struct RegionView {
  char* const* buffers = nullptr;
  uint64_t buffer = 0;
  uint64_t offset = 0;
  int ndim = 0;
  uint64_t shape[4] = {1, 1, 1, 1};
  uint64_t stride[4] = {0, 0, 0, 0};
  uint8_t buffer_modes = 0;
  fb::Dtype dtype = fb::Dtype::fp32;
};

/// The view of `r` over `buffers` (staging: pass the staging base address
/// array and any buffer index; Region.buffer == kNone maps to index 0).
RegionView ViewOf(const fb::Region& r, char* const* buffers, fb::Dtype dtype);
/// A contiguous run of `elements` elements at `*base`.
RegionView ContiguousView(char* const* base, uint64_t offset, uint64_t elements, fb::Dtype dtype);

/// The same view with extent-1 modes dropped and adjacent modes that form one
/// arithmetic progression merged (so contiguous runs become one mode); visits
/// the same addresses in the same order.
RegionView Simplify(const RegionView& v);

uint64_t ViewElements(const RegionView& v);

/// Copies the elements of `src` into `dst`, pairing them by their row-major
/// index (mode 0 outermost) and converting src.dtype -> dst.dtype (bf16, fp16,
/// fp32). Both views must have the same element count. Contiguous runs of
/// equal dtype are memcpy'ed.
void CopyRegion(const RegionView& src, const RegionView& dst);

/// The offsets of a step's ends (Buffer.offset): a buffer that holds the
/// model's values plus c is read with c subtracted and written with c added.
/// Staging, and the wire, hold the model's values.
struct Offsets {
  float from = 0;  // of the src buffer (0: staging, or none)
  float to = 0;    // of the dst buffer (0: staging, or none)
  fb::Dtype wire = fb::Dtype::fp32;  // the step's wire dtype: the model's values are rounded to it
};

/// CopyRegion through the model's values: element x of src becomes
/// v = wire(x - from) (x itself where from is 0), and dst receives
/// dst.dtype(v + to), the arithmetic in fp32. A pack rounds to the wire once,
/// an unpack adds once, a local copy does both, so each end's rounding is
/// the one a staged message would have (runtime/synthetic.cc's reference
/// computes the same). bf16, fp16 and fp32 only.
void TransformRegion(const RegionView& src, const RegionView& dst, const Offsets& o);

/// A QuantOp resolved against memory (see QuantOp in schema/plan.fbs): views
/// in quant form (modes outer..., rows, cols), not simplified. `scale.dtype`
/// is fp32 or e8m0. runtime/quant.h has the rules and the CPU reference.
struct QuantArgs {
  fb::QuantKind kind = fb::QuantKind::quantize;
  RegionView src, dst, scale;
  uint32_t origin[2] = {0, 0};
  uint32_t block[2] = {1, 1};
};

/// Where a session's memory lives and its local steps (pack, copy, unpack)
/// run: CpuKernels() on host memory, or a device's (runtime/cuda/
/// device_kernels.h). A transport names the kernels of the memory it moves
/// (Transport::kernels()), so that the executor stays the same for every one.
class Kernels {
 public:
  virtual ~Kernels() = default;
  /// "cpu", "cuda:0", ...
  virtual std::string name() const = 0;
  /// Exactly `bytes` bytes of staging memory (on the device for a device);
  /// Release frees what Allocate returned.
  virtual char* Allocate(size_t bytes) = 0;
  virtual void Release(char* p) noexcept = 0;
  /// Throws reshard::Error when the `bytes` bytes at `p` are not memory these
  /// kernels reach (host memory bound to a device session, another device's
  /// memory); `what` names the memory in the message.
  virtual void CheckMemory(const void* p, size_t bytes, const std::string& what) const {}
  /// Starts copying `src` into `dst` (CopyRegion's contract); the copy may
  /// still be running when it returns. Copies run in the order started.
  virtual void Copy(const RegionView& src, const RegionView& dst) = 0;
  /// Starts a block-scaled conversion (runtime/quant.h), in order with the
  /// copies. Kernels without one throw reshard::Error.
  virtual void Quant(const QuantArgs& args);
  /// Starts TransformRegion (a step whose buffer holds offset values), in
  /// order with the copies. Kernels without one throw reshard::Error.
  virtual void Transform(const RegionView& src, const RegionView& dst, const Offsets& o);
  /// Waits until every copy started so far is done; throws reshard::Error on
  /// a device fault.
  virtual void Finish() = 0;
};

/// The CPU's kernels: CopyRegion on host memory, staging from the heap.
Kernels& CpuKernels();

}  // namespace reshard
