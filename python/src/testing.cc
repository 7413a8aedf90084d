// reshard._reshard._testing_*: the synthetic weights of `reshard run`
// (runtime/synthetic.h) written into and checked in host memory given by
// address (the tensors a Python session bound, or host twins of device
// tensors), so that Python tests check every element of a refit against the
// same oracle as the C++ end-to-end tests; and the loopback plan of the GPU
// tests (runtime/cuda/loopback_plan.h), for the NCCL transport's Python check.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "python/src/ext.h"
#include "runtime/cuda/loopback_plan.h"
#include "runtime/error.h"
#include "runtime/synthetic.h"

namespace reshard::py {
namespace {

// The program of `rank` and one address per buffer (0 only for empty buffers).
const fb::Program& Checked(const PyPlan& p, uint32_t rank, const std::vector<uintptr_t>& ptrs,
                           std::vector<char*>& out) {
  const fb::Program& prog = p.plan.program(rank);
  const uint32_t n = prog.buffers() ? prog.buffers()->size() : 0;
  if (ptrs.size() != n) {
    throw Error("rank " + std::to_string(rank) + " has " + std::to_string(n) + " buffers, " +
                std::to_string(ptrs.size()) + " addresses given");
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (ptrs[i] == 0 && BufferElements(*prog.buffers()->Get(i)) != 0) {
      throw Error("buffer '" + prog.buffers()->Get(i)->name()->str() + "' is not bound");
    }
    out.push_back(reinterpret_cast<char*>(ptrs[i]));
  }
  return prog;
}

}  // namespace

void BindTesting(nb::module_& m) {
  m.def("_testing_fill_sources", [](const PyPlan& p, uint32_t rank, const std::vector<uintptr_t>& ptrs) {
    Tagged(ErrorKind::kBind, [&] {
      std::vector<char*> b;
      const fb::Program& prog = Checked(p, rank, ptrs, b);
      FillSources(p.plan, prog, b);
    });
  });
  m.def("_testing_poison_destinations", [](const PyPlan& p, uint32_t rank, const std::vector<uintptr_t>& ptrs) {
    Tagged(ErrorKind::kBind, [&] {
      std::vector<char*> b;
      PoisonDestinations(Checked(p, rank, ptrs, b), b);
    });
  });
  m.def(
      "_testing_check_destinations",
      [](const PyPlan& p, uint32_t rank, const std::vector<uintptr_t>& ptrs, size_t keep) {
        CheckResult r = Tagged(ErrorKind::kBind, [&] {
          std::vector<char*> b;
          const fb::Program& prog = Checked(p, rank, ptrs, b);
          return CheckDestinations(p.plan, prog, b, keep);
        });
        std::vector<std::string> wrong;
        for (const WrongElement& w : r.first) wrong.push_back(FormatWrong(w));
        return nb::make_tuple(r.checked, r.wrong, wrong);
      },
      nb::arg("plan"), nb::arg("rank"), nb::arg("ptrs"), nb::arg("keep") = 10);
  m.def("_testing_write_loopback_plan", [](const std::string& path) {
    Tagged(ErrorKind::kPlan, [&] { testing::WriteFile(path, testing::BuildPlan(testing::LoopbackPlan())); });
  });
}

}  // namespace reshard::py
