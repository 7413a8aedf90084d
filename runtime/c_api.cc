// The C API (runtime/reshard.h) over Plan, GlooTransport and Session. No
// exception crosses it: each entry point catches and stores the message.
#include "runtime/reshard.h"

#include <memory>
#include <string>

#include "runtime/error.h"
#include "runtime/gloo_transport.h"
#include "runtime/tcp_store.h"
#include "runtime/plan.h"
#include "runtime/session.h"

#if RESHARD_HAVE_CUDA
#include "runtime/cuda/nccl_transport.h"
#endif

struct reshard_plan {
  reshard::Plan plan;
  std::string digest;  // content_digest().hex(), taken at open
};
struct reshard_transport {
  std::unique_ptr<reshard::Transport> transport;
};
struct reshard_session {
  std::unique_ptr<reshard::Session> session;
};

namespace {

thread_local std::string last_error;

template <typename Fn>
auto Guard(Fn&& fn, decltype(fn()) on_error) -> decltype(fn()) {
  try {
    last_error.clear();
    return fn();
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown error";
  }
  return on_error;
}

void Require(const void* p, const char* what) {
  if (p == nullptr) throw reshard::Error(std::string(what) + " is NULL");
}

}  // namespace

extern "C" {

const char* reshard_last_error(void) { return last_error.c_str(); }

reshard_plan* reshard_plan_open(const char* path) {
  return Guard(
      [&]() -> reshard_plan* {
        Require(path, "path");
        reshard::Plan plan = reshard::Plan::open(path);
        std::string digest = plan.content_digest().hex();
        return new reshard_plan{std::move(plan), std::move(digest)};
      },
      nullptr);
}

uint32_t reshard_plan_num_ranks(const reshard_plan* plan) { return plan ? plan->plan.num_ranks() : 0; }
uint32_t reshard_plan_num_active_ranks(const reshard_plan* plan) {
  return plan ? static_cast<uint32_t>(plan->plan.active_ranks().size()) : 0;
}
uint32_t reshard_plan_active_rank(const reshard_plan* plan, uint32_t i) {
  if (plan == nullptr || i >= plan->plan.active_ranks().size()) return UINT32_MAX;
  return plan->plan.active_ranks()[i];
}
const char* reshard_plan_content_digest(const reshard_plan* plan) {
  if (plan == nullptr) return "";
  return plan->digest.c_str();
}

void reshard_plan_close(reshard_plan* plan) { delete plan; }

reshard_transport* reshard_gloo_transport_create(uint32_t rank, uint32_t size, const char* store_dir,
                                                 const char* prefix, const char* hostname, double timeout_s) {
  return Guard(
      [&]() -> reshard_transport* {
        Require(store_dir, "store_dir");
        reshard::GlooOptions options;
        options.store_dir = store_dir;
        if (prefix != nullptr) options.prefix = prefix;
        if (hostname != nullptr) options.hostname = hostname;
        if (timeout_s > 0) options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
        return new reshard_transport{std::make_unique<reshard::GlooTransport>(rank, size, options)};
      },
      nullptr);
}

reshard_transport* reshard_gloo_transport_create_tcp(uint32_t rank, uint32_t size, const char* host_port,
                                                     const char* prefix, const char* hostname, double timeout_s) {
  return Guard(
      [&]() -> reshard_transport* {
        Require(host_port, "host_port");
        if (!reshard::IsHostPort(host_port)) {
          throw reshard::Error(std::string("host_port: '") + host_port + "' is not HOST:PORT");
        }
        reshard::GlooOptions options;
        options.rendezvous = host_port;
        if (prefix != nullptr) options.prefix = prefix;
        if (hostname != nullptr) options.hostname = hostname;
        if (timeout_s > 0) options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
        return new reshard_transport{std::make_unique<reshard::GlooTransport>(rank, size, options)};
      },
      nullptr);
}

reshard_transport* reshard_nccl_transport_create(void* net_comm, void* nvlink_comm, void* stream, double timeout_s) {
  return Guard(
      [&]() -> reshard_transport* {
        Require(net_comm, "net_comm");
#if RESHARD_HAVE_CUDA
        reshard::NcclOptions options;
        options.net = static_cast<ncclComm_t>(net_comm);
        options.nvlink = static_cast<ncclComm_t>(nvlink_comm);
        options.stream = static_cast<cudaStream_t>(stream);
        if (timeout_s > 0) options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
        return new reshard_transport{std::make_unique<reshard::NcclTransport>(options)};
#else
        throw reshard::Error("this reshard runtime was built without CUDA (RESHARD_WITH_CUDA=OFF)");
#endif
      },
      nullptr);
}

int reshard_transport_barrier(reshard_transport* transport) {
  return Guard(
      [&]() -> int {
        Require(transport, "transport");
        auto* gloo = dynamic_cast<reshard::GlooTransport*>(transport->transport.get());
        if (gloo == nullptr) throw reshard::Error("reshard_transport_barrier: not a Gloo transport");
        gloo->barrier();
        return 0;
      },
      -1);
}

void reshard_transport_destroy(reshard_transport* transport) { delete transport; }

reshard_session* reshard_session_create(const reshard_plan* plan, uint32_t global_rank, reshard_transport* transport) {
  return Guard(
      [&]() -> reshard_session* {
        Require(plan, "plan");
        Require(transport, "transport");
        return new reshard_session{std::make_unique<reshard::Session>(plan->plan, global_rank, *transport->transport)};
      },
      nullptr);
}

uint32_t reshard_session_num_buffers(const reshard_session* session) {
  if (session == nullptr || session->session->program().buffers() == nullptr) return 0;
  return session->session->program().buffers()->size();
}

const char* reshard_session_buffer_name(const reshard_session* session, uint32_t i) {
  return Guard(
      [&]() -> const char* {
        Require(session, "session");
        const auto* buffers = session->session->program().buffers();
        if (buffers == nullptr || i >= buffers->size()) throw reshard::Error("buffer index " + std::to_string(i) + " out of range");
        return buffers->Get(i)->name()->c_str();
      },
      nullptr);
}

int reshard_session_bind(reshard_session* session, const char* name, void* ptr, int dtype, const uint64_t* shape,
                         size_t ndim) {
  return Guard(
      [&]() -> int {
        Require(session, "session");
        Require(name, "name");
        if (ndim > 0) Require(shape, "shape");
        if (dtype < 0 || dtype > static_cast<int>(reshard::fb::Dtype::MAX)) {
          throw reshard::Error("unknown dtype " + std::to_string(dtype));
        }
        session->session->bind(name, ptr, static_cast<reshard::fb::Dtype>(dtype),
                               std::vector<uint64_t>(shape, shape + ndim));
        return 0;
      },
      -1);
}

int reshard_session_run(reshard_session* session, reshard_stats* stats) {
  return Guard(
      [&]() -> int {
        Require(session, "session");
        reshard::RunStats s = session->session->run();
        if (stats != nullptr) {
          stats->net_bytes_sent = s.channels[0].bytes_sent;
          stats->net_bytes_received = s.channels[0].bytes_received;
          stats->nvlink_bytes_sent = s.channels[1].bytes_sent;
          stats->nvlink_bytes_received = s.channels[1].bytes_received;
          stats->net_seconds = s.channels[0].seconds;
          stats->nvlink_seconds = s.channels[1].seconds;
          stats->steps = s.steps;
          stats->rounds = static_cast<uint32_t>(s.rounds.size());
          stats->seconds = s.seconds;
        }
        return 0;
      },
      -1);
}

void reshard_session_destroy(reshard_session* session) { delete session; }

}  // extern "C"
