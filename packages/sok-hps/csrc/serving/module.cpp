// hierarchical_parameter_server._serving: the Python binding of the C++ server's readers
// (csrc/serving): config.py's ps_config reader, updates.py's update files and source, and the
// readers the tests hold against the Python readers they mirror.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "json.hpp"
#include "py_str.hpp"
#include "storage_options.hpp"

namespace py = pybind11;
namespace json = sok::hps::json;

void bind_model_files(py::module_& m);  // py_model_files.cpp

namespace {

// The Python value json.loads makes of the same text.
py::object to_python(const json::Value& v) {
  switch (v.type()) {
    case json::Type::kNull:
      return py::none();
    case json::Type::kBool:
      return py::bool_(v.as_bool());
    case json::Type::kInt:
      return v.above_int64() ? py::int_(v.as_uint64()) : py::int_(v.as_int());
    case json::Type::kFloat:
      return py::float_(v.as_number());
    case json::Type::kString:
      return sok::hps::py_str(v.as_string());
    case json::Type::kArray: {
      py::list out;
      for (const auto& item : v.as_array()) out.append(to_python(item));
      return std::move(out);
    }
    case json::Type::kObject: {
      py::dict out;
      for (const auto& [key, value] : v.as_object()) out[sok::hps::py_str(key)] = to_python(value);
      return std::move(out);
    }
  }
  return py::none();
}

}  // namespace

// py_ps_config.cpp
void bind_ps_config(py::module_& m);
// py_update_source.cpp
void bind_update_source(py::module_& m);

PYBIND11_MODULE(_serving, m) {
  m.doc() =
      "The C++ server's readers (csrc/serving): the ps_config reader that config.py calls, the online updates' "
      "files and directory source that updates.py calls, and the JSON and model-file readers, for the tests "
      "against Python's.";
  py::register_exception<json::ParseError>(m, "JsonParseError", PyExc_ValueError);
  m.def(
      "parse_json", [](const std::string& text) { return to_python(json::parse(text)); }, py::arg("text"),
      "The value of the JSON text, as json.loads makes it; JsonParseError (a ValueError) with "
      "json.JSONDecodeError's message where it is not JSON.");
  m.def("capacity_of", &sok::hps::capacity_of, py::arg("rows"), py::arg("fraction"),
        "The C++ server's evicting cache capacity (storage_options.hpp), cache.capacity_of's.");
  m.def("hkv_cache_options", &sok::hps::hkv_cache_options, py::arg("capacity"),
        "The (name, value) options the C++ server creates an evicting cache of `capacity` rows with, "
        "cache.hkv_options's.");
  bind_ps_config(m);
  bind_model_files(m);
  bind_update_source(m);
}
