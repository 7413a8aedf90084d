// reshard._reshard: the runtime's plan, transports and session for Python.
// The Python layer (reshard/*.py) adds tensor handling, names and docs; this
// file stays a thin, GIL-aware shell over the C++ classes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "python/src/ext.h"
#include "runtime/error.h"
#include "runtime/gloo_transport.h"

#if RESHARD_HAVE_CUDA
#include "runtime/cuda/nccl_transport.h"
#endif

namespace reshard::py {
namespace {

PyObject* g_classes[static_cast<int>(ErrorKind::kCount)] = {};

PyObject* ClassOf(ErrorKind kind, const char* what) {
  if (kind == ErrorKind::kPeer && std::string(what).find("timed out") != std::string::npos) kind = ErrorKind::kTimeout;
  PyObject* cls = g_classes[static_cast<int>(kind)];
  if (cls == nullptr) cls = g_classes[0];
  return cls != nullptr ? cls : PyExc_RuntimeError;
}

std::chrono::milliseconds Timeout(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>((seconds > 0 ? seconds : 60.0) * 1000));
}

// Role bits of each buffer of a program: 1 = holds source content, 2 = a destination need.
std::vector<int> BufferRoles(const fb::Program& p) {
  std::vector<int> roles(p.buffers() ? p.buffers()->size() : 0, 0);
  if (p.fragments() == nullptr) return roles;
  for (const fb::Fragment* f : *p.fragments()) {
    const int bit = f->role() == 0 ? 1 : 2;
    // Dims set in buffer_dims select the buffer: buffer + sum((c_d - lo_d) * stride_d).
    std::vector<uint64_t> offsets = {f->buffer()};
    for (uint32_t d = 0; d < f->ndim() && d < 6; ++d) {
      if (!(f->buffer_dims() >> d & 1)) continue;
      std::vector<uint64_t> next;
      const uint64_t extent = f->hi()->Get(d) > f->lo()->Get(d) ? f->hi()->Get(d) - f->lo()->Get(d) : 0;
      for (uint64_t o : offsets) {
        for (uint64_t i = 0; i < extent; ++i) next.push_back(o + i * f->stride()->Get(d));
      }
      offsets = std::move(next);
    }
    for (uint64_t b : offsets) {
      if (b < roles.size()) roles[b] |= bit;
    }
  }
  return roles;
}

nb::dict ProgramInfo(const Plan& plan, uint32_t rank) {
  const fb::Program& p = Tagged(ErrorKind::kPlan, [&]() -> const fb::Program& {
    if (rank >= plan.num_ranks()) {
      throw Error(plan.path() + ": rank " + std::to_string(rank) + " out of range: the plan has " +
                  std::to_string(plan.num_ranks()) + " ranks");
    }
    return plan.program(rank);
  });
  nb::dict d;
  d["rank"] = p.rank();
  d["src_rank"] = p.src_rank();
  d["dst_rank"] = p.dst_rank();
  d["staging_bytes"] = p.staging_bytes();
  d["steps"] = p.steps() ? p.steps()->size() : 0;
  d["rounds"] = p.round_begin() && p.round_begin()->size() > 0 ? p.round_begin()->size() - 1 : 0;
  std::vector<int> roles = BufferRoles(p);
  nb::list buffers;
  if (p.buffers() != nullptr) {
    for (uint32_t i = 0; i < p.buffers()->size(); ++i) {
      const fb::Buffer* b = p.buffers()->Get(i);
      nb::list shape;
      for (uint64_t s : *b->shape()) shape.append(s);
      buffers.append(
          nb::make_tuple(b->name()->str(), static_cast<int>(b->dtype()), nb::tuple(shape), roles[i], b->held() == 1));
    }
  }
  d["buffers"] = buffers;
  return d;
}

std::vector<uint32_t> Vec(const flatbuffers::Vector<uint32_t>* v) {
  return v ? std::vector<uint32_t>(v->begin(), v->end()) : std::vector<uint32_t>();
}

std::string Str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

// A run's stats as the runtime returned them, read by reshard/session.py's
// RunStats only when asked: a run returns one small object, whatever the
// number of rounds (building the per-round Python objects on every run cost
// ~0.3 us per round, 0.25% of a 100,000-step run).
struct PyRunStats {
  RunStats s;
};

}  // namespace

void BindErrors(nb::module_& m) {
  m.def("_set_error_classes", [](nb::tuple classes) {
    if (classes.size() != static_cast<size_t>(ErrorKind::kCount)) throw std::invalid_argument("wrong number of classes");
    for (size_t i = 0; i < classes.size(); ++i) {
      PyObject* cls = classes[i].ptr();
      Py_INCREF(cls);  // kept for the life of the process
      g_classes[i] = cls;
    }
  });
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const TaggedError& e) {
      PyErr_SetString(ClassOf(e.kind, e.what()), e.what());
    } catch (const Error& e) {
      PyErr_SetString(ClassOf(ErrorKind::kGeneric, e.what()), e.what());
    }
  });
}

void BindPlan(nb::module_& m) {
  nb::class_<PyPlan>(m, "_Plan")
      .def_static(
          "open",
          [](const std::string& path) {
            nb::gil_scoped_release release;
            return Tagged(ErrorKind::kPlan, [&] { return std::make_unique<PyPlan>(PyPlan{Plan::open(path)}); });
          },
          nb::arg("path"))
      .def_prop_ro("path", [](const PyPlan& p) { return p.plan.path(); })
      .def_prop_ro("size_bytes", [](const PyPlan& p) { return p.plan.size_bytes(); })
      .def_prop_ro("num_ranks", [](const PyPlan& p) { return p.plan.num_ranks(); })
      .def_prop_ro("schema_version", [](const PyPlan& p) { return p.plan.root().schema_version(); })
      .def_prop_ro("compiler_version", [](const PyPlan& p) { return Str(p.plan.root().compiler_version()); })
      .def_prop_ro("digest", [](const PyPlan& p) { return Str(p.plan.root().digest()); })
      .def_prop_ro("content_digest", [](const PyPlan& p) { return p.plan.content_digest().hex(); })
      .def_prop_ro("active_ranks", [](const PyPlan& p) { return p.plan.active_ranks(); })
      .def_prop_ro("strategy",
                   [](const PyPlan& p) { return std::string(fb::EnumNameStrategy(p.plan.root().strategy())); })
      .def_prop_ro("model", [](const PyPlan& p) { return Str(p.plan.root().model()); })
      .def_prop_ro("source_layout", [](const PyPlan& p) { return Str(p.plan.root().source_layout()); })
      .def_prop_ro("dest_layout", [](const PyPlan& p) { return Str(p.plan.root().dest_layout()); })
      .def_prop_ro("cluster", [](const PyPlan& p) { return Str(p.plan.root().cluster()); })
      .def_prop_ro("staging_limit", [](const PyPlan& p) { return p.plan.root().staging_limit(); })
      .def_prop_ro("num_rounds", [](const PyPlan& p) { return p.plan.root().num_rounds(); })
      .def_prop_ro("total_net_bytes", [](const PyPlan& p) { return p.plan.root().total_net_bytes(); })
      .def_prop_ro("total_nvlink_bytes", [](const PyPlan& p) { return p.plan.root().total_nvlink_bytes(); })
      .def_prop_ro("src_global", [](const PyPlan& p) { return Vec(p.plan.root().src_global()); })
      .def_prop_ro("dst_global", [](const PyPlan& p) { return Vec(p.plan.root().dst_global()); })
      .def_prop_ro("domain", [](const PyPlan& p) { return Vec(p.plan.root().domain()); })
      .def("program", [](const PyPlan& p, uint32_t rank) { return ProgramInfo(p.plan, rank); }, nb::arg("rank"));
}

void BindTransports(nb::module_& m) {
  nb::class_<PyTransport>(m, "_Transport")
      .def_prop_ro("rank", [](const PyTransport& t) { return t.transport->rank(); })
      .def_prop_ro("size", [](const PyTransport& t) { return t.transport->size(); })
      .def_prop_ro("kind", [](const PyTransport& t) { return t.kind; })
      .def_prop_ro("timeout_s", [](const PyTransport& t) { return t.transport->timeout().count() / 1000.0; });

  m.def(
      "_gloo_transport",
      [](uint32_t rank, uint32_t size, const std::string& rendezvous, const std::string& prefix,
         const std::string& hostname, const std::string& nvlink_hostname, double timeout_s) {
        // Connecting blocks until every rank has come: without the GIL, Ctrl-C ends it.
        return Interruptible(ErrorKind::kPeer, [&] {
          GlooOptions o;
          o.rendezvous = rendezvous;
          o.prefix = prefix;
          o.hostname = hostname;
          o.nvlink_hostname = nvlink_hostname;
          o.timeout = Timeout(timeout_s);
          return std::make_unique<PyTransport>(PyTransport{std::make_unique<GlooTransport>(rank, size, o), "gloo"});
        });
      },
      nb::arg("rank"), nb::arg("size"), nb::arg("rendezvous"), nb::arg("prefix"), nb::arg("hostname"),
      nb::arg("nvlink_hostname"), nb::arg("timeout_s"));

#if RESHARD_HAVE_CUDA
  m.attr("_have_cuda") = true;
#else
  m.attr("_have_cuda") = false;
#endif
  m.def(
      "_nccl_transport",
      [](uintptr_t net, uintptr_t nvlink, uintptr_t stream, double timeout_s) -> std::unique_ptr<PyTransport> {
        nb::gil_scoped_release release;
        return Tagged(ErrorKind::kNccl, [&]() -> std::unique_ptr<PyTransport> {
          if (net == 0) throw Error("the net communicator is 0 (NULL)");
#if RESHARD_HAVE_CUDA
          NcclOptions o;
          o.net = reinterpret_cast<ncclComm_t>(net);
          o.nvlink = reinterpret_cast<ncclComm_t>(nvlink);
          o.stream = reinterpret_cast<cudaStream_t>(stream);
          o.timeout = Timeout(timeout_s);
          return std::make_unique<PyTransport>(PyTransport{std::make_unique<NcclTransport>(o), "nccl"});
#else
          throw Error("this reshard runtime was built without CUDA (RESHARD_WITH_CUDA=OFF)");
#endif
        });
      },
      nb::arg("net"), nb::arg("nvlink"), nb::arg("stream"), nb::arg("timeout_s"));
  m.def(
      "_nccl_loopback_transport",
      [](int device, uint32_t rank, uint32_t size, double timeout_s) -> std::unique_ptr<PyTransport> {
        nb::gil_scoped_release release;
        return Tagged(ErrorKind::kNccl, [&]() -> std::unique_ptr<PyTransport> {
#if RESHARD_HAVE_CUDA
          return std::make_unique<PyTransport>(
              PyTransport{NcclTransport::Loopback(device, rank, size, Timeout(timeout_s)), "nccl"});
#else
          throw Error("this reshard runtime was built without CUDA (RESHARD_WITH_CUDA=OFF)");
#endif
        });
      },
      nb::arg("device"), nb::arg("rank"), nb::arg("size"), nb::arg("timeout_s"));
  m.def("_transport_device", [](const PyTransport& t) -> int {
#if RESHARD_HAVE_CUDA
    if (auto* n = dynamic_cast<const NcclTransport*>(t.transport.get())) return n->device();
#endif
    return -1;
  });
}

void BindSession(nb::module_& m) {
  nb::class_<PySession>(m, "_Session")
      .def(
          "__init__",
          [](PySession* self, const PyPlan& plan, uint32_t rank, PyTransport& transport) {
            // The hello blocks until every rank has its session: without the GIL, Ctrl-C ends it.
            auto session = Interruptible(ErrorKind::kPlan, [&] {
              if (rank >= plan.plan.num_ranks()) {
                throw Error(plan.plan.path() + ": rank " + std::to_string(rank) + " out of range: the plan has " +
                            std::to_string(plan.plan.num_ranks()) + " ranks");
              }
              return std::make_unique<Session>(plan.plan, rank, *transport.transport);
            });
            new (self) PySession{std::move(session)};
          },
          nb::arg("plan"), nb::arg("rank"), nb::arg("transport"), nb::keep_alive<1, 2>(), nb::keep_alive<1, 4>())
      .def_prop_ro("rank", [](const PySession& s) { return s.session->rank(); })
      .def_prop_ro("staging_bytes", [](const PySession& s) { return s.session->staging_bytes(); })
      .def_prop_ro("running", [](const PySession& s) { return s.session->running(); })
      .def(
          "bind_index",
          [](PySession& s, uint32_t index, uintptr_t ptr, int dtype, const std::vector<uint64_t>& shape) {
            Tagged(ErrorKind::kBind, [&] {
              if (dtype < 0 || dtype > static_cast<int>(fb::Dtype::MAX)) throw Error("unknown dtype " + std::to_string(dtype));
              s.session->bind_index(index, reinterpret_cast<void*>(ptr), static_cast<fb::Dtype>(dtype), shape);
            });
          },
          nb::arg("index"), nb::arg("ptr"), nb::arg("dtype"), nb::arg("shape"))
      .def("unbound",
           [](const PySession& s) {
             std::vector<uint32_t> out;
             const auto& bound = s.session->bound();
             for (uint32_t i = 0; i < bound.size(); ++i) {
               if (bound[i] == nullptr && BufferElements(*s.session->program().buffers()->Get(i)) != 0) out.push_back(i);
             }
             return out;
           })
      .def("bound_ptr", [](const PySession& s, uint32_t i) { return reinterpret_cast<uintptr_t>(s.session->bound().at(i)); })
      .def(
          "abort",
          [](PySession& s, const std::string& why) {
            nb::gil_scoped_release release;
            s.session->abort(why);
          },
          nb::arg("why"))
      .def("run", [](PySession& s) {
        auto out = std::make_unique<PyRunStats>();
        // Unbound buffers fail before any byte moves: a binding error, not a peer's.
        bool complete = true;
        const auto& bound = s.session->bound();
        for (uint32_t i = 0; i < bound.size() && complete; ++i) {
          complete = bound[i] != nullptr || BufferElements(*s.session->program().buffers()->Get(i)) == 0;
        }
        out->s = Interruptible(complete ? ErrorKind::kPeer : ErrorKind::kBind, [&] { return s.session->run(); });
        return out;
      });

  nb::class_<PyRunStats>(m, "_RunStats")
      .def_prop_ro("seconds", [](const PyRunStats& r) { return r.s.seconds; })
      .def_prop_ro("steps", [](const PyRunStats& r) { return r.s.steps; })
      .def_prop_ro("bytes_sent", [](const PyRunStats& r) { return r.s.bytes_sent; })
      .def_prop_ro("bytes_received", [](const PyRunStats& r) { return r.s.bytes_received; })
      .def_prop_ro("num_rounds", [](const PyRunStats& r) { return r.s.rounds.size(); })
      .def(
          "channel",
          [](const PyRunStats& r, int c) {
            if (c < 0 || c > 1) throw std::out_of_range("channel: 0 (net) or 1 (nvlink)");
            const ChannelStats& ch = r.s.channels[c];
            return nb::make_tuple(ch.bytes_sent, ch.bytes_received, ch.seconds);
          },
          nb::arg("channel"))
      .def("rounds", [](const PyRunStats& r) {
        nb::list out;
        for (const RoundStats& x : r.s.rounds) {
          out.append(nb::make_tuple(x.bytes_sent, x.bytes_received, x.bytes_local, x.steps, x.seconds, x.comm_seconds));
        }
        return out;
      });
}

void BindDlpack(nb::module_& m) {
  // What a DLPack producer (CuPy, JAX, ...) exports, for the Python layer's
  // checks: (ptr, (code, bits, lanes), shape, strides in elements, device type, device id).
  m.def("_dlpack_info", [](nb::ndarray<nb::ro> a) {
    nb::list shape, strides;
    for (size_t i = 0; i < a.ndim(); ++i) {
      shape.append(a.shape(i));
      strides.append(a.stride(i));
    }
    nb::dlpack::dtype dt = a.dtype();
    return nb::make_tuple(reinterpret_cast<uintptr_t>(a.data()), nb::make_tuple(dt.code, dt.bits, dt.lanes),
                          nb::tuple(shape), nb::tuple(strides), a.device_type(), a.device_id());
  });
}

}  // namespace reshard::py

NB_MODULE(_reshard, m) {
  m.doc() = "reshard's runtime (C++), wrapped for the reshard package; use `import reshard`.";
  m.attr("__version__") = RESHARD_VERSION;
  reshard::py::BindErrors(m);
  reshard::py::BindPlan(m);
  reshard::py::BindTransports(m);
  reshard::py::BindSession(m);
  reshard::py::BindCompile(m);
  reshard::py::BindInit(m);
  reshard::py::BindNccl(m);
  reshard::py::BindTesting(m);
  reshard::py::BindDlpack(m);
}
