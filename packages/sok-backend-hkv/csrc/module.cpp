// The Python extension of sok-backend-hkv: the storage class, the C ABI capsule, build facts.
#include <pybind11/pybind11.h>

#include "hkv_table.hpp"
#include "sok/kit/abi_adapter.hpp"
#include "sok/python_table.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "hkv storage backend (var_type 'hybrid'): a bucketed table with scores and eviction.";
  sok::bind_table(m, sok::make_storage_api<sok_hkv::create_storage>("hkv"));
}
