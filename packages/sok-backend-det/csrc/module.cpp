// The Python extension of sok-backend-det: the storage class, the C ABI capsule, build facts.
#include <pybind11/pybind11.h>

#include "det_table.hpp"
#include "sok/kit/abi_adapter.hpp"
#include "sok/python_table.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "det storage backend (var_type 'hbm'): a growing hash table of float rows.";
  sok::bind_table(m, sok::make_storage_api<sok_det::create_storage>("det"));
}
