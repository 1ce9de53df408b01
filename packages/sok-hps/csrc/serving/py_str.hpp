// The Python str of UTF-8 text in which a lone surrogate is its 3-byte code (json.hpp), for the
// _serving binding.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace sok::hps {

inline pybind11::object py_str(const std::string& s) {
  PyObject* out = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogatepass");
  if (out == nullptr) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::object>(out);
}

}  // namespace sok::hps
