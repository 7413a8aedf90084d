// A compiled plan file: memory-mapped, verified on open, one program per global
// rank read (and checked) on demand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plan_generated.h"
#include "runtime/content_digest.h"

namespace reshard {

/// The newest schema version this reader reads (Plan.schema_version): 3,
/// whose buffers may hold values offset from the model's (Buffer.offset).
/// The compiler writes 3 only for plans that use it, and
/// kPlainSchemaVersion (2: programs packed, Program.packed) for the others,
/// so that a reader older than offsets refuses exactly the plans it would
/// replay wrong. This reader also reads version 1.
constexpr uint32_t kSchemaVersion = 3;
constexpr uint32_t kPlainSchemaVersion = 2;
constexpr uint32_t kOldestSchemaVersion = 1;
/// "No region" in Step.src/dst, "staging" in Region.buffer, "no dependency" in Step.dep.
constexpr uint32_t kNone = 0xFFFFFFFFu;

/// A read-only plan. Opening checks the file size, the identifier "RSPL", the
/// schema version and runs the flatbuffers verifier; `program(r)` additionally
/// checks rank r's program semantically (every address in range) so that a
/// runtime replaying it cannot touch memory outside what it bound.
class Plan {
 public:
  /// Maps `path` read-only. Throws reshard::Error naming the file and what is wrong.
  static Plan open(const std::string& path);
  /// The same checks on bytes in memory (tests); `name` stands for the path in messages.
  static Plan from_bytes(std::vector<uint8_t> bytes, std::string name);

  Plan(Plan&& other) noexcept;
  Plan& operator=(Plan&& other) noexcept;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan();

  const fb::Plan& root() const;
  uint32_t num_ranks() const;
  /// The verified and checked program of one global rank (checks are cached;
  /// safe to call from several threads).
  const fb::Program& program(uint32_t global_rank) const;
  const std::string& path() const;
  size_t size_bytes() const;
  /// The digest of the whole file: the one it carries (Plan.content_digest),
  /// or, for plans written before that field, computed from the bytes once.
  /// Two plan files with the same digest hold the same plan.
  ContentDigest content_digest() const;
  /// The plan ranks that need a process, ascending: those the training or
  /// inference side uses, or that hold buffers or steps. The rest are idle
  /// (the unused GPUs of partly used NVLink domains) and need none. A job
  /// launches one process per active rank; process i plays plan rank
  /// active_ranks()[i], on a transport of active_ranks().size() ranks (see
  /// Session). Where every rank is active, process i plays plan rank i.
  const std::vector<uint32_t>& active_ranks() const;
  /// The index of `plan_rank` in active_ranks() (its process), or -1 if idle.
  int64_t process_of(uint32_t plan_rank) const;
  /// Whether the file carries its digest (false: content_digest() computed it).
  bool carries_content_digest() const;
  /// Recomputes the digest from the bytes and returns "" when it matches the
  /// one the file carries (or the file carries none), else what differs.
  std::string check_content_digest() const;

 private:
  struct Impl;
  explicit Plan(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// CuTe notation for a region, e.g. "(4,16,458752):(b16,b1,1)"; strides of
/// modes that select the buffer are prefixed with b. Staging regions read the same.
std::string FormatRegion(const fb::Region& r);
/// Bytes per element of a dtype (fp8/e8m0: 1).
size_t DtypeSize(fb::Dtype d);
/// "bf16", "fp16", "fp32", "fp8_e4m3", "e8m0"; "dtype(N)" for values out of range.
const char* DtypeName(fb::Dtype d);
/// "pack", "send", ...; "kind(N)" for values out of range.
const char* StepKindName(fb::StepKind k);
const char* QuantKindName(fb::QuantKind k);
/// Number of elements of a region (product of its mode shapes; UINT64_MAX if it does not fit).
uint64_t RegionElements(const fb::Region& r);
/// Number of elements of a buffer (product of its shape; UINT64_MAX if it does not fit).
uint64_t BufferElements(const fb::Buffer& b);

}  // namespace reshard
