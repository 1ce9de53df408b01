// The online updates (update_files.hpp, update_source.hpp) in hierarchical_parameter_server._serving,
// which updates.py is a thin layer over: read_update, stage_update and check_update_name (and
// write_update, the C++ writer's whole write, for the tests); the
// UpdateSource class (sok::hps::DirectoryUpdateSource with Python callbacks); UpdateFileError and
// UpdateIncomplete (ValueErrors, which updates.py exports); the format's constants.
//
// The GIL: a source's file reading, waiting and locking run without it; its callbacks (apply, the
// log, the clock, read_into: the arrays the rows are read into) take it. Every binding call that
// takes the source's lock releases the GIL first, since the loop's thread holds that lock while it
// waits for the GIL.
//
// Interpreter exit: updates.py runs the loop in a daemon threading.Thread (start's `launch`), as it
// did before. A daemon thread that wants the GIL while the interpreter finalizes is ended by Python
// with pthread_exit, which unwinds the C++ frames as an exception no handler may swallow. So here:
// the GIL is taken and given back by with_gil and without_gil, which give nothing back when the
// thread is being ended (an RAII guard's destructor would, and abort the process); the callbacks
// hold raw references while Python code runs (leaked if the thread ends there, as Python leaks a
// daemon thread's frames); no destructor takes the GIL (a reference dropped on a thread without it
// is queued and released by the next call that holds it); a Python error crosses the C++ source as
// a PythonError, which holds its exception so; and a callback refuses to start once the
// interpreter finalizes.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cxxabi.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <type_traits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "py_str.hpp"
#include "update_files.hpp"
#include "update_source.hpp"

namespace py = pybind11;
using sok::hps::DirectoryUpdateSource;
using sok::hps::py_fs_str;
using sok::hps::Update;

namespace {

// _serving.UpdateFileError and UpdateIncomplete, made once by bind_update_source.
PyObject* update_file_error = nullptr;
PyObject* update_incomplete = nullptr;

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() || !Py_IsInitialized();
#else
  return _Py_IsFinalizing() || !Py_IsInitialized();
#endif
}

// The Python references dropped on threads without the GIL, released by the next release_dropped().
std::mutex dropped_mutex;
std::vector<PyObject*> dropped;

// Releases the dropped references; the caller holds the GIL.
void release_dropped() {
  std::vector<PyObject*> now;
  {
    std::lock_guard<std::mutex> lock(dropped_mutex);
    now.swap(dropped);
  }
  for (PyObject* object : now) Py_DECREF(object);
}

// Drops `objects` now where this thread holds the GIL, else queues them (never takes the GIL).
void drop(std::initializer_list<py::object*> objects) {
  if (PyGILState_Check()) {
    for (py::object* object : objects) *object = py::object();
    return;
  }
  std::lock_guard<std::mutex> lock(dropped_mutex);
  for (py::object* object : objects) {
    if (*object) dropped.push_back(object->release().ptr());
  }
}

// A Python object that C++ holds, dropped as drop() says.
std::shared_ptr<py::object> hold(py::object object) {
  return std::shared_ptr<py::object>(new py::object(std::move(object)), [](py::object* held) {
    drop({held});
    delete held;
  });
}

// A Python exception raised in a callback, crossing the C++ source: what() is "<type>: <str>".
class PythonError : public std::runtime_error {
 public:
  PythonError(const std::string& what, std::shared_ptr<py::object> value)
      : std::runtime_error(what), value_(std::move(value)) {}
  const py::object& value() const { return *value_; }

 private:
  std::shared_ptr<py::object> value_;
};

// The C++ text of a str: UTF-8, a surrogate as its 3-byte code (as py_fs_str reads it back); "" and
// no error where it is none.
std::string text_of(PyObject* text) {
  PyObject* bytes = text != nullptr && PyUnicode_Check(text) ? PyUnicode_AsEncodedString(text, "utf-8", "surrogatepass")
                                                             : nullptr;
  if (bytes == nullptr) {
    PyErr_Clear();
    return "";
  }
  std::string out(PyBytes_AS_STRING(bytes), static_cast<size_t>(PyBytes_GET_SIZE(bytes)));
  Py_DECREF(bytes);
  return out;
}

// type(error).__name__ and str(error) of a normalized exception; the caller holds the GIL.
std::pair<std::string, std::string> describe(PyObject* error) {
  PyObject* name = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(error)), "__name__");
  std::string type = text_of(name);
  Py_XDECREF(name);
  PyObject* str = PyObject_Str(error);
  std::string message = text_of(str);
  Py_XDECREF(str);
  PyErr_Clear();
  return {type, message};
}

// The pending Python error as a PythonError; the caller holds the GIL.
PythonError fetch_python_error() {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr) PyException_SetTraceback(value, traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  const auto [name, message] = describe(value);
  return PythonError(name + ": " + message, hold(py::reinterpret_steal<py::object>(value)));
}

// body() with the GIL taken by this thread: what it throws is passed on (a Python error as a
// PythonError) after the GIL is given back; nothing is given back where Python ends the thread.
// Throws std::runtime_error, taking nothing, where the interpreter finalizes.
template <class Body>
auto with_gil(Body body) -> decltype(body()) {
  if (finalizing()) throw std::runtime_error("the Python interpreter is shutting down");
  const PyGILState_STATE state = PyGILState_Ensure();
  std::exception_ptr error;
  try {
    release_dropped();
    if constexpr (std::is_void_v<decltype(body())>) {
      body();
      PyGILState_Release(state);
      return;
    } else {
      auto result = body();
      PyGILState_Release(state);
      return result;
    }
  } catch (abi::__forced_unwind&) {  // Python ends this thread
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
    error = std::make_exception_ptr(fetch_python_error());
  } catch (...) {
    error = std::current_exception();
  }
  PyGILState_Release(state);
  std::rethrow_exception(error);
}

// body() with the GIL given back by this thread, which holds it; taken back after (but where Python
// ends the thread meanwhile).
template <class Body>
auto without_gil(Body body) -> decltype(body()) {
  PyThreadState* thread = PyEval_SaveThread();
  try {
    if constexpr (std::is_void_v<decltype(body())>) {
      body();
      PyEval_RestoreThread(thread);
      return;
    } else {
      auto result = body();
      PyEval_RestoreThread(thread);
      return result;
    }
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    PyEval_RestoreThread(thread);
    throw;
  }
}

// The arrays of an update's rows, from read_into: what Update::rows owns in this binding.
struct PyRows {
  py::object keys;
  py::object values;
};

// A path as os.fsencode gives it (str, bytes or os.PathLike).
std::string fs_path(const py::object& path) {
  return py::module_::import("os").attr("fsencode")(path).cast<std::string>();
}

// `array` (a borrowed reference) is an array of T of `shape`, C-contiguous and writeable.
template <class T>
bool array_fits(PyObject* array, std::initializer_list<py::ssize_t> shape) {
  const auto handle = py::handle(array);
  if (!py::array_t<T>::check_(handle)) return false;
  const auto a = py::reinterpret_borrow<py::array>(handle);
  return a.ndim() == static_cast<py::ssize_t>(shape.size()) && std::equal(shape.begin(), shape.end(), a.shape()) &&
         (a.flags() & py::array::c_style) != 0 && a.writeable();
}

// The RowAllocator of read_into(count, dim) -> (keys, values): NumPy's memory, filled without the GIL.
sok::hps::RowAllocator rows_from(py::object read_into) {
  return [read_into = hold(std::move(read_into))](uint64_t count, uint32_t dim) {
    return with_gil([&] {
      PyObject* arrays = PyObject_CallFunction(read_into->ptr(), "KI", static_cast<unsigned long long>(count),
                                               static_cast<unsigned int>(dim));
      if (arrays == nullptr) throw fetch_python_error();
      const auto n = static_cast<py::ssize_t>(count);
      if (!PyTuple_Check(arrays) || PyTuple_GET_SIZE(arrays) != 2 ||
          !array_fits<int64_t>(PyTuple_GET_ITEM(arrays, 0), {n}) ||
          !array_fits<float>(PyTuple_GET_ITEM(arrays, 1), {n, static_cast<py::ssize_t>(dim)})) {
        Py_DECREF(arrays);
        throw py::type_error("read_into(count, dim) must return a tuple (keys, values) of NumPy arrays int64 [count] "
                             "and float32 [count, dim], C-contiguous and writeable; count " +
                             std::to_string(count) + ", dim " + std::to_string(dim));
      }
      auto rows = std::shared_ptr<PyRows>(
          new PyRows{py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(arrays, 0)),
                     py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(arrays, 1))},
          [](PyRows* held) {
            drop({&held->keys, &held->values});
            delete held;
          });
      Py_DECREF(arrays);
      sok::hps::UpdateRows out;
      out.keys = static_cast<int64_t*>(py::reinterpret_borrow<py::array>(rows->keys).mutable_data());
      out.values = static_cast<float*>(py::reinterpret_borrow<py::array>(rows->values).mutable_data());
      out.owner = std::move(rows);
      return out;
    });
  };
}

// updates.Update's fields: (tag, keys, values, path, sequence, version, checksum, writer), a new
// reference; the rows are the arrays read_into gave (every update of this binding is read with
// rows_from). The caller holds the GIL.
PyObject* update_fields(const Update& update) {
  const auto* rows = static_cast<const PyRows*>(update.rows.get());
  return py::make_tuple(sok::hps::py_str(update.tag), rows->keys, rows->values, py_fs_str(update.path),
                        update.sequence, update.version, update.checksum, update.writer)
      .release()
      .ptr();
}

// The Python exception of a failed poll, for the log line's exc_info: a new reference (None where
// there is none). The caller holds the GIL.
PyObject* python_error(const std::exception_ptr& error) {
  if (!error) return Py_NewRef(Py_None);
  try {
    std::rethrow_exception(error);
  } catch (const PythonError& e) {
    return Py_NewRef(e.value().ptr());
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetObject(PyExc_RuntimeError, py_fs_str(e.what()).ptr());
  }
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  return value;
}

// The LogSink of log(level, message, error): updates.py's logger (error: the exc_info, or None).
// A line logged while the interpreter finalizes is dropped.
sok::hps::LogSink log_to(py::object log) {
  return [log = hold(std::move(log))](sok::hps::LogLevel level, const std::string& message,
                                      const std::exception_ptr& error) {
    if (finalizing()) return;
    try {
      with_gil([&] {
        PyObject* text = py_fs_str(message).release().ptr();
        PyObject* exception = python_error(error);
        PyObject* result = PyObject_CallFunction(log->ptr(), "iOO", static_cast<int>(level), text, exception);
        Py_DECREF(text);
        Py_DECREF(exception);
        if (result == nullptr) PyErr_WriteUnraisable(log->ptr());
        Py_XDECREF(result);
      });
    } catch (const std::runtime_error&) {  // with_gil refused: the interpreter finalizes
    }
  };
}

sok::hps::Clock clock_of(py::object clock) {
  return [clock = hold(std::move(clock))] {
    return with_gil([&] {
      PyObject* now = PyObject_CallNoArgs(clock->ptr());
      const double seconds = now == nullptr ? -1.0 : PyFloat_AsDouble(now);
      Py_XDECREF(now);
      if (seconds == -1.0 && PyErr_Occurred()) throw fetch_python_error();
      return seconds;
    });
  };
}

// The Apply of apply(fields): a ValueError refuses the update (UpdateRejected), any other error is
// retried under its Python type's name. The rows' references are dropped here, with the GIL, once
// apply returns (the source reads nothing of an update's rows after apply).
DirectoryUpdateSource::Apply apply_of(py::object apply) {
  return [apply = hold(std::move(apply))](const Update& update) {
    with_gil([&] {
      PyObject* fields = update_fields(update);
      PyObject* result = PyObject_CallOneArg(apply->ptr(), fields);
      Py_DECREF(fields);
      auto* rows = static_cast<PyRows*>(update.rows.get());
      drop({&rows->keys, &rows->values});
      if (result != nullptr) {
        Py_DECREF(result);
        return;
      }
      const bool refused = PyErr_ExceptionMatches(PyExc_ValueError);
      const PythonError error = fetch_python_error();
      const std::string message = error.what();
      const size_t colon = message.find(": ");
      if (refused) throw sok::hps::UpdateRejected(message.substr(colon + 2));
      throw sok::hps::ForeignError(message.substr(0, colon), message.substr(colon + 2));
    });
  };
}

// The Launch of launch(loop): the loop runs in the thread launch makes, without the GIL. start()
// calls it with the GIL held (the binding's start keeps it).
DirectoryUpdateSource::Launch launch_of(const py::object& launch) {
  if (launch.is_none()) return nullptr;
  return [launch](std::function<void()> loop) {
    launch(py::cpp_function([loop = std::move(loop)] { without_gil(loop); }));
  };
}

using Keys = py::array_t<int64_t, py::array::c_style>;
using Values = py::array_t<float, py::array::c_style>;

// write(directory, model, table, keys, values, n, dim) (stage_update or write_update) without the GIL.
template <class Write>
auto write_rows(Write write, const py::object& directory, const std::string& model, const std::string& table,
                const Keys& keys, const Values& values) {
  if (keys.ndim() != 1 || values.ndim() != 2 || values.shape(0) != keys.shape(0)) {
    throw py::value_error("an update needs keys int64 [n] and values float32 [n, dim]");
  }
  const std::string folder = fs_path(directory);
  return without_gil([&] {
    return write(folder, model, table, keys.data(), values.data(), static_cast<uint64_t>(keys.shape(0)),
                 static_cast<uint64_t>(values.shape(1)));
  });
}

// _serving.UpdateSource: the C++ source is destroyed without the GIL (a loop of its own thread may
// need the GIL to end).
struct PyUpdateSource {
  std::unique_ptr<DirectoryUpdateSource> source;

  ~PyUpdateSource() {
    without_gil([&] { source.reset(); });
    release_dropped();  // what the source held of Python's, where this was its last owner
  }
};

PyObject* new_error(const char* name, const char* doc, PyObject* base) {
  PyObject* error = PyErr_NewExceptionWithDoc(name, doc, base, nullptr);
  if (error == nullptr) throw py::error_already_set();
  return error;
}

}  // namespace

void bind_update_source(py::module_& m) {
  update_file_error = new_error("hierarchical_parameter_server.updates.UpdateFileError",
                                "An update file that cannot be applied: the message names the file and what is wrong.",
                                PyExc_ValueError);
  update_incomplete = new_error("hierarchical_parameter_server.updates.UpdateIncomplete",
                                "An update file shorter than its header says: truncated, or still being copied in.",
                                update_file_error);
  m.add_object("UpdateFileError", py::handle(update_file_error));
  m.add_object("UpdateIncomplete", py::handle(update_incomplete));
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const sok::hps::UpdateIncomplete& e) {
      PyErr_SetObject(update_incomplete, py_fs_str(e.what()).ptr());
    } catch (const sok::hps::UpdateFileError& e) {
      PyErr_SetObject(update_file_error, py_fs_str(e.what()).ptr());
    } catch (const PythonError& e) {  // raised by a callback: raised again as it was
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.value().ptr())), e.value().ptr());
    }
  });

  m.attr("UPDATE_MAGIC") = sok::hps::kUpdateMagic;
  m.attr("UPDATE_FORMAT_VERSION") = sok::hps::kUpdateFormatVersion;
  m.attr("UPDATE_SUFFIX") = sok::hps::kUpdateSuffix;
  m.attr("UPDATE_REJECTED_FOLDER") = sok::hps::kRejectedFolder;
  m.attr("UPDATE_MAX_TAG_BYTES") = sok::hps::kMaxTagBytes;
  m.attr("UPDATE_CHUNK_BYTES") = sok::hps::kUpdateChunkBytes;

  m.def(
      "check_update_name",
      [](const std::string& what, const py::object& name) {
        if (!py::isinstance<py::str>(name)) {
          throw py::value_error(sok::hps::update_name_error(what.c_str(), py::repr(name).cast<std::string>()));
        }
        sok::hps::check_update_name(what.c_str(), text_of(name.ptr()));
      },
      py::arg("what"), py::arg("name"),
      "ValueError where name (of a 'model' or 'table') is not a str of NAME_PATTERN.");
  m.def(
      "read_update",
      [](const py::object& path, py::object read_into) {
        const std::string file = fs_path(path);
        const sok::hps::RowAllocator allocate = rows_from(std::move(read_into));
        const Update update = without_gil([&] { return sok::hps::read_update(file, allocate); });
        release_dropped();
        return py::reinterpret_steal<py::tuple>(update_fields(update));
      },
      py::arg("path"), py::arg("read_into"),
      "updates.Update's fields of the update file at path, its rows read into read_into(count, dim)'s arrays "
      "without the GIL; UpdateIncomplete, UpdateFileError or OSError where it cannot be read.");
  m.def(
      "stage_update",
      [](const py::object& directory, const std::string& model, const std::string& table, const Keys& keys,
         const Values& values) {
        const sok::hps::StagedUpdate staged = write_rows(sok::hps::stage_update, directory, model, table, keys, values);
        return py::make_tuple(py_fs_str(staged.temporary), py_fs_str(staged.path));
      },
      py::arg("directory"), py::arg("model"), py::arg("table"), py::arg("keys"), py::arg("values"),
      "The update of keys (int64 [n]) and values (float32 [n, dim]) written without the GIL under a temporary "
      "name in directory (made when missing): (temporary, path), to be renamed into place.");
  m.def(
      "write_update",
      [](const py::object& directory, const std::string& model, const std::string& table, const Keys& keys,
         const Values& values) {
        return py_fs_str(write_rows(sok::hps::write_update, directory, model, table, keys, values));
      },
      py::arg("directory"), py::arg("model"), py::arg("table"), py::arg("keys"), py::arg("values"),
      "The C++ writer's whole write (stage_update, then the rename), as a C++ process writes an update: its path.");

  py::class_<PyUpdateSource>(m, "UpdateSource",
                             "sok::hps::DirectoryUpdateSource (update_source.hpp): what updates.DirectoryUpdateSource "
                             "runs on.")
      .def(py::init([](const py::object& directory, double poll_interval_s, const py::iterable& model_filters,
                       double incomplete_timeout_s, py::object log, py::object clock, py::object read_into) {
             const std::string folder = fs_path(directory);
             sok::hps::UpdateSourceOptions options;
             options.poll_interval_s = poll_interval_s;
             options.incomplete_timeout_s = incomplete_timeout_s;
             options.model_filters.clear();
             for (const py::handle pattern : model_filters) {
               if (!py::isinstance<py::str>(pattern)) {
                 throw py::type_error("model_filters must be strs (regular expressions), got " +
                                      py::repr(pattern).cast<std::string>());
               }
               options.model_filters.push_back(text_of(pattern.ptr()));
             }
             if (!log.is_none()) options.log = log_to(std::move(log));
             if (!clock.is_none()) options.clock = clock_of(std::move(clock));
             options.allocate = rows_from(std::move(read_into));
             auto made = std::make_unique<PyUpdateSource>();
             try {
               made->source = std::make_unique<DirectoryUpdateSource>(folder, std::move(options));
             } catch (const sok::hps::ModelFilterError& e) {  // re.compile's exception
               const py::object type = e.type() == "error" ? py::module_::import("re").attr("error")
                                                           : py::module_::import("builtins").attr(e.type().c_str());
               PyErr_SetObject(type.ptr(), py_fs_str(e.what()).ptr());
               throw py::error_already_set();
             }
             return made;
           }),
           py::arg("directory"), py::arg("poll_interval_s"), py::arg("model_filters"), py::arg("incomplete_timeout_s"),
           py::arg("log"), py::arg("clock"), py::arg("read_into"),
           "The source of directory (made when missing). log(level, message, error) gets each line (None: stderr), "
           "clock() the time in seconds (None: a steady clock), read_into(count, dim) gives the arrays of each "
           "update's rows.")
      .def(
          "poll",
          [](PyUpdateSource& self) {
            const std::vector<Update> updates = without_gil([&] { return self.source->poll(); });
            release_dropped();
            py::list out;
            for (const Update& update : updates) out.append(py::reinterpret_steal<py::object>(update_fields(update)));
            return out;
          },
          "updates.Update's fields of each new update, in order, each taken as applied.")
      .def_property_readonly(
          "unapplied",
          [](const PyUpdateSource& self) {
            const auto unapplied = without_gil([&] { return self.source->unapplied(); });
            py::dict out;
            for (const auto& [name, why] : unapplied) out[py_fs_str(name)] = py_fs_str(why);
            return out;
          },
          "The files apply refused: name -> why.")
      .def(
          "start",
          [](PyUpdateSource& self, py::object apply, const py::object& launch) {
            self.source->start(apply_of(std::move(apply)), launch_of(launch));
          },
          py::arg("apply"), py::arg("launch") = py::none(),
          "Apply each update (apply(fields)) in a loop, run by launch(loop) in the thread it makes (None: a C++ "
          "thread of the source's own); RuntimeError where the source runs already.")
      .def(
          "stop",
          [](PyUpdateSource& self, double timeout_s) {
            const bool ended = without_gil([&] { return self.source->stop(timeout_s); });
            release_dropped();
            return ended;
          },
          py::arg("timeout_s") = 30.0,
          "Stop the loop, waiting at most timeout_s (without the GIL); False (and an error line) where it has not "
          "ended then.");
}
