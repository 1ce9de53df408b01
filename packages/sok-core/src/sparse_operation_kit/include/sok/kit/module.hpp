// What a first-party backend's pybind11 module exports: `storage_api()`, its sok_storage_api
// function table as a PyCapsule (SOK_STORAGE_CAPSULE_NAME), and `BUILD_INFO` (version, CUDA or not,
// CUDA architectures, API version). Tables are made by sok-core's one binding of the C ABI
// (sparse_operation_kit._table.Table over that capsule), not by the backend's module.
//
//   PYBIND11_MODULE(_core, m) {
//     sok::export_backend(m, sok::make_storage_api<my_backend::create_storage>("mine"));
//   }
//
// SOK_BACKEND_VERSION, SOK_WITH_CUDA and SOK_CUDA_ARCHS come from sok_configure_backend (which
// sok_add_backend calls) of sok-core's CMake package (SokCoreConfig.cmake).
#ifndef SOK_KIT_MODULE_HPP_
#define SOK_KIT_MODULE_HPP_

#include <pybind11/pybind11.h>

#include "sok/storage_api.h"

namespace sok {

inline void export_backend(pybind11::module_& m, const sok_storage_api* api) {
  namespace py = pybind11;
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
  m.def(
      "storage_api", [api] { return py::capsule(const_cast<sok_storage_api*>(api), SOK_STORAGE_CAPSULE_NAME); },
      "The sok_storage_api function table of this backend, as a PyCapsule.");
}

}  // namespace sok

#endif  // SOK_KIT_MODULE_HPP_
