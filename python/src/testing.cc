// reshard._reshard._testing_*: the synthetic weights of `reshard run`
// (runtime/synthetic.h) written into and checked in the memory a Python
// session has bound, so that Python tests check every element of a refit
// against the same oracle as the C++ end-to-end tests.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "python/src/ext.h"
#include "runtime/error.h"
#include "runtime/synthetic.h"

namespace reshard::py {
namespace {

std::vector<char*> Bound(const PySession& s) {
  const auto& bound = s.session->bound();
  for (size_t i = 0; i < bound.size(); ++i) {
    if (bound[i] == nullptr && BufferElements(*s.session->program().buffers()->Get(i)) != 0) {
      throw Error("buffer '" + s.session->program().buffers()->Get(i)->name()->str() + "' is not bound");
    }
  }
  return bound;
}

}  // namespace

void BindTesting(nb::module_& m) {
  m.def("_testing_fill_sources", [](const PySession& s) {
    Tagged(ErrorKind::kBind, [&] { FillSources(s.plan->plan, s.session->program(), Bound(s)); });
  });
  m.def("_testing_poison_destinations", [](const PySession& s) {
    Tagged(ErrorKind::kBind, [&] { PoisonDestinations(s.session->program(), Bound(s)); });
  });
  m.def(
      "_testing_check_destinations",
      [](const PySession& s, size_t keep) {
        CheckResult r = Tagged(ErrorKind::kBind,
                               [&] { return CheckDestinations(s.plan->plan, s.session->program(), Bound(s), keep); });
        std::vector<std::string> wrong;
        for (const WrongElement& w : r.first) wrong.push_back(FormatWrong(w));
        return nb::make_tuple(r.checked, r.wrong, wrong);
      },
      nb::arg("session"), nb::arg("keep") = 10);
}

}  // namespace reshard::py
