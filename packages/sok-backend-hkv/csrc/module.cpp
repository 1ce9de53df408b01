// The Python extension of sok-backend-hkv: its C ABI capsule and build facts (sok-core's binding,
// sparse_operation_kit._table, makes its tables).
#include <pybind11/pybind11.h>

#include "hkv_table.hpp"
#include "sok/kit/abi_adapter.hpp"
#include "sok/kit/module.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "hkv storage backend (var_type 'hybrid'): a bucketed table with scores and eviction.";
  sok::export_backend(m, sok::make_storage_api<sok_hkv::create_storage>("hkv"));
}
