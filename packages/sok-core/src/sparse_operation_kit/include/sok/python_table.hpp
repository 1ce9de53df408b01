// pybind11 binding of a storage C ABI table as a Python class, shared by every native backend.
//
// The class drives the storage only through its sok_storage_api function table, the same path the
// TensorFlow ops take, so the Python tests exercise exactly the ABI. Include it in a backend's
// module and call sok::bind_table(m, api). Arrays are checked here (dtype, C order, shape), so a
// wrong argument raises a Python exception instead of reaching the C ABI.
#ifndef SOK_PYTHON_TABLE_HPP_
#define SOK_PYTHON_TABLE_HPP_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "sok/storage_api.h"

namespace sok {
namespace py = pybind11;

// (kind, col_begin, col_end, a, b, seed), as sparse_operation_kit.initializers produces them.
using InitTuple = std::tuple<int, int, int, double, double, uint64_t>;

class PyTable {
 public:
  PyTable(const sok_storage_api* api, const std::string& key_dtype, int row_width,
          const std::map<std::string, std::string>& options)
      : api_(api), row_width_(row_width) {
    key_type_ = parse_key_dtype(key_dtype);
    std::vector<const char*> names, values;
    for (const auto& kv : options) {
      names.push_back(kv.first.c_str());
      values.push_back(kv.second.c_str());
    }
    sok_storage_config config{};
    config.struct_size = sizeof(config);
    config.key_type = key_type_;
    config.row_width = row_width;
    config.device_type = SOK_DEVICE_CPU;
    config.device_id = 0;
    config.num_options = static_cast<int32_t>(names.size());
    config.option_names = names.data();
    config.option_values = values.data();
    sok_storage* handle = nullptr;
    sok_status st = api_->create(&config, &handle);
    if (st != SOK_OK) raise(st, api_->last_error(nullptr));
    handle_ = handle;
  }
  ~PyTable() {
    if (handle_ != nullptr) api_->destroy(handle_);
  }
  PyTable(const PyTable&) = delete;
  PyTable& operator=(const PyTable&) = delete;

  int row_width() const { return row_width_; }
  std::string key_dtype() const { return key_dtype_name(key_type_); }

  int64_t size() {
    int64_t out = 0;
    call([&] { return api_->size(handle_, &cpu_, &out); });
    return out;
  }
  int64_t capacity() {
    int64_t out = 0;
    call([&] { return api_->capacity(handle_, &out); });
    return out;
  }

  void find(py::array keys, int cb, int ce, py::array values, std::optional<py::array> default_row,
            py::array found) {
    int64_t n = check_keys(keys);
    check_floats(values, n, ce - cb, "values");
    check_bytes(found, n, "found");
    const float* def = nullptr;
    if (default_row) {
      check_floats(*default_row, -1, ce - cb, "default_row");
      def = static_cast<const float*>(default_row->data());
    }
    call([&] {
      return api_->find(handle_, &cpu_, n, keys.data(), cb, ce, static_cast<float*>(values.mutable_data()),
                        def, static_cast<uint8_t*>(found.mutable_data()));
    });
  }

  void find_or_insert(py::array keys, int cb, int ce, py::array values, py::array found,
                      std::optional<py::array> scores, const std::vector<InitTuple>& inits) {
    int64_t n = check_keys(keys);
    check_floats(values, n, ce - cb, "values");
    check_bytes(found, n, "found");
    const uint64_t* sc = check_scores(scores, n);
    auto in = to_inits(inits);
    call([&] {
      return api_->find_or_insert(handle_, &cpu_, n, keys.data(), cb, ce,
                                  static_cast<float*>(values.mutable_data()),
                                  static_cast<uint8_t*>(found.mutable_data()), sc, in.data(),
                                  static_cast<int32_t>(in.size()));
    });
  }

  void insert_or_assign(py::array keys, int cb, int ce, py::array values,
                        std::optional<py::array> scores, const std::vector<InitTuple>& inits) {
    write(api_->insert_or_assign, keys, cb, ce, values, scores, inits);
  }
  void accum_or_assign(py::array keys, int cb, int ce, py::array values,
                       std::optional<py::array> scores, const std::vector<InitTuple>& inits) {
    write(api_->accum_or_assign, keys, cb, ce, values, scores, inits);
  }

  int64_t erase(py::array keys) {
    int64_t n = check_keys(keys);
    int64_t erased = 0;
    call([&] { return api_->erase(handle_, &cpu_, n, keys.data(), &erased); });
    return erased;
  }

  int64_t export_batch(int64_t offset, int64_t limit, int cb, int ce, py::array keys,
                       std::optional<py::array> values, std::optional<py::array> scores,
                       std::optional<uint64_t> threshold) {
    check_keys_out(keys, limit);
    float* v = nullptr;
    if (values) {
      check_floats(*values, limit, ce - cb, "values");
      v = static_cast<float*>(values->mutable_data());
    }
    uint64_t* s = nullptr;
    if (scores) {
      check_u64(*scores, limit, "scores");
      s = static_cast<uint64_t*>(scores->mutable_data());
    }
    int64_t count = 0;
    call([&] {
      if (threshold) {
        return api_->export_if(handle_, &cpu_, *threshold, offset, limit, cb, ce,
                               keys.mutable_data(), v, s, &count);
      }
      return api_->export_batch(handle_, &cpu_, offset, limit, cb, ce, keys.mutable_data(), v, s,
                                &count);
    });
    return count;
  }

  int64_t insert_and_evict(py::array keys, int cb, int ce, py::array values,
                           std::optional<py::array> scores, const std::vector<InitTuple>& inits,
                           py::array evicted_keys, py::array evicted_values,
                           py::array evicted_scores) {
    int64_t n = check_keys(keys);
    check_floats(values, n, ce - cb, "values");
    const uint64_t* sc = check_scores(scores, n);
    check_keys_out(evicted_keys, n);
    check_floats(evicted_values, n, row_width_, "evicted_values");
    check_u64(evicted_scores, n, "evicted_scores");
    auto in = to_inits(inits);
    int64_t m = 0;
    call([&] {
      return api_->insert_and_evict(
          handle_, &cpu_, n, keys.data(), cb, ce, static_cast<const float*>(values.data()), sc,
          in.data(), static_cast<int32_t>(in.size()), evicted_keys.mutable_data(),
          static_cast<float*>(evicted_values.mutable_data()),
          static_cast<uint64_t*>(evicted_scores.mutable_data()), &m);
    });
    return m;
  }

  void import_batch(py::array keys, int cb, int ce, py::array values, py::array scores,
                    const std::vector<InitTuple>& inits) {
    if (api_->struct_size < offsetof(sok_storage_api, import_batch) + sizeof(api_->import_batch)) {
      throw py::value_error("this backend was built without import_batch; rebuild it against this sok-core");
    }
    write(api_->import_batch, keys, cb, ce, values, scores, inits);
  }
  void clear() {
    call([&] { return api_->clear(handle_, &cpu_); });
  }
  void set_global_epoch(uint64_t epoch) {
    call([&] { return api_->set_global_epoch(handle_, epoch); });
  }
  std::string describe() {
    char buffer[512];
    call([&] { return api_->describe(handle_, buffer, sizeof(buffer)); });
    return buffer;
  }

  // A capsule holding the sok_storage* of this table (for the TF ops and tools). The table must
  // outlive every user of the capsule.
  py::capsule handle_capsule() { return py::capsule(handle_, SOK_STORAGE_HANDLE_CAPSULE_NAME); }

 private:
  using WriteFn = sok_status (*)(sok_storage*, const sok_exec_context*, int64_t, const void*,
                                 int32_t, int32_t, const float*, const uint64_t*,
                                 const sok_initializer*, int32_t);

  void write(WriteFn fn, py::array keys, int cb, int ce, py::array values,
             std::optional<py::array> scores, const std::vector<InitTuple>& inits) {
    int64_t n = check_keys(keys);
    check_floats(values, n, ce - cb, "values");
    const uint64_t* sc = check_scores(scores, n);
    auto in = to_inits(inits);
    call([&] {
      return fn(handle_, &cpu_, n, keys.data(), cb, ce, static_cast<const float*>(values.data()),
                sc, in.data(), static_cast<int32_t>(in.size()));
    });
  }

  template <class Fn>
  void call(Fn&& fn) {
    sok_status st;
    {
      py::gil_scoped_release release;
      st = fn();
    }
    if (st != SOK_OK) raise(st, api_->last_error(handle_));
  }

  [[noreturn]] static void raise(sok_status st, const char* message) {
    std::string msg = message ? message : "unknown error";
    switch (st) {
      case SOK_ERROR_INVALID_ARGUMENT: throw py::value_error(msg);
      case SOK_ERROR_OUT_OF_MEMORY: throw std::bad_alloc();
      case SOK_ERROR_UNSUPPORTED:
        PyErr_SetString(PyExc_NotImplementedError, msg.c_str());
        throw py::error_already_set();
      default: throw std::runtime_error(msg);
    }
  }

  static int32_t parse_key_dtype(const std::string& name) {
    if (name == "int64") return SOK_KEY_INT64;
    if (name == "uint64") return SOK_KEY_UINT64;
    if (name == "int32") return SOK_KEY_INT32;
    throw py::value_error("key_dtype '" + name + "' is not supported; valid: int64, uint64, int32");
  }
  static std::string key_dtype_name(int32_t t) {
    return t == SOK_KEY_INT32 ? "int32" : (t == SOK_KEY_UINT64 ? "uint64" : "int64");
  }

  static bool c_contiguous(const py::array& a) {
    return (a.flags() & py::array::c_style) != 0;
  }
  int64_t check_keys(const py::array& keys) const {
    if (keys.ndim() != 1 || !c_contiguous(keys) ||
        keys.dtype().kind() != (key_type_ == SOK_KEY_UINT64 ? 'u' : 'i') ||
        keys.itemsize() != (key_type_ == SOK_KEY_INT32 ? 4 : 8)) {
      throw py::value_error("keys must be a 1-D C-contiguous " + key_dtype_name(key_type_) +
                            " array, got dtype " + std::string(py::str(keys.dtype())) + " with " +
                            std::to_string(keys.ndim()) + " dimensions");
    }
    return keys.shape(0);
  }
  void check_keys_out(py::array& keys, int64_t n) const {
    if (check_keys(keys) < n || !keys.writeable()) {
      throw py::value_error("the keys output must be writable and hold " + std::to_string(n) + " keys");
    }
  }
  static void check_floats(const py::array& a, int64_t rows, int cols, const char* what) {
    bool shape_ok = rows < 0 ? (a.ndim() == 1 && a.shape(0) == cols)
                             : (a.ndim() == 2 && a.shape(0) == rows && a.shape(1) == cols);
    if (!shape_ok || !c_contiguous(a) || a.dtype().kind() != 'f' || a.itemsize() != 4) {
      throw py::value_error(std::string(what) + " must be a C-contiguous float32 array of shape (" +
                            (rows < 0 ? "" : std::to_string(rows) + ", ") + std::to_string(cols) +
                            ")");
    }
  }
  static void check_bytes(const py::array& a, int64_t n, const char* what) {
    if (a.ndim() != 1 || a.shape(0) != n || !c_contiguous(a) || a.itemsize() != 1 || !a.writeable()) {
      throw py::value_error(std::string(what) + " must be a writable 1-D bool or uint8 array of length " + std::to_string(n));
    }
  }
  static void check_u64(const py::array& a, int64_t n, const char* what) {
    if (a.ndim() != 1 || a.shape(0) < n || !c_contiguous(a) || a.dtype().kind() != 'u' || a.itemsize() != 8) {
      throw py::value_error(std::string(what) + " must be a 1-D uint64 array of length " + std::to_string(n));
    }
  }
  static const uint64_t* check_scores(const std::optional<py::array>& scores, int64_t n) {
    if (!scores) return nullptr;
    check_u64(*scores, n, "scores");
    return static_cast<const uint64_t*>(scores->data());
  }
  static std::vector<sok_initializer> to_inits(const std::vector<InitTuple>& inits) {
    std::vector<sok_initializer> out;
    for (const auto& t : inits) {
      sok_initializer i{};
      i.kind = std::get<0>(t);
      i.col_begin = std::get<1>(t);
      i.col_end = std::get<2>(t);
      i.a = std::get<3>(t);
      i.b = std::get<4>(t);
      i.seed = std::get<5>(t);
      out.push_back(i);
    }
    return out;
  }

  const sok_storage_api* api_;
  sok_storage* handle_ = nullptr;
  int32_t key_type_;
  int row_width_;
  sok_exec_context cpu_{SOK_DEVICE_CPU, 0, nullptr};
};

// Adds to module `m`: `Table` (the class above over `api`), `storage_api()` (the capsule of the
// function table) and `BUILD_INFO` (version, CUDA or not, CUDA architectures) of the backend being
// compiled (SOK_BACKEND_VERSION, SOK_WITH_CUDA and SOK_CUDA_ARCHS come from sok_configure_backend).
inline void bind_table(py::module_& m, const sok_storage_api* api) {
  py::dict build;
  build["version"] = SOK_BACKEND_VERSION;
#ifdef SOK_WITH_CUDA
  build["cuda"] = true;
  build["cuda_archs"] = SOK_CUDA_ARCHS;
#else
  build["cuda"] = false;
  build["cuda_archs"] = "";
#endif
  build["api_version"] = api->api_version;
  m.attr("BUILD_INFO") = build;
  // module_local: every backend compiles its own PyTable, so each registers the type privately.
  py::class_<PyTable>(m, "Table", py::module_local(), "A storage of this backend, driven through its C ABI.")
      .def(py::init([api](const std::string& key_dtype, int row_width,
                          const std::map<std::string, std::string>& options) {
             return std::make_unique<PyTable>(api, key_dtype, row_width, options);
           }),
           py::arg("key_dtype"), py::arg("row_width"), py::arg("options"))
      .def_property_readonly("row_width", &PyTable::row_width)
      .def_property_readonly("key_dtype", &PyTable::key_dtype)
      .def("size", &PyTable::size)
      .def("capacity", &PyTable::capacity)
      .def("find", &PyTable::find)
      .def("find_or_insert", &PyTable::find_or_insert)
      .def("insert_or_assign", &PyTable::insert_or_assign)
      .def("accum_or_assign", &PyTable::accum_or_assign)
      .def("erase", &PyTable::erase)
      .def("export_batch", &PyTable::export_batch)
      .def("insert_and_evict", &PyTable::insert_and_evict)
      .def("import_batch", &PyTable::import_batch)
      .def("clear", &PyTable::clear)
      .def("set_global_epoch", &PyTable::set_global_epoch)
      .def("describe", &PyTable::describe)
      .def("handle_capsule", &PyTable::handle_capsule);
  m.def("storage_api", [api] {
    return py::capsule(const_cast<sok_storage_api*>(api), SOK_STORAGE_CAPSULE_NAME);
  }, "The sok_storage_api function table of this backend, as a PyCapsule.");
}

}  // namespace sok

#endif  // SOK_PYTHON_TABLE_HPP_
