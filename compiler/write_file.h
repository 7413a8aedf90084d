// Writing an output file whole or not at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace reshard {

/// Writes `size` bytes to `path` through a temporary file beside it
/// (`path`.tmp.PID), flushed to disk and renamed over `path`: a failed write
/// leaves neither a partial file nor the temporary. SIGINT, SIGTERM and SIGHUP
/// are held in the calling thread while the file is written and renamed (a
/// few hundred ms for the largest plans) and delivered after, so an
/// interrupted command leaves the whole file or none either. (The `reshard`
/// commands write with no other thread running. In a process with threads
/// that leave these signals unblocked, such as PyTorch's in Python, one of
/// them may take the signal mid-write; the temporary then stays.) Throws
/// reshard::Error "PATH: cannot write: WHY".
void WriteFileAtomic(const std::string& path, const void* data, size_t size);

inline void WriteFileAtomic(const std::string& path, const std::vector<uint8_t>& bytes) {
  WriteFileAtomic(path, bytes.data(), bytes.size());
}
inline void WriteFileAtomic(const std::string& path, const std::string& text) {
  WriteFileAtomic(path, text.data(), text.size());
}

}  // namespace reshard
