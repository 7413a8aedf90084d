// reshard.nccl: NCCL communicators made by reshard itself, through the NCCL
// library loaded at run time (dlopen), never linked: a communicator works
// only inside the library that made it, so reshard must use the libnccl the
// process (PyTorch, vLLM) already has. dlopen("libnccl.so.2") returns the copy
// already loaded under that name; RESHARD_NCCL_LIBRARY or an explicit path
// names another. The declarations below are NCCL's stable C ABI (nccl.h),
// written out so that this file builds without CUDA.
#include <dlfcn.h>
#include <link.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "python/src/ext.h"
#include "runtime/error.h"

namespace reshard::py {
namespace {

using Comm = void*;  // ncclComm_t
struct UniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
};

struct NcclLib {
  void* handle = nullptr;
  std::string path;
  int (*GetVersion)(int*) = nullptr;
  int (*GetUniqueId)(UniqueId*) = nullptr;
  int (*CommInitRank)(Comm*, int, UniqueId, int) = nullptr;
  int (*CommSplit)(Comm, int, int, Comm*, void*) = nullptr;
  int (*CommDestroy)(Comm) = nullptr;
  int (*CommAbort)(Comm) = nullptr;
  int (*CommCount)(Comm, int*) = nullptr;
  int (*CommUserRank)(Comm, int*) = nullptr;
  int (*CommCuDevice)(Comm, int*) = nullptr;
  const char* (*GetErrorString)(int) = nullptr;
  const char* (*GetLastError)(Comm) = nullptr;  // NCCL >= 2.13; may be missing
  int (*cudaGetDevice)(int*) = nullptr;
  int (*cudaSetDevice)(int) = nullptr;
};

std::mutex g_mu;
NcclLib g_lib;

std::string LoadedPath(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && *map->l_name) {
    return map->l_name;
  }
  return fallback;
}

template <typename T>
void Sym(void* handle, const char* name, T& fn, const std::string& lib, bool required = true) {
  fn = reinterpret_cast<T>(dlsym(handle, name));
  if (fn == nullptr && required) throw Error(lib + " has no symbol " + name + " (is it NCCL?)");
}

// Loads NCCL (and the CUDA runtime it was built against) once; a second call
// with another path is an error, since two NCCLs in one process cannot share
// communicators.
const NcclLib& Load(const std::string& requested) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::string want = requested;
  if (want.empty()) {
    const char* env = std::getenv("RESHARD_NCCL_LIBRARY");
    want = env && *env ? env : "libnccl.so.2";
  }
  if (g_lib.handle != nullptr) {
    void* same = requested.empty() ? g_lib.handle : dlopen(requested.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (same != nullptr && same != g_lib.handle) dlclose(same);
    if (same != g_lib.handle) {
      throw Error("NCCL is already loaded from " + g_lib.path + "; cannot switch to " + requested +
                  " (a communicator works only inside the library that made it)");
    }
    return g_lib;
  }
  void* h = dlopen(want.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    const char* why = dlerror();
    throw Error("cannot load NCCL from '" + want + "': " + (why ? why : "unknown error") +
                " (set RESHARD_NCCL_LIBRARY, or pass library=, to the libnccl.so.2 your framework uses, e.g. "
                "site-packages/nvidia/nccl/lib/libnccl.so.2)");
  }
  NcclLib lib;
  lib.handle = h;
  lib.path = LoadedPath(h, want);
  Sym(h, "ncclGetVersion", lib.GetVersion, lib.path);
  Sym(h, "ncclGetUniqueId", lib.GetUniqueId, lib.path);
  Sym(h, "ncclCommInitRank", lib.CommInitRank, lib.path);
  Sym(h, "ncclCommSplit", lib.CommSplit, lib.path);
  Sym(h, "ncclCommDestroy", lib.CommDestroy, lib.path);
  Sym(h, "ncclCommAbort", lib.CommAbort, lib.path);
  Sym(h, "ncclCommCount", lib.CommCount, lib.path);
  Sym(h, "ncclCommUserRank", lib.CommUserRank, lib.path);
  Sym(h, "ncclCommCuDevice", lib.CommCuDevice, lib.path);
  Sym(h, "ncclGetErrorString", lib.GetErrorString, lib.path);
  Sym(h, "ncclGetLastError", lib.GetLastError, lib.path, false);
  // The CUDA runtime NCCL links (already loaded with it); else one by name.
  void* cudart = RTLD_DEFAULT;
  lib.cudaSetDevice = reinterpret_cast<int (*)(int)>(dlsym(cudart, "cudaSetDevice"));
  if (lib.cudaSetDevice == nullptr) {
    const char* env = std::getenv("RESHARD_CUDART_LIBRARY");
    for (const char* name : {env, "libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
      if (name == nullptr || !*name) continue;
      if ((cudart = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) != nullptr) break;
    }
    if (cudart == nullptr) {
      throw Error("cannot load the CUDA runtime (libcudart.so) next to " + lib.path + "; set RESHARD_CUDART_LIBRARY");
    }
    lib.cudaSetDevice = reinterpret_cast<int (*)(int)>(dlsym(cudart, "cudaSetDevice"));
  }
  lib.cudaGetDevice = reinterpret_cast<int (*)(int*)>(dlsym(cudart, "cudaGetDevice"));
  if (lib.cudaSetDevice == nullptr || lib.cudaGetDevice == nullptr) throw Error("the CUDA runtime has no cudaSetDevice");
  g_lib = lib;
  return g_lib;
}

void Check(const NcclLib& lib, int result, const char* call, Comm comm = nullptr) {
  if (result == 0) return;
  std::string msg = std::string(call) + " failed: " + lib.GetErrorString(result);
  if (comm != nullptr && lib.GetLastError != nullptr) {
    const char* last = lib.GetLastError(comm);
    if (last && *last) msg += std::string(" (") + last + ")";
  }
  throw Error(msg);
}

// Runs `fn` with `device` as the current CUDA device, restoring the previous one.
template <typename Fn>
void OnDevice(const NcclLib& lib, int device, Fn&& fn) {
  int old = -1;
  if (lib.cudaGetDevice(&old) != 0) old = -1;
  if (lib.cudaSetDevice(device) != 0) throw Error("cudaSetDevice(" + std::to_string(device) + ") failed");
  try {
    fn();
  } catch (...) {
    if (old >= 0) lib.cudaSetDevice(old);
    throw;
  }
  if (old >= 0) lib.cudaSetDevice(old);
}

}  // namespace

void BindNccl(nb::module_& m) {
  m.def(
      "_nccl_load",
      [](const std::string& path) {
        return Tagged(ErrorKind::kNccl, [&] {
          const NcclLib& lib = Load(path);
          int version = 0;
          Check(lib, lib.GetVersion(&version), "ncclGetVersion");
          return nb::make_tuple(lib.path, version);
        });
      },
      nb::arg("path") = "");
  m.def("_nccl_unique_id", [](const std::string& path) {
    UniqueId id{};
    Tagged(ErrorKind::kNccl, [&] {
      const NcclLib& lib = Load(path);
      Check(lib, lib.GetUniqueId(&id), "ncclGetUniqueId");
    });
    return nb::bytes(id.internal, sizeof id.internal);
  });
  m.def(
      "_nccl_comm_init",
      [](int world, int rank, nb::bytes uid, int device, const std::string& path) {
        if (uid.size() != sizeof(UniqueId)) {
          throw TaggedError(ErrorKind::kNccl, "the unique id has " + std::to_string(uid.size()) + " bytes, NCCL's have " +
                                                  std::to_string(sizeof(UniqueId)) + " (pass what unique_id() returned)");
        }
        UniqueId id;
        std::memcpy(id.internal, uid.c_str(), sizeof id.internal);
        Comm comm = nullptr;
        nb::gil_scoped_release release;  // blocks until all `world` ranks have joined
        Tagged(ErrorKind::kNccl, [&] {
          const NcclLib& lib = Load(path);
          OnDevice(lib, device, [&] { Check(lib, lib.CommInitRank(&comm, world, id, rank), "ncclCommInitRank"); });
        });
        return reinterpret_cast<uintptr_t>(comm);
      },
      nb::arg("world"), nb::arg("rank"), nb::arg("uid"), nb::arg("device"), nb::arg("path"));
  m.def("_nccl_comm_split", [](uintptr_t comm, int color, int key) {
    Comm out = nullptr;
    nb::gil_scoped_release release;  // collective over the parent's ranks
    Tagged(ErrorKind::kNccl, [&] {
      const NcclLib& lib = Load("");
      Check(lib, lib.CommSplit(reinterpret_cast<Comm>(comm), color, key, &out, nullptr), "ncclCommSplit",
            reinterpret_cast<Comm>(comm));
    });
    return reinterpret_cast<uintptr_t>(out);  // 0 for color NCCL_SPLIT_NOCOLOR (-1)
  });
  m.def("_nccl_comm_info", [](uintptr_t comm) {
    int count = 0, rank = 0, device = 0;
    Tagged(ErrorKind::kNccl, [&] {
      const NcclLib& lib = Load("");
      Comm c = reinterpret_cast<Comm>(comm);
      Check(lib, lib.CommCount(c, &count), "ncclCommCount", c);
      Check(lib, lib.CommUserRank(c, &rank), "ncclCommUserRank", c);
      Check(lib, lib.CommCuDevice(c, &device), "ncclCommCuDevice", c);
    });
    return nb::make_tuple(count, rank, device);
  });
  m.def("_nccl_comm_destroy", [](uintptr_t comm, bool abort) {
    nb::gil_scoped_release release;
    Tagged(ErrorKind::kNccl, [&] {
      const NcclLib& lib = Load("");
      Comm c = reinterpret_cast<Comm>(comm);
      Check(lib, abort ? lib.CommAbort(c) : lib.CommDestroy(c), abort ? "ncclCommAbort" : "ncclCommDestroy");
    });
  });
}

}  // namespace reshard::py
