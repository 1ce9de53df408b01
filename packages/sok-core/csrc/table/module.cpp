// sparse_operation_kit._table: the one Python binding of the storage C ABI, compiled once in
// sok-core (independent of TensorFlow) and used for every native backend. A backend's own module
// only exports its sok_storage_api capsule and BUILD_INFO (sok/kit/module.hpp); the registry loads
// the capsule once, checks its version, and makes `Table(api, ...)` over it.
//
// Contents: Table (sok::PyTable, py_table.hpp), TableRef (a sok_table_ref of sok/table_ref.h for
// the TensorFlow ops, built here so that Python mirrors no C struct) and cuda_device_count().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "py_table.hpp"
#include "sok/kit/export.hpp"
#include "sok/storage_api.h"
#include "sok/table_ref.h"

namespace sok {
namespace {

// The sok_storage_api behind a PyCapsule named SOK_STORAGE_CAPSULE_NAME.
const sok_storage_api* api_of(const py::capsule& api) {
  const char* name = api.name();
  if (name == nullptr || std::string(name) != SOK_STORAGE_CAPSULE_NAME) {
    throw py::value_error(std::string("api must be a '") + SOK_STORAGE_CAPSULE_NAME + "' PyCapsule (a backend's "
                          "storage_api()), got one named '" + (name ? name : "") + "'");
  }
  return static_cast<const sok_storage_api*>(api.get_pointer());
}

// A sok_table_ref whose address the TensorFlow ops receive. point() swaps what it refers to in
// place, so traced graphs keep the address. The struct itself is never freed: once this object is
// gone its magic reads 0 for the rest of the process, so an op (or a SokResolveTable kernel that
// cached the address) that still holds it fails cleanly instead of reading freed memory. That costs
// one small struct per table ever made.
class TableRef {
 public:
  TableRef() : ref_(new sok_table_ref{}) {}
  TableRef(const TableRef&) = delete;
  TableRef& operator=(const TableRef&) = delete;
  ~TableRef() { release(); }

  // Points the reference at `storage` of `api` (addresses, as integers), with key type `key_type`
  // (sok_key_type), rows of `row_width` floats and new rows filled by `inits`.
  void point(uintptr_t api, uintptr_t storage, int32_t key_type, int32_t row_width,
             const std::vector<InitTuple>& inits) {
    // An op may have read ref_->inits just before this swap: the initializers it points at stay
    // alive with this object (a few bytes per swap) instead of being freed under it.
    if (!inits_.empty()) retired_inits_.push_back(std::move(inits_));
    inits_ = to_inits(inits);
    ref_->api = reinterpret_cast<const sok_storage_api*>(api);
    ref_->storage = reinterpret_cast<sok_storage*>(storage);
    ref_->key_type = key_type;
    ref_->row_width = row_width;
    ref_->inits = inits_.data();
    ref_->num_inits = static_cast<int32_t>(inits_.size());
    ref_->magic = SOK_TABLE_REF_MAGIC;
  }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(ref_); }
  // Marks the reference dead: ops that still hold its address fail cleanly. Only the magic number
  // changes, so an op that checked it a moment before still reads valid pointers.
  void release() { ref_->magic = 0; }

 private:
  sok_table_ref* ref_;  // never freed (see above)
  std::vector<sok_initializer> inits_;
  std::vector<std::vector<sok_initializer>> retired_inits_;  // of earlier point()s (see there)
};

}  // namespace
}  // namespace sok

PYBIND11_MODULE(_table, m) {
  namespace py = pybind11;
  using sok::PyTable;
  m.doc() = "The Python binding of the storage C ABI (sok/storage_api.h), shared by every native backend.";
  // Every operation takes a keyword-only `stream` (a cudaStream_t as int, 0 = the legacy default
  // stream; 0 for CPU tables). CUDA tables take device arrays (__cuda_array_interface__ or
  // __dlpack__) on the table's GPU and enqueue their work on the stream; the calls that return
  // numbers (size, erase, export_batch, insert_and_evict, describe) wait for it.
  auto stream = py::arg("stream") = 0;
  py::class_<PyTable>(m, "Table", "A storage of a backend, driven through the backend's C ABI.")
      .def(py::init([](const py::capsule& api, const std::string& key_dtype, int row_width,
                       const std::map<std::string, std::string>& options, const std::string& device) {
             return std::make_unique<PyTable>(sok::api_of(api), key_dtype, row_width, options, device);
           }),
           py::arg("api"), py::arg("key_dtype"), py::arg("row_width"), py::arg("options"), py::arg("device") = "cpu")
      .def_property_readonly("row_width", &PyTable::row_width)
      .def_property_readonly("key_dtype", &PyTable::key_dtype)
      .def_property_readonly("device", &PyTable::device)
      .def("size", &PyTable::size, py::kw_only(), stream)
      .def("capacity", &PyTable::capacity, py::kw_only(), stream)
      .def("find", &PyTable::find, py::arg("keys"), py::arg("col_begin"), py::arg("col_end"), py::arg("values"),
           py::arg("default_row"), py::arg("found"), py::kw_only(), stream)
      .def("find_hits", &PyTable::find_hits, py::arg("keys"), py::arg("col_begin"), py::arg("col_end"),
           py::arg("values"), py::arg("found"), py::kw_only(), stream)
      .def("find_or_insert", &PyTable::find_or_insert, py::arg("keys"), py::arg("col_begin"), py::arg("col_end"),
           py::arg("values"), py::arg("found"), py::arg("scores"), py::arg("inits"), py::kw_only(), stream)
      .def("insert_or_assign", &PyTable::insert_or_assign, py::arg("keys"), py::arg("col_begin"),
           py::arg("col_end"), py::arg("values"), py::arg("scores"), py::arg("inits"), py::kw_only(), stream)
      .def("insert_or_assign_hinted", &PyTable::insert_or_assign_hinted, py::arg("keys"), py::arg("col_begin"),
           py::arg("col_end"), py::arg("values"), py::arg("scores"), py::arg("inits"), py::arg("hints"),
           py::kw_only(), stream)
      .def("accum_or_assign", &PyTable::accum_or_assign, py::arg("keys"), py::arg("col_begin"), py::arg("col_end"),
           py::arg("values"), py::arg("scores"), py::arg("inits"), py::kw_only(), stream)
      .def("erase", &PyTable::erase, py::arg("keys"), py::kw_only(), stream)
      .def("export_batch", &PyTable::export_batch, py::arg("offset"), py::arg("limit"), py::arg("col_begin"),
           py::arg("col_end"), py::arg("keys"), py::arg("values"), py::arg("scores"), py::arg("threshold"),
           py::kw_only(), stream)
      .def("insert_and_evict", &PyTable::insert_and_evict, py::arg("keys"), py::arg("col_begin"),
           py::arg("col_end"), py::arg("values"), py::arg("scores"), py::arg("inits"), py::arg("evicted_keys"),
           py::arg("evicted_values"), py::arg("evicted_scores"), py::kw_only(), stream)
      .def("import_batch", &PyTable::import_batch, py::arg("keys"), py::arg("col_begin"), py::arg("col_end"),
           py::arg("values"), py::arg("scores"), py::arg("inits"), py::kw_only(), stream)
      .def("update_rows", &PyTable::update_rows, py::arg("keys"), py::arg("col_begin"), py::arg("col_end"),
           py::arg("old_values"), py::arg("new_values"), py::arg("found"), py::arg("scores"), py::kw_only(), stream)
      .def("clear", &PyTable::clear, py::kw_only(), stream)
      .def("set_global_epoch", &PyTable::set_global_epoch, py::arg("epoch"), py::kw_only(), stream)
      .def("describe", &PyTable::describe, py::kw_only(), stream)
      .def("handle_capsule", &PyTable::handle_capsule);
  py::class_<sok::TableRef>(m, "TableRef", "A sok_table_ref (sok/table_ref.h) for the TensorFlow ops.")
      .def(py::init<>())
      .def("point", &sok::TableRef::point, py::arg("api"), py::arg("storage"), py::arg("key_type"),
           py::arg("row_width"), py::arg("inits"))
      .def_property_readonly("address", &sok::TableRef::address)
      .def("release", &sok::TableRef::release);
  m.def("export_chunk_slots", &sok::export_chunk_slots, py::arg("row_bytes"),
        "Slots per export call for rows of row_bytes bytes (key, values, score): the one export chunk size.");
  m.attr("EXPORT_CHUNK_BYTES") = sok::kExportChunkBytes;
  m.attr("HINT_UNIQUE_KEYS") = static_cast<uint32_t>(SOK_HINT_UNIQUE_KEYS);
  m.def("cuda_device_count", &sok::cuda_device_count, "CUDA devices this process sees (0 in CPU builds).");
#ifdef SOK_WITH_CUDA
  m.attr("WITH_CUDA") = true;
#else
  m.attr("WITH_CUDA") = false;
#endif
}
