// TensorFlow ops whose kernels call Python functions named in the graph (libsok_tf_python.so):
//
// * SokPyCall: a py_function that a SavedModel keeps. tf.py_function records a token that only
//   the process that traced it knows; SokPyCall records "module:qualname" and a context string, and
//   its kernel imports the module wherever the graph runs (sparse_operation_kit.python_ops.kernel_call).
// * SokResolveTable: the table input of the storage ops, found by such a function (it returns a
//   sparse_operation_kit.table_ref.TableRef) the first time the kernel runs, then cached for as
//   long as the reference is alive. A graph that holds it instead of an address works in another
//   process (a loaded SavedModel) and after its table is replaced (e.g. a server restarted).
//
// The kernels run only inside a Python process (tf.saved_model.load from Python, not a C++ server):
// the library is not linked with libpython, whose symbols the interpreter that loads it provides.
// Inputs and outputs are host memory on every device.
#include <Python.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "sok/table_ref.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_tf_python {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// The Python module that converts arguments and results (sparse_operation_kit/python_ops.py).
constexpr char kHelper[] = "sparse_operation_kit.python_ops";
#define SOK_PY_TYPES "{float, double, half, int8, uint8, int16, uint16, int32, uint32, int64, uint64, bool}"

// The NumPy name of a dtype the ops take (SOK_PY_TYPES), or nullptr.
const char* numpy_name(DataType dtype) {
  switch (dtype) {
    case ::tensorflow::DT_FLOAT: return "float32";
    case ::tensorflow::DT_DOUBLE: return "float64";
    case ::tensorflow::DT_HALF: return "float16";
    case ::tensorflow::DT_INT8: return "int8";
    case ::tensorflow::DT_UINT8: return "uint8";
    case ::tensorflow::DT_INT16: return "int16";
    case ::tensorflow::DT_UINT16: return "uint16";
    case ::tensorflow::DT_INT32: return "int32";
    case ::tensorflow::DT_UINT32: return "uint32";
    case ::tensorflow::DT_INT64: return "int64";
    case ::tensorflow::DT_UINT64: return "uint64";
    case ::tensorflow::DT_BOOL: return "bool";
    default: return nullptr;
  }
}

// Holds the GIL for its scope.
class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

// An owned reference, released with the GIL held (every Ref lives inside a Gil's scope).
class Ref {
 public:
  explicit Ref(PyObject* object) : object_(object) {}
  ~Ref() { Py_XDECREF(object_); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  PyObject* get() const { return object_; }
  explicit operator bool() const { return object_ != nullptr; }

 private:
  PyObject* object_;
};

// The pending Python exception as a Status (and cleared): ValueError and TypeError are
// InvalidArgument, RuntimeError FailedPrecondition, the rest Unknown; the message names `what`.
Status python_error(const std::string& what) {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  Ref type_ref(type), value_ref(value), traceback_ref(traceback);
  std::string name = type != nullptr ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "error";
  std::string text;
  if (value != nullptr) {
    Ref str(PyObject_Str(value));
    const char* utf8 = str ? PyUnicode_AsUTF8(str.get()) : nullptr;
    if (utf8 != nullptr) text = utf8;
    PyErr_Clear();
  }
  const std::string message = what + ": " + name + ": " + text;
  if (type != nullptr &&
      (PyErr_GivenExceptionMatches(type, PyExc_ValueError) || PyErr_GivenExceptionMatches(type, PyExc_TypeError))) {
    return errors::InvalidArgument(message);
  }
  if (type != nullptr && PyErr_GivenExceptionMatches(type, PyExc_RuntimeError)) {
    return errors::FailedPrecondition(message);
  }
  return errors::Unknown(message);
}

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

Status need_python(const char* op) {
  if (!Py_IsInitialized()) {
    return errors::FailedPrecondition(op, " calls Python, and this process has no Python interpreter: load and run "
                                          "the graph from Python (tf.saved_model.load)");
  }
  if (finalizing()) return errors::Cancelled(op, " calls Python, and the interpreter is shutting down");
  return Status();
}

// helper.<name>(*args) with the GIL held: a new reference, or nullptr with the exception pending.
PyObject* call_helper(const char* name, PyObject* args) {
  Ref module(PyImport_ImportModule(kHelper));
  if (!module) return nullptr;
  Ref fn(PyObject_GetAttrString(module.get(), name));
  if (!fn) return nullptr;
  return PyObject_CallObject(fn.get(), args);
}

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
    Gil gil;
    OP_REQUIRES_OK(ctx, run(ctx));
  }

 private:
  Status run(OpKernelContext* ctx) {
    const std::string what = "SokPyCall of " + function_;
    Ref inputs(PyList_New(ctx->num_inputs()));
    if (!inputs) return python_error(what);
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const Tensor& t = ctx->input(i);
      Ref shape(PyTuple_New(t.dims()));
      if (!shape) return python_error(what);
      for (int d = 0; d < t.dims(); ++d) PyTuple_SET_ITEM(shape.get(), d, PyLong_FromLongLong(t.dim_size(d)));
      char* data = const_cast<char*>(static_cast<const char*>(t.tensor_data().data()));
      Ref view(PyMemoryView_FromMemory(data, static_cast<Py_ssize_t>(t.TotalBytes()), PyBUF_READ));
      if (!view) return python_error(what);
      PyObject* spec = Py_BuildValue("(OsO)", view.get(), numpy_name(t.dtype()), shape.get());
      if (spec == nullptr) return python_error(what);
      PyList_SET_ITEM(inputs.get(), i, spec);  // steals spec
    }
    Ref dtypes(PyList_New(out_types_.size()));
    if (!dtypes) return python_error(what);
    for (size_t i = 0; i < out_types_.size(); ++i) {
      PyList_SET_ITEM(dtypes.get(), i, PyUnicode_FromString(numpy_name(out_types_[i])));
    }
    Ref args(Py_BuildValue("(ssOO)", function_.c_str(), context_.c_str(), inputs.get(), dtypes.get()));
    if (!args) return python_error(what);
    Ref results(call_helper("kernel_call", args.get()));
    if (!results) return python_error(what);
    if (!PyList_Check(results.get()) || PyList_GET_SIZE(results.get()) != static_cast<Py_ssize_t>(out_types_.size())) {
      return errors::Internal(what, ": ", kHelper, ".kernel_call returned no list of ", out_types_.size(), " arrays");
    }
    for (size_t i = 0; i < out_types_.size(); ++i) {
      TF_RETURN_IF_ERROR(write_output(ctx, static_cast<int>(i), PyList_GET_ITEM(results.get(), i), what));
    }
    return Status();
  }

  // Output i from a C-contiguous array of its dtype (the helper made it so; checked again here).
  Status write_output(OpKernelContext* ctx, int i, PyObject* array, const std::string& what) {
    Py_buffer view;
    if (PyObject_GetBuffer(array, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return python_error(what);
    TensorShape shape;
    Status status;
    for (int d = 0; d < view.ndim && status.ok(); ++d) status = shape.AddDimWithStatus(view.shape[d]);
    Tensor* out = nullptr;
    if (status.ok() && view.itemsize != static_cast<Py_ssize_t>(::tensorflow::DataTypeSize(out_types_[i]))) {
      status = errors::Internal(what, ": result ", i, " has items of ", view.itemsize, " bytes, its dtype ",
                                numpy_name(out_types_[i]), " ", ::tensorflow::DataTypeSize(out_types_[i]));
    }
    if (status.ok()) status = ctx->allocate_output(i, shape, &out);
    if (status.ok() && view.len != static_cast<Py_ssize_t>(out->TotalBytes())) {
      status = errors::Internal(what, ": result ", i, " has ", view.len, " bytes for shape ", shape.DebugString());
    }
    if (status.ok() && view.len > 0) std::memcpy(const_cast<char*>(out->tensor_data().data()), view.buf, view.len);
    PyBuffer_Release(&view);
    return status;
  }

  std::string function_;
  std::string context_;
  std::vector<DataType> out_types_;
};

bool live(int64_t address) {
  const auto* ref = reinterpret_cast<const sok_table_ref*>(static_cast<intptr_t>(address));
  return ref != nullptr && ref->magic == SOK_TABLE_REF_MAGIC;
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
