/* reshard C API: open a plan, bind a rank's buffers, replay its program.
 * Callable from C and from Python ctypes. Functions returning int return 0 on
 * success and -1 on failure; pointer-returning ones return NULL on failure.
 * After a failure reshard_last_error() describes it (thread-local; valid until
 * the next call on this thread). */
#ifndef RESHARD_H_
#define RESHARD_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct reshard_plan reshard_plan;
typedef struct reshard_transport reshard_transport;
typedef struct reshard_session reshard_session;

/* Values of fb::Dtype in schema/plan.fbs. */
enum { RESHARD_BF16 = 0, RESHARD_FP16 = 1, RESHARD_FP32 = 2, RESHARD_FP8_E4M3 = 3, RESHARD_E8M0 = 4 };

typedef struct reshard_stats {
  uint64_t net_bytes_sent, net_bytes_received;
  uint64_t nvlink_bytes_sent, nvlink_bytes_received;
  double net_seconds, nvlink_seconds;
  uint64_t steps;
  uint32_t rounds;
  double seconds;
} reshard_stats;

/* The message of the last failure on this thread ("" if none). */
const char* reshard_last_error(void);

reshard_plan* reshard_plan_open(const char* path);
uint32_t reshard_plan_num_ranks(const reshard_plan* plan);
/* The plan ranks that need a process (the training or inference side uses
 * them, or they hold buffers or steps), ascending: active rank i is process i
 * of a job that launches only those, on transports of
 * reshard_plan_num_active_ranks ranks. The others are idle. */
uint32_t reshard_plan_num_active_ranks(const reshard_plan* plan);
uint32_t reshard_plan_active_rank(const reshard_plan* plan, uint32_t i);
/* The plan's content digest: 32 hex digits (valid as long as the plan). */
const char* reshard_plan_content_digest(const reshard_plan* plan);
void reshard_plan_close(reshard_plan* plan);

/* Transports connect every plan rank (transport rank = plan rank) or only
 * the active ones (transport rank i = reshard_plan_active_rank(plan, i)).
 * A Gloo TCP transport: `store_dir` is a fresh directory every rank shares
 * for the rendezvous (a directory an earlier run used is refused, naming it;
 * so is a second process claiming a rank), `prefix` separates meshes sharing it (NULL: "reshard"),
 * `hostname` the address to listen on (NULL: 127.0.0.1), `timeout_s` the limit
 * for connecting and for each round's messages (<= 0: 60 s). Blocks until all
 * `size` ranks have connected. */
reshard_transport* reshard_gloo_transport_create(uint32_t rank, uint32_t size, const char* store_dir,
                                                 const char* prefix, const char* hostname, double timeout_s);
/* The same over TCP, for ranks that share no directory: rank 0 serves the
 * rendezvous on `host_port` ("HOST:PORT" or "[IPv6]:PORT"), the others
 * connect to it (retrying until `timeout_s`). Other arguments as above. */
reshard_transport* reshard_gloo_transport_create_tcp(uint32_t rank, uint32_t size, const char* host_port,
                                                     const char* prefix, const char* hostname, double timeout_s);
/* Waits until every rank of a Gloo transport has called it (within the
 * transport's timeout). Call it after the last run, before
 * reshard_transport_destroy: a rank that closes its connections while a peer
 * is still receiving what it sent can lose that data. Fails on other
 * transports. */
int reshard_transport_barrier(reshard_transport* transport);
/* An NCCL transport over the caller's communicators, for device memory: every
 * buffer bound to a session over it is memory of the communicators' CUDA
 * device, and the session's staging (exactly the plan's staging size) is
 * allocated there. `net_comm` is an ncclComm_t over all plan ranks (rank =
 * plan rank) or over the active ones (rank i = active rank i), `nvlink_comm` one for the nvlink channel (NULL: nvlink messages
 * share net_comm), `stream` the cudaStream_t kernels run on (NULL: one of the
 * transport's own), `timeout_s` the limit for each round's messages (<= 0:
 * 60 s). The communicators stay the caller's; after a failed run they are
 * aborted (ncclCommAbort) and must not be destroyed. Fails with a message in
 * builds without CUDA. */
reshard_transport* reshard_nccl_transport_create(void* net_comm, void* nvlink_comm, void* stream, double timeout_s);
void reshard_transport_destroy(reshard_transport* transport);

/* The plan and transport must outlive the session. Blocks until every rank
 * has created its session: the ranks exchange the plan's content digest and
 * their plan ranks, and every rank fails alike (naming the ranks and both
 * digests, or the duplicate) when they do not run one plan as distinct ranks.
 * Bound memory is the caller's promise: it must stay allocated and in place
 * until re-bound or the session is destroyed (the C API cannot check it). */
reshard_session* reshard_session_create(const reshard_plan* plan, uint32_t global_rank, reshard_transport* transport);
/* Number of buffers the rank binds, and the name/dtype/shape of buffer i
 * (the name pointer lives as long as the plan). */
uint32_t reshard_session_num_buffers(const reshard_session* session);
const char* reshard_session_buffer_name(const reshard_session* session, uint32_t i);
/* `ptr` is host memory for a Gloo transport, device memory for NCCL. */
int reshard_session_bind(reshard_session* session, const char* name, void* ptr, int dtype, const uint64_t* shape,
                         size_t ndim);
/* `stats` may be NULL. */
int reshard_session_run(reshard_session* session, reshard_stats* stats);
void reshard_session_destroy(reshard_session* session);

#ifdef __cplusplus
}
#endif

#endif /* RESHARD_H_ */
