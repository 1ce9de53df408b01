// TensorFlow ops whose kernels call Python functions named in the graph (libsok_tf_python.so):
//
// * SokPyCall: a py_function that a SavedModel keeps. tf.py_function records a token that only
//   the process that traced it knows; SokPyCall records "module:qualname" and a context string, and
//   its kernel calls the function registered under that name where the graph runs; a name nobody
//   registered is refused, nothing imported (sparse_operation_kit.python_ops.kernel_call).
// * SokResolveTable: the table input of the storage ops, found by such a function (it returns a
//   sparse_operation_kit.table_ref.TableRef) the first time the kernel runs, then cached for as
//   long as the reference is alive. A graph that holds it instead of an address works in another
//   process (a loaded SavedModel) and after its table is replaced (e.g. a server restarted).
//
// The kernels run only inside a Python process (tf.saved_model.load from Python, not a C++ server):
// the library is not linked with libpython, whose symbols the interpreter that loads it provides.
// Inputs and outputs are host memory on every device.
#include <mutex>
#include <string>
#include <vector>

#include "sok/table_ref.h"
#include "sok/tf/python_call.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"

namespace sok_tf_python {

// results = function(context, *args), as NumPy arrays (copies of the inputs); every output has the
// dtype Tout says (sparse_operation_kit.python_ops.kernel_call checks and converts).
class PyCallOp : public OpKernel {
 public:
  explicit PyCallOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("function", &function_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("context", &context_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &out_types_));
  }

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, need_python("SokPyCall"));
    std::vector<const Tensor*> inputs;
    for (int i = 0; i < ctx->num_inputs(); ++i) inputs.push_back(&ctx->input(i));
    Gil gil;
    OP_REQUIRES_OK(ctx, call_into_outputs(ctx, "SokPyCall of " + function_, function_, context_, inputs, out_types_));
  }

 private:
  std::string function_;
  std::string context_;
  std::vector<DataType> out_types_;
};

bool live(int64_t address) {
  return sok_table_ref_is_live(reinterpret_cast<const sok_table_ref*>(static_cast<intptr_t>(address)));
}

// table (host scalar) = the address of the TableRef that function(context) returns; cached while
// that reference is alive (a sok_table_ref is never freed, so reading a cached one's magic is safe).
class ResolveTableOp : public OpKernel {
 public:
  explicit ResolveTableOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("function", &function_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("context", &context_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t address = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      address = cached_;
    }
    if (!live(address)) {
      OP_REQUIRES_OK(ctx, resolve(&address));
      std::lock_guard<std::mutex> lock(mu_);
      cached_ = address;
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = address;
  }

 private:
  Status resolve(int64_t* address) {
    TF_RETURN_IF_ERROR(need_python("SokResolveTable"));
    const std::string what = "SokResolveTable by " + function_;
    Gil gil;
    Ref args(Py_BuildValue("(ss)", function_.c_str(), context_.c_str()));
    if (!args) return python_error(what);
    Ref result(call_helper("kernel_resolve", args.get()));
    if (!result) return python_error(what);
    *address = PyLong_AsLongLong(result.get());
    if (PyErr_Occurred()) return python_error(what);
    if (!live(*address)) {
      return errors::FailedPrecondition(what, ": the table it returned is not alive (was it closed?)");
    }
    return Status();
  }

  std::string function_;
  std::string context_;
  std::mutex mu_;
  int64_t cached_ = 0;
};

REGISTER_OP("SokPyCall")
    .Input("args: Tin")
    .Output("results: Tout")
    .Attr("Tin: list(" SOK_PY_TYPES ") >= 0")
    .Attr("Tout: list(" SOK_PY_TYPES ") >= 0")
    .Attr("function: string")
    .Attr("context: string = ''")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnknownShape)
    .Doc("results = the Python function `function` ('module:qualname') called with `context` and the args.");

REGISTER_OP("SokResolveTable")
    .Output("table: int64")
    .Attr("function: string")
    .Attr("context: string = ''")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("The table input of the storage ops: the TableRef that `function`(context) returns, cached while alive.");

REGISTER_KERNEL_BUILDER(Name("SokPyCall").Device(::tensorflow::DEVICE_CPU), PyCallOp);
REGISTER_KERNEL_BUILDER(Name("SokPyCall").Device(::tensorflow::DEVICE_GPU).HostMemory("args").HostMemory("results"),
                        PyCallOp);
REGISTER_KERNEL_BUILDER(Name("SokResolveTable").Device(::tensorflow::DEVICE_CPU), ResolveTableOp);
REGISTER_KERNEL_BUILDER(Name("SokResolveTable").Device(::tensorflow::DEVICE_GPU).HostMemory("table"), ResolveTableOp);

}  // namespace sok_tf_python
