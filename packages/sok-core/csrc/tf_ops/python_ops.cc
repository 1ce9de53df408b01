// The Python dispatch of SokPyCall and SokResolveTable (libsok_tf_python.so): their kernels
// (call_ops.cc, in libsok_tf_ops.so) call the Python function registered under the name the graph
// holds (sparse_operation_kit.python_ops.kernel_call and kernel_resolve; a name nobody registered is
// refused, nothing imported). Installed into libsok_tf_ops.so when this library loads, which only an
// interpreter does: the library is not linked with libpython, whose symbols the interpreter that
// loads it provides (sok/tf/calls.h says who computes the functions where no Python runs).
#include <string>
#include <vector>

#include "sok/tf/calls.h"
#include "sok/tf/python_call.h"

namespace sok_tf_python {
namespace {

Status call(OpKernelContext* ctx, const std::string& function, const std::string& context,
            const std::vector<const Tensor*>& inputs, const std::vector<DataType>& out_types) {
  TF_RETURN_IF_ERROR(need_python("SokPyCall"));
  Gil gil;
  return call_into_outputs(ctx, "SokPyCall of " + function, function, context, inputs, out_types);
}

Status resolve(const std::string& function, const std::string& context, int64_t* address) {
  TF_RETURN_IF_ERROR(need_python("SokResolveTable"));
  const std::string what = "SokResolveTable by " + function;
  Gil gil;
  Ref args(Py_BuildValue("(ss)", function.c_str(), context.c_str()));
  if (!args) return python_error(what);
  Ref result(call_helper("kernel_resolve", args.get()));
  if (!result) return python_error(what);
  *address = PyLong_AsLongLong(result.get());
  if (PyErr_Occurred()) return python_error(what);
  return Status();
}

[[maybe_unused]] const bool installed = [] {
  auto set = reinterpret_cast<sok_tf::SetPythonDispatchFn>(
      sok_tf::ops_library_symbol(sok_tf::kSetPythonDispatch, "libsok_tf_python.so"));
  if (set != nullptr) set(&call, &resolve);
  return set != nullptr;
}();

}  // namespace
}  // namespace sok_tf_python
