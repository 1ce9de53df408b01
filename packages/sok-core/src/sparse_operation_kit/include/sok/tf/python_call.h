// Calling Python from TensorFlow kernels: the GIL, references, Python errors as Status, and
// call_into_outputs, which runs sparse_operation_kit.python_ops.kernel_call. Used by sok-core's
// libsok_tf_python.so (csrc/tf_ops/python_ops.cc) and by other packages' op libraries whose kernels
// call Python (sok-hps's ops of NVIDIA's HPS plugin), which get it from SokCoreConfig.cmake
// (SokCore_INCLUDE_DIR): shipped, not in csrc/, for them. Each library has its own copy (everything
// here is inline). Compile with TensorFlow's flags (sok_find_tensorflow) and Python's headers, and
// leave libpython unlinked: the interpreter that loads the library provides it.
#ifndef SOK_TF_PYTHON_CALL_H_
#define SOK_TF_PYTHON_CALL_H_

#include <Python.h>

#include <cstring>
#include <string>
#include <vector>

#include "sok/tf/calls.h"
#include "tensorflow/core/framework/op_kernel.h"

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
inline constexpr char kHelper[] = "sparse_operation_kit.python_ops";

// The NumPy name of a dtype the ops take (SOK_PY_TYPES), or nullptr.
inline const char* numpy_name(DataType dtype) {
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
inline Status python_error(const std::string& what) {
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

inline bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

inline Status need_python(const char* op) {
  if (!Py_IsInitialized()) {
    return errors::FailedPrecondition(op, " calls Python, and this process has no Python interpreter: load and run "
                                          "the graph from Python (tf.saved_model.load)");
  }
  if (finalizing()) return errors::Cancelled(op, " calls Python, and the interpreter is shutting down");
  return Status();
}

// helper.<name>(*args) with the GIL held: a new reference, or nullptr with the exception pending.
inline PyObject* call_helper(const char* name, PyObject* args) {
  Ref module(PyImport_ImportModule(kHelper));
  if (!module) return nullptr;
  Ref fn(PyObject_GetAttrString(module.get(), name));
  if (!fn) return nullptr;
  return PyObject_CallObject(fn.get(), args);
}

// Output i from a C-contiguous array of its dtype (the helper made it so; checked again here).
inline Status write_output(OpKernelContext* ctx, int i, DataType dtype, PyObject* array, const std::string& what) {
  Py_buffer view;
  if (PyObject_GetBuffer(array, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return python_error(what);
  TensorShape shape;
  Status status;
  for (int d = 0; d < view.ndim && status.ok(); ++d) status = shape.AddDimWithStatus(view.shape[d]);
  Tensor* out = nullptr;
  if (status.ok() && view.itemsize != static_cast<Py_ssize_t>(::tensorflow::DataTypeSize(dtype))) {
    status = errors::Internal(what, ": result ", i, " has items of ", view.itemsize, " bytes, its dtype ",
                              numpy_name(dtype), " ", ::tensorflow::DataTypeSize(dtype));
  }
  if (status.ok()) status = ctx->allocate_output(i, shape, &out);
  if (status.ok() && view.len != static_cast<Py_ssize_t>(out->TotalBytes())) {
    status = errors::Internal(what, ": result ", i, " has ", view.len, " bytes for shape ", shape.DebugString());
  }
  if (status.ok() && view.len > 0) std::memcpy(const_cast<char*>(out->tensor_data().data()), view.buf, view.len);
  PyBuffer_Release(&view);
  return status;
}

// function(context, *inputs) by sparse_operation_kit.python_ops.kernel_call, the GIL held: result i, of
// dtype out_types[i], becomes output i. `what` begins every error message.
inline Status call_into_outputs(OpKernelContext* ctx, const std::string& what, const std::string& function,
                                const std::string& context, const std::vector<const Tensor*>& inputs,
                                const std::vector<DataType>& out_types) {
  Ref specs(PyList_New(inputs.size()));
  if (!specs) return python_error(what);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = *inputs[i];
    Ref shape(PyTuple_New(t.dims()));
    if (!shape) return python_error(what);
    for (int d = 0; d < t.dims(); ++d) PyTuple_SET_ITEM(shape.get(), d, PyLong_FromLongLong(t.dim_size(d)));
    char* data = const_cast<char*>(static_cast<const char*>(t.tensor_data().data()));
    Ref view(PyMemoryView_FromMemory(data, static_cast<Py_ssize_t>(t.TotalBytes()), PyBUF_READ));
    if (!view) return python_error(what);
    PyObject* spec = Py_BuildValue("(OsO)", view.get(), numpy_name(t.dtype()), shape.get());
    if (spec == nullptr) return python_error(what);
    PyList_SET_ITEM(specs.get(), i, spec);  // steals spec
  }
  Ref dtypes(PyList_New(out_types.size()));
  if (!dtypes) return python_error(what);
  for (size_t i = 0; i < out_types.size(); ++i) {
    PyList_SET_ITEM(dtypes.get(), i, PyUnicode_FromString(numpy_name(out_types[i])));
  }
  Ref args(Py_BuildValue("(ssOO)", function.c_str(), context.c_str(), specs.get(), dtypes.get()));
  if (!args) return python_error(what);
  Ref results(call_helper("kernel_call", args.get()));
  if (!results) return python_error(what);
  if (!PyList_Check(results.get()) || PyList_GET_SIZE(results.get()) != static_cast<Py_ssize_t>(out_types.size())) {
    return errors::Internal(what, ": ", kHelper, ".kernel_call returned no list of ", out_types.size(), " arrays");
  }
  for (size_t i = 0; i < out_types.size(); ++i) {
    TF_RETURN_IF_ERROR(write_output(ctx, static_cast<int>(i), out_types[i], PyList_GET_ITEM(results.get(), i), what));
  }
  return Status();
}

}  // namespace sok_tf_python

#endif  // SOK_TF_PYTHON_CALL_H_
