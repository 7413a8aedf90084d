// Mode coalescing of a strided region, shared by the compiler (which emits
// regions) and the runtime (which copies them): one definition of when two
// neighbouring modes are one.
#pragma once

#include <cstdint>

namespace reshard {

/// Drops extent-1 modes and merges each mode into its outer neighbour when
/// both step the same way (through buffers, or through elements: bit k of
/// `buffer_modes`) and the outer stride equals the inner extent times the
/// inner stride, keeping merged extents below `limit`. Modes are outermost
/// first. Writes the result to `out_*` (room for `ndim` modes, at least one)
/// and returns its mode count; a single element comes back as one mode (1):(1).
template <class Int>
int CoalesceModes(int ndim, const Int* shape, const Int* stride, uint32_t buffer_modes, Int limit, Int* out_shape,
                  Int* out_stride, uint32_t* out_buffer_modes) {
  // The per-mode kind lives in a bool array, not in bits of a mask: GCC 12.2
  // at -O1 and above mis-compiles the merge test when the previous mode's kind
  // is read back from a mask built in the same loop (reproduced with a
  // stand-alone function; clang gets it right).
  bool is_buffer[32] = {};
  int n = 0;
  for (int k = 0; k < ndim; ++k) {
    if (shape[k] == 1) continue;
    const bool b = (buffer_modes >> k) & 1u;
    if (n > 0 && is_buffer[n - 1] == b && out_stride[n - 1] == shape[k] * stride[k] &&
        out_shape[n - 1] * shape[k] < limit) {
      out_shape[n - 1] *= shape[k];
      out_stride[n - 1] = stride[k];
      continue;
    }
    out_shape[n] = shape[k];
    out_stride[n] = stride[k];
    is_buffer[n] = b;
    ++n;
  }
  uint32_t modes = 0;
  for (int k = 0; k < n; ++k)
    if (is_buffer[k]) modes |= 1u << k;
  if (n == 0) {
    out_shape[0] = 1;
    out_stride[0] = 1;
    n = 1;
  }
  *out_buffer_modes = modes;
  return n;
}

}  // namespace reshard
