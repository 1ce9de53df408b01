/* libsok_hkv_storage.so: hkv's storage as a plain shared library, for processes with no Python (the
 * C++ HPS server of sok-hps, libsok_hps_serving.so). It holds the one implementation of hkv
 * (hkv_table.cpp, and hkv_table_cuda.cu in CUDA builds); the Python extension sok_backend_hkv._core
 * links it and exports the same function table as a PyCapsule. Both are installed in the package
 * directory sok_backend_hkv/.
 *
 * A process that loaded the library (TF_LoadLibrary, dlopen) finds the entry point by name, linking
 * nothing of hkv at build time:
 *
 *   void* lib = dlopen("libsok_hkv_storage.so", RTLD_NOW | RTLD_NOLOAD);
 *   auto entry = (sok_hkv_storage_api_fn)dlsym(lib, SOK_HKV_STORAGE_API_SYMBOL);
 *   const sok_storage_api* api = entry();   // static, for the life of the process
 */
#ifndef SOK_HKV_STORAGE_H_
#define SOK_HKV_STORAGE_H_

#include "sok/storage_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SOK_HKV_STORAGE_LIBRARY "libsok_hkv_storage.so"
#define SOK_HKV_STORAGE_API_SYMBOL "sok_hkv_storage_api"

typedef const sok_storage_api* (*sok_hkv_storage_api_fn)(void);

/* hkv's function table (backend_name "hkv"); never NULL. */
__attribute__((visibility("default"))) const sok_storage_api* sok_hkv_storage_api(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SOK_HKV_STORAGE_H_ */
