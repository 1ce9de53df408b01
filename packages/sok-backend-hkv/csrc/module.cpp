// The Python extension of sok-backend-hkv: its C ABI capsule and build facts (sok-core's binding,
// sparse_operation_kit._table, makes its tables). The storage itself is libsok_hkv_storage.so's
// (sok_hkv_storage.h), which this module links: one implementation for Python and for processes
// with no Python.
#include <pybind11/pybind11.h>

#include "sok/kit/module.hpp"
#include "sok_hkv_storage.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "hkv storage backend (var_type 'hybrid'): a bucketed table with scores and eviction.";
  sok::export_backend(m, sok_hkv_storage_api());
}
