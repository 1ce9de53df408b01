// Who computes the functions that SokPyCall and SokResolveTable name (csrc/tf_ops/call_ops.cc, in
// libsok_tf_ops.so): in a Python process, the Python functions registered with
// sparse_operation_kit.python_ops.register (libsok_tf_python.so, which only an interpreter loads,
// installs that dispatch when it loads); in a process with no Python (a C++ server), a native
// implementation that another op library registered under the same name when it loaded (sok-hps's
// libsok_hps_serving.so: HPS's lookups). So one SavedModel serves from either process.
//
// Another library's kernels compute a function by name the same way through call_function() below;
// another library registers a native implementation through register_with_sok_ops(): it finds libsok_tf_ops.so among
// the loaded libraries by its name (TensorFlow loads op libraries with RTLD_LOCAL, so their symbols
// are not global) and calls its registration function; load libsok_tf_ops.so first. Compile with
// TensorFlow's flags; no Python here.
//
// Example (a library's registration at load):
//   Status lookup(OpKernelContext* ctx, const std::string& context,
//                 const std::vector<const Tensor*>& inputs);           // fills ctx's outputs
//   static const bool registered = sok_tf::register_with_sok_ops(
//       "mypkg.rows:lookup", &lookup, nullptr, "libmy_ops.so");
#ifndef SOK_TF_CALLS_H_
#define SOK_TF_CALLS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "sok/kit/loaded_library.hpp"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/logging.h"

// The dtypes of SokPyCall's inputs and outputs.
#define SOK_PY_TYPES "{float, double, half, int8, uint8, int16, uint16, int32, uint32, int64, uint64, bool}"

namespace sok_tf {

using ::tensorflow::DataType;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;

using ::tensorflow::Tensor;

// function(context, *inputs) in C++: fills ctx's outputs 0 .. n-1, one per dtype the caller asks for
// (checked after the call).
using NativeCall = Status (*)(OpKernelContext* ctx, const std::string& context,
                              const std::vector<const Tensor*>& inputs);
// SokResolveTable(function, context) in C++: the address of a live sok_table_ref (sok/table_ref.h).
using NativeResolver = Status (*)(const std::string& context, int64_t* address);
// The Python dispatch that libsok_tf_python.so installs.
using PythonCall = Status (*)(OpKernelContext* ctx, const std::string& function, const std::string& context,
                              const std::vector<const Tensor*>& inputs, const std::vector<DataType>& out_types);
using PythonResolver = Status (*)(const std::string& function, const std::string& context, int64_t* address);
// function(context, *inputs) into ctx's outputs of out_types, by whoever implements it (Python, else
// native), for the kernels of other op libraries (sok-hps's ops of NVIDIA's HPS plugin).
using CallFunction = Status (*)(OpKernelContext* ctx, const std::string& function, const std::string& context,
                                const std::vector<const Tensor*>& inputs, const std::vector<DataType>& out_types);

// The functions of libsok_tf_ops.so that other libraries find by dlsym (extern "C" names).
extern "C" {
typedef void (*RegisterNativeFn)(const char* function, NativeCall call, NativeResolver resolve);
typedef void (*SetPythonDispatchFn)(PythonCall call, PythonResolver resolve);
}
inline constexpr char kOpsLibrary[] = "libsok_tf_ops.so";
inline constexpr char kRegisterNative[] = "sok_tf_register_native";
inline constexpr char kSetPythonDispatch[] = "sok_tf_set_python_dispatch";
inline constexpr char kCallFunction[] = "sok_tf_call_function";

// libsok_tf_ops.so's symbol `name` (nullptr, with an error logged, where the library is not loaded).
inline void* ops_library_symbol(const char* name, const char* caller) {
  void* symbol = sok::loaded_library_symbol(kOpsLibrary, name);
  if (symbol == nullptr) {
    LOG(ERROR) << caller << " cannot register with SOK's op library: " << kOpsLibrary
               << " is not loaded (load it before " << caller << ", e.g. TF_LoadLibrary or tf.load_op_library)";
  }
  return symbol;
}

// Registers the native implementation of `function` (either pointer may be nullptr: that op is not
// implemented); true where libsok_tf_ops.so took it. `caller` names the registering library.
inline bool register_with_sok_ops(const char* function, NativeCall call, NativeResolver resolve,
                                  const char* caller) {
  auto reg = reinterpret_cast<RegisterNativeFn>(ops_library_symbol(kRegisterNative, caller));
  if (reg == nullptr) return false;
  reg(function, call, resolve);
  return true;
}

// libsok_tf_ops.so's CallFunction, found once; nullptr (an error logged) where it is not loaded.
inline CallFunction call_function(const char* caller) {
  static const CallFunction call = reinterpret_cast<CallFunction>(ops_library_symbol(kCallFunction, caller));
  return call;
}

}  // namespace sok_tf

#endif  // SOK_TF_CALLS_H_
