// The Python binding's parts every C++ tier shares (module.cpp and the binding of each tier):
// fetch and insert over NumPy arrays with the GIL released for the whole C++ call, the SharedTier
// methods, and the tier errors as the Python tiers raise them. Arrays in, arrays out: keys int64 [n]
// and rows float32 [n, dim], C order (an array of another layout or of a dtype that casts safely is
// converted once, here); the checks and messages of base.py's check_keys / check_rows are the Python
// wrappers'.
#ifndef SOK_HPS_TIERS_PY_TIER_HPP_
#define SOK_HPS_TIERS_PY_TIER_HPP_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "tier.hpp"

namespace sok {
namespace hps {
namespace py_tier {

namespace py = pybind11;

using Keys = py::array_t<int64_t, py::array::c_style>;
using Rows = py::array_t<float, py::array::c_style>;

// "(3, 4)": the shape of a, for messages.
inline std::string shape_of(const py::array& a) {
  std::string out = "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) out += (d ? ", " : "") + std::to_string(a.shape(d));
  return out + (a.ndim() == 1 ? ",)" : ")");
}

inline void check_1d(const std::string& tag, const Keys& keys) {
  if (keys.ndim() != 1) throw py::value_error(tag + ": keys must be 1-D, got keys of shape " + shape_of(keys));
}

inline std::tuple<py::array_t<float>, py::array_t<bool>> fetch(Tier& tier, const std::string& tag, const Keys& keys,
                                                               int64_t dim) {
  check_1d(tag, keys);
  const int64_t n = keys.shape(0);
  check_dim(tag, dim);  // before the rows are made
  py::array_t<float> rows({n, dim});
  py::array_t<bool> found(n);
  const int64_t* k = keys.data();
  float* r = rows.mutable_data();
  bool* f = found.mutable_data();
  {
    py::gil_scoped_release released;
    tier.fetch(tag, k, n, dim, r, f);
  }
  return {rows, found};
}

inline void insert(Tier& tier, const std::string& tag, const Keys& keys, const Rows& rows) {
  if (keys.ndim() != 1 || rows.ndim() != 2 || rows.shape(0) != keys.shape(0) || rows.shape(1) < 1) {
    throw py::value_error(tag + ": keys must be [n] and rows [n, dim >= 1], got keys of shape " + shape_of(keys) +
                          " and rows of shape " + shape_of(rows));
  }
  const int64_t* k = keys.data();
  const float* r = rows.data();
  const int64_t n = keys.shape(0), dim = rows.shape(1);
  py::gil_scoped_release released;
  tier.insert(tag, k, n, r, dim);
}

// name, fetch, insert, size and close of a bound tier class T (a Tier).
template <class T, class... Extra>
void def_tier(py::class_<T, Extra...>& cls) {
  cls.def_property_readonly("name", [](T& t) { return t.name(); })
      .def(
          "fetch", [](T& t, const std::string& tag, const Keys& keys, int64_t dim) { return fetch(t, tag, keys, dim); },
          py::arg("tag"), py::arg("keys"), py::arg("dim"))
      .def(
          "insert",
          [](T& t, const std::string& tag, const Keys& keys, const Rows& rows) { insert(t, tag, keys, rows); },
          py::arg("tag"), py::arg("keys"), py::arg("rows"))
      .def(
          "size",
          [](T& t, const std::string& tag) {
            py::gil_scoped_release released;
            return t.size(tag);
          },
          py::arg("tag"))
      .def("close", [](T& t) {
        py::gil_scoped_release released;
        t.close();
      });
}

// def_tier's methods, and location, stored_dim (None where the tier has no width of the tag),
// set_stored_dim and retain_only of a bound SharedTier class T.
template <class T, class... Extra>
void def_shared_tier(py::class_<T, Extra...>& cls) {
  def_tier(cls);
  cls.def_property_readonly("location", [](T& t) { return t.location(); })
      .def(
          "stored_dim",
          [](T& t, const std::string& tag) -> py::object {
            int64_t dim;
            {
              py::gil_scoped_release released;
              dim = t.stored_dim(tag);
            }
            return dim < 0 ? py::object(py::none()) : py::object(py::int_(dim));
          },
          py::arg("tag"))
      .def(
          "set_stored_dim",
          [](T& t, const std::string& tag, int64_t dim) {
            check_dim(tag, dim);
            py::gil_scoped_release released;
            t.set_stored_dim(tag, dim);
          },
          py::arg("tag"), py::arg("dim"))
      .def(
          "retain_only",
          [](T& t, const std::string& tag, const Keys& keys) {
            check_1d(tag, keys);
            const int64_t* k = keys.data();
            const int64_t n = keys.shape(0);
            py::gil_scoped_release released;
            return t.retain_only(tag, k, n);
          },
          py::arg("tag"), py::arg("keys"));
}

// The tier errors as Python's: TierClosed a RuntimeError (module.TierClosed), TierUnavailable
// hierarchical_parameter_server.tiers.base.TierUnavailable (the Python tiers' class, imported when one
// is raised), TierReadOnly PermissionError.
inline void register_errors(py::module_& m) {
  py::register_exception<TierClosed>(m, "TierClosed", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const TierUnavailable& e) {
      py::object cls = py::module_::import("hierarchical_parameter_server.tiers.base").attr("TierUnavailable");
      PyErr_SetString(cls.ptr(), e.what());
    } catch (const TierReadOnly& e) {
      PyErr_SetString(PyExc_PermissionError, e.what());
    }
  });
}

}  // namespace py_tier
}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_TIERS_PY_TIER_HPP_
