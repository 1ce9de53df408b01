// libsok_det_storage.so's C entry point (sok_det_storage.h): det's function table over its storages.
#include "sok_det_storage.h"

#include "det_table.hpp"
#include "sok/kit/abi_adapter.hpp"

extern "C" const sok_storage_api* sok_det_storage_api(void) {
  return sok::make_storage_api<sok_det::create_storage>("det");
}
