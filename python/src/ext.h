// Shared pieces of the extension module reshard._reshard: the objects Python
// holds (plan, transport, session) and how a reshard::Error becomes the right
// Python exception (reshard.PlanError, BindError, PeerError, ...).
#pragma once

#include <nanobind/nanobind.h>

#include <csignal>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/hello.h"
#include "runtime/interrupt.h"
#include "runtime/plan.h"
#include "runtime/session.h"
#include "runtime/transport.h"

namespace reshard::py {

namespace nb = nanobind;

/// Which Python exception class an error becomes (classes set by
/// reshard/errors.py through _set_error_classes at import).
enum class ErrorKind { kGeneric = 0, kPlan, kBind, kPeer, kTimeout, kCompile, kNccl, kCount };

/// A runtime error on its way to Python, tagged with its class.
struct TaggedError : std::runtime_error {
  TaggedError(ErrorKind k, const std::string& what) : std::runtime_error(what), kind(k) {}
  ErrorKind kind;
};

/// Runs `fn`, turning any std::exception it throws (reshard::Error above all)
/// into a TaggedError of kind `kind`, message unchanged.
template <typename Fn>
auto Tagged(ErrorKind kind, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const TaggedError&) {
    throw;
  } catch (const std::exception& e) {
    throw TaggedError(kind, e.what());
  }
}

/// Runs `fn` with the GIL released inside an InterruptScope (runtime/
/// interrupt.h), errors tagged as Tagged does; a failed hello (a peer's) is a
/// PeerError whatever `kind`. When SIGINT/SIGTERM/SIGHUP ends the call, the
/// signal is raised again once Python's handlers are back, and Python's own
/// handler runs: KeyboardInterrupt for SIGINT, what the program installed for
/// the others (by default SIGTERM ends the process, as it would have). Where
/// that handler raises nothing (another thread than the main one, a handler
/// that returns) the call raises reshard.PeerError with the runtime's message.
template <typename Fn>
auto Interruptible(ErrorKind kind, Fn&& fn) -> decltype(fn()) {
  int sig = 0;
  std::string what;
  {
    nb::gil_scoped_release release;
    InterruptScope scope;
    try {
      return fn();
    } catch (const Interrupted& e) {
      sig = e.signal();
      what = e.what();
    } catch (const TaggedError&) {
      throw;
    } catch (const HelloFailed& e) {
      throw TaggedError(ErrorKind::kPeer, e.what());
    } catch (const std::exception& e) {
      throw TaggedError(kind, e.what());
    }
  }
  std::raise(sig);
  if (PyErr_CheckSignals() != 0) throw nb::python_error();
  throw TaggedError(ErrorKind::kPeer, what);
}

struct PyPlan {
  Plan plan;
};

struct PyTransport {
  std::unique_ptr<Transport> transport;
  std::string kind;  // "gloo" or "nccl"
};

struct PySession {
  std::unique_ptr<Session> session;
};

void BindErrors(nb::module_& m);
void BindPlan(nb::module_& m);
void BindTransports(nb::module_& m);
void BindSession(nb::module_& m);
void BindCompile(nb::module_& m);
void BindInit(nb::module_& m);
void BindNccl(nb::module_& m);
void BindTesting(nb::module_& m);
void BindDlpack(nb::module_& m);

}  // namespace reshard::py
