// SokPyCall and SokResolveTable: ops whose kernels compute a function the graph names
// ("module:qualname") with a context string, by whoever implements it in the process that runs the
// graph (sok/tf/calls.h): the registered Python function where an interpreter loaded
// libsok_tf_python.so, else a native implementation another op library registered.
//
// * SokPyCall: a py_function that a SavedModel keeps. tf.py_function records a token that only
//   the process that traced it knows; SokPyCall records the function's name and a context.
// * SokResolveTable: the table input of the storage ops, found by such a function the first time
//   the kernel runs, then cached for as long as the reference is alive. A graph that holds it
//   instead of an address works in another process (a loaded SavedModel) and after its table is
//   replaced (e.g. a server restarted).
//
// Inputs and outputs are host memory on every device.
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "sok/table_ref.h"
#include "sok/tf/calls.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok_tf {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

struct Native {
  NativeCall call = nullptr;
  NativeResolver resolve = nullptr;
};

struct Dispatch {
  std::mutex mu;
  PythonCall python_call = nullptr;
  PythonResolver python_resolve = nullptr;
  std::map<std::string, Native> natives;
};

Dispatch& dispatch() {
  static Dispatch* d = new Dispatch;  // never destroyed: kernels may run during the process's exit
  return *d;
}

// "a, b" of the native functions registered, for messages.
std::string native_names() {
  std::string out;
  for (const auto& [name, native] : dispatch().natives) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

Status no_implementation(const char* op, const std::string& function) {
  std::lock_guard<std::mutex> lock(dispatch().mu);
  return errors::FailedPrecondition(
      op, " of ", function, ": this process has no Python interpreter, and no op library loaded into it implements ",
      function, " natively (native implementations: ", native_names(),
      "). Load the op library that does (HPS's lookups: sok-hps's libsok_hps_serving.so) after "
      "libsok_tf_ops.so, or run the graph from Python");
}

bool live(int64_t address) {
  return sok_table_ref_is_live(reinterpret_cast<const sok_table_ref*>(static_cast<intptr_t>(address)));
}

// function(context, *inputs) into ctx's outputs of out_types: Python where an interpreter installed
// its dispatch, else the native implementation, else the error that says what to load.
Status call(OpKernelContext* ctx, const std::string& function, const std::string& context,
            const std::vector<const Tensor*>& inputs, const std::vector<DataType>& out_types) {
  PythonCall python = nullptr;
  NativeCall native = nullptr;
  {
    std::lock_guard<std::mutex> lock(dispatch().mu);
    python = dispatch().python_call;
    auto it = dispatch().natives.find(function);
    if (it != dispatch().natives.end()) native = it->second.call;
  }
  if (python != nullptr) return python(ctx, function, context, inputs, out_types);
  if (native == nullptr) return no_implementation("SokPyCall", function);
  TF_RETURN_IF_ERROR(native(ctx, context, inputs));
  for (size_t i = 0; i < out_types.size(); ++i) {
    const Tensor* out = ctx->mutable_output(static_cast<int>(i));
    if (out == nullptr || out->dtype() != out_types[i]) {
      return errors::Internal("SokPyCall of ", function, ": the native implementation left output ", i,
                              out == nullptr ? " unset" : " of another dtype than the graph's");
    }
  }
  return Status();
}

class PyCallOp : public OpKernel {
 public:
  explicit PyCallOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("function", &function_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("context", &context_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &out_types_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<const Tensor*> inputs;
    for (int i = 0; i < ctx->num_inputs(); ++i) inputs.push_back(&ctx->input(i));
    OP_REQUIRES_OK(ctx, call(ctx, function_, context_, inputs, out_types_));
  }

 private:
  std::string function_;
  std::string context_;
  std::vector<DataType> out_types_;
};

// table (host scalar) = the address of the sok_table_ref that function(context) gives; cached while
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
    PythonResolver python = nullptr;
    NativeResolver native = nullptr;
    {
      std::lock_guard<std::mutex> lock(dispatch().mu);
      python = dispatch().python_resolve;
      auto it = dispatch().natives.find(function_);
      if (it != dispatch().natives.end()) native = it->second.resolve;
    }
    if (python != nullptr) {
      TF_RETURN_IF_ERROR(python(function_, context_, address));
    } else if (native != nullptr) {
      TF_RETURN_IF_ERROR(native(context_, address));
    } else {
      return no_implementation("SokResolveTable", function_);
    }
    if (!live(*address)) {
      return errors::FailedPrecondition("SokResolveTable by ", function_,
                                        ": the table it returned is not alive (was it closed?)");
    }
    return Status();
  }

  std::string function_;
  std::string context_;
  std::mutex mu_;
  int64_t cached_ = 0;
};

}  // namespace
}  // namespace sok_tf

extern "C" {

// A native implementation of `function` (registered again: the later one; nullptr parts: none).
__attribute__((visibility("default"))) void sok_tf_register_native(const char* function, sok_tf::NativeCall call,
                                                                    sok_tf::NativeResolver resolve) {
  std::lock_guard<std::mutex> lock(sok_tf::dispatch().mu);
  sok_tf::dispatch().natives[function] = {call, resolve};
}

// The Python dispatch of libsok_tf_python.so (loaded by an interpreter only): used for every function.
__attribute__((visibility("default"))) void sok_tf_set_python_dispatch(sok_tf::PythonCall call,
                                                                        sok_tf::PythonResolver resolve) {
  std::lock_guard<std::mutex> lock(sok_tf::dispatch().mu);
  sok_tf::dispatch().python_call = call;
  sok_tf::dispatch().python_resolve = resolve;
}

// call() for other libraries' kernels (sok_tf::call_function).
__attribute__((visibility("default"))) ::tensorflow::Status sok_tf_call_function(
    ::tensorflow::OpKernelContext* ctx, const std::string& function, const std::string& context,
    const std::vector<const ::tensorflow::Tensor*>& inputs, const std::vector<::tensorflow::DataType>& out_types) {
  return sok_tf::call(ctx, function, context, inputs, out_types);
}

}  // extern "C"

namespace sok_tf {

REGISTER_OP("SokPyCall")
    .Input("args: Tin")
    .Output("results: Tout")
    .Attr("Tin: list(" SOK_PY_TYPES ") >= 0")
    .Attr("Tout: list(" SOK_PY_TYPES ") >= 0")
    .Attr("function: string")
    .Attr("context: string = ''")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnknownShape)
    .Doc("results = the function `function` ('module:qualname') called with `context` and the args: the Python "
         "function registered under that name, or where no Python runs a native one (sok/tf/calls.h).");

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

}  // namespace sok_tf
