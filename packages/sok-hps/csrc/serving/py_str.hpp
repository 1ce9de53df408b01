// The Python str of C++ text, for the _serving binding. py_str: UTF-8 in which a lone surrogate is
// its 3-byte code (json.hpp). py_fs_str: text held as utf8.hpp says, where a byte that is not UTF-8
// also stands for U+DC00 + the byte (a file name as os.fsdecode reads it, in the update source's
// messages and paths).
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "utf8.hpp"

namespace sok::hps {

inline pybind11::object py_str(const std::string& s) {
  PyObject* out = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogatepass");
  if (out == nullptr) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::object>(out);
}

inline pybind11::str py_fs_str(const std::string& s) {
  const std::vector<uint32_t> cps = code_points(s);
  PyObject* out = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, cps.data(), static_cast<Py_ssize_t>(cps.size()));
  if (out == nullptr) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::str>(out);
}

}  // namespace sok::hps
