// The Python extension of sok-backend-det: its C ABI capsule and build facts (sok-core's binding,
// sparse_operation_kit._table, makes its tables).
#include <pybind11/pybind11.h>

#include "det_table.hpp"
#include "sok/kit/abi_adapter.hpp"
#include "sok/kit/module.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "det storage backend (var_type 'hbm'): a growing hash table of float rows.";
  sok::export_backend(m, sok::make_storage_api<sok_det::create_storage>("det"));
}
