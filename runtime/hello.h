// The hello at connect: when a session starts, every rank tells every other
// which plan it runs (the plan file's content digest) and which plan rank it
// plays, and all of them check the same table. Ranks on different plans, or
// two processes playing one plan rank, end on every rank with the same error
// before any byte of a run moves (a mismatch would otherwise crash receivers
// or leave weights wrong without an error).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/plan.h"
#include "runtime/transport.h"

namespace reshard {

/// The hello did not complete: a peer not heard from, or failed (a peer's
/// problem, where a mismatch in the table is the plan's).
class HelloFailed : public Error {
 public:
  using Error::Error;
};

/// What each rank says. Fixed size, host byte order (all ranks of a job are
/// little-endian x86-64 or aarch64).
struct Hello {
  char magic[8];        // "RSHELLO1"
  uint64_t digest_hi;   // the plan's content digest
  uint64_t digest_lo;
  uint32_t plan_rank;   // the plan rank this process plays
  uint32_t transport_rank;
  uint32_t num_plan_ranks;
  uint32_t pid;
  char host[32];        // gethostname, truncated
  char plan[56];        // the plan file's name (last path component), truncated
};
static_assert(sizeof(Hello) == 128, "Hello is exchanged as raw bytes");

/// This process's hello for plan rank `plan_rank` on `transport`.
Hello MakeHello(const Plan& plan, uint32_t plan_rank, const Transport& transport);

/// Why the gathered table (one Hello per transport rank) is not one plan with
/// distinct plan ranks; "" when it is. The same on every rank.
std::string CheckHellos(const std::vector<Hello>& all);

/// Exchanges hellos over `transport` and throws reshard::Error ("rank R: ...")
/// on any mismatch, or when a peer is not heard from by the transport's timeout.
/// Returns false (nothing proven) where the transport cannot gather.
bool ExchangeHellos(const Plan& plan, uint32_t plan_rank, Transport& transport);

}  // namespace reshard
