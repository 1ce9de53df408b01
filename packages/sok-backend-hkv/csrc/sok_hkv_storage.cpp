// libsok_hkv_storage.so's C entry point (sok_hkv_storage.h): hkv's function table over its storages.
#include "sok_hkv_storage.h"

#include "hkv_table.hpp"
#include "sok/kit/abi_adapter.hpp"

extern "C" const sok_storage_api* sok_hkv_storage_api(void) {
  return sok::make_storage_api<sok_hkv::create_storage>("hkv");
}
