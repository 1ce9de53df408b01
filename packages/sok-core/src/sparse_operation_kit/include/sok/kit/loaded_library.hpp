// A symbol of a shared library the process has already loaded, found by the library's file name (its
// soname). TensorFlow loads op libraries RTLD_LOCAL, so their symbols are not global: another
// library reaches them through the loaded library's own handle (dlopen RTLD_NOLOAD: nothing is loaded
// that was not). Used by the op libraries that register with libsok_tf_ops.so (sok/tf/calls.h) and by
// sok-hps's C++ server, which reaches sok-backend-det's libsok_det_storage.so.
//
// Example:
//   void* entry = sok::loaded_library_symbol("libsok_det_storage.so", "sok_det_storage_api");
#ifndef SOK_KIT_LOADED_LIBRARY_HPP_
#define SOK_KIT_LOADED_LIBRARY_HPP_

#include <dlfcn.h>

namespace sok {

// `library`'s symbol `name`, or nullptr where the process has not loaded `library` or it lacks `name`.
inline void* loaded_library_symbol(const char* library, const char* name) {
  void* handle = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void* symbol = dlsym(handle, name);
  dlclose(handle);  // the NOLOAD handle's reference; the library stays loaded
  return symbol;
}

}  // namespace sok

#endif  // SOK_KIT_LOADED_LIBRARY_HPP_
