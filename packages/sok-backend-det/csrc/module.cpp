// The Python extension of sok-backend-det: its C ABI capsule and build facts (sok-core's binding,
// sparse_operation_kit._table, makes its tables). The storage itself is libsok_det_storage.so's
// (sok_det_storage.h), which this module links: one implementation for Python and for processes
// with no Python.
#include <pybind11/pybind11.h>

#include "sok/kit/module.hpp"
#include "sok_det_storage.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "det storage backend (var_type 'hbm'): a growing hash table of float rows.";
  sok::export_backend(m, sok_det_storage_api());
}
