// The Python binding of model_files.hpp, in hierarchical_parameter_server._serving: open_table,
// TableSource and ModelFileError (a ValueError) as model_files.py has them, for the tests that hold
// the two readers equal (tests/test_model_files_cpp.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <iterator>
#include <string>

#include "checkpoint_directory.hpp"
#include "checkpoint_format.hpp"
#include "checkpoint_manifest.hpp"
#include "model_files.hpp"
#include "py_errors.hpp"

namespace py = pybind11;
using sok::hps::ModelFileError;
using sok::hps::TableChunks;
using sok::hps::TableSource;

namespace {

// _serving.ModelFileError, made once by bind_model_files (it lives as long as the interpreter).
PyObject* model_file_error = nullptr;

// A message as a str: the bytes of a file name that are not UTF-8 as os.fsdecode reads them.
py::str message(const char* what) {
  PyObject* out = PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)), "surrogateescape");
  if (out == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(out);
}

// A path as os.fsencode gives it (str, bytes or os.PathLike).
std::string fs_path(const py::object& path) {
  return py::module_::import("os").attr("fsencode")(path).cast<std::string>();
}

// model_files.TableSource.chunks: (int64 [n], float32 [n, dim]) fresh arrays per chunk.
class ChunkIterator {
 public:
  ChunkIterator(TableChunks chunks, int64_t dim) : chunks_(std::move(chunks)), dim_(dim) {}

  py::tuple next() {
    const int64_t n = chunks_.next_size();
    py::array_t<int64_t> keys(n);
    py::array_t<float> rows({n, dim_});
    int64_t copied = 0;
    {
      py::gil_scoped_release released;
      copied = chunks_.next(keys.mutable_data(), rows.mutable_data());
    }
    if (copied == 0) throw py::stop_iteration();
    return py::make_tuple(std::move(keys), std::move(rows));
  }

 private:
  TableChunks chunks_;
  int64_t dim_;
};

template <size_t N>
py::tuple names(const char* const (&items)[N]) {
  py::tuple out(N);
  for (size_t i = 0; i < N; ++i) out[i] = py::str(items[i]);
  return out;
}

// The C++ constants that mirror Python ones, under the Python names, for a test that compares them.
py::dict mirrored_constants() {
  namespace ckpt = sok::hps::checkpoint;
  py::dict out, index_dtype, index_itemsize;
  for (size_t i = 0; i < std::size(ckpt::kIndexDtype); ++i) {
    index_dtype[py::int_(i)] = ckpt::kIndexDtype[i];
    index_itemsize[py::int_(i)] = ckpt::kIndexItemsize[i];
  }
  out["format.HEADER_BYTES"] = ckpt::kHeaderBytes;
  out["format.FILE_KEY"] = ckpt::kFileKey;
  out["format.FILE_WEIGHT"] = ckpt::kFileWeight;
  out["format.FILE_STATE"] = ckpt::kFileState;
  out["format.INDEX_DTYPE"] = index_dtype;
  out["format.INDEX_DTYPE itemsize"] = index_itemsize;
  out["format.KEY_FILE_DTYPES"] = names(ckpt::kKeyFileDtypes);
  out["format.key_file('t')"] = ckpt::key_file("t");
  out["format.weight_file('t')"] = ckpt::weight_file("t");
  out["format.FORMAT_VERSION"] = ckpt::kFormatVersion;
  out["format.MANIFEST"] = ckpt::kManifest;
  out["format.TABLE_KINDS"] = names(ckpt::kTableKinds);
  out["dtypes.STATIC_ROW_DTYPES"] = names(ckpt::kRowDtypes);
  out["directory.READ_ATTEMPTS"] = ckpt::kReadAttempts;
  out["directory.STAGING_MARK"] = ckpt::kStagingMark;
  out["directory.STAGING_INFIX"] = ckpt::kStagingInfix;
  out["directory.LOCK_SUFFIX"] = ckpt::kLockSuffix;
  out["directory._LOCK_POLL_S"] = ckpt::kLockPollS;
  out["directory._LOCK_POLL_MAX_S"] = ckpt::kLockPollMaxS;
  out["model_files.KEY_FILE"] = sok::hps::kKeyFile;
  out["model_files.VECTOR_FILE"] = sok::hps::kVectorFile;
  return out;
}

}  // namespace

void bind_model_files(py::module_& m) {
  model_file_error = PyErr_NewExceptionWithDoc(
      "hierarchical_parameter_server._serving.ModelFileError",
      "A table's files cannot be served: the message names the file, what is wrong and how to fix it.",
      PyExc_ValueError, nullptr);
  if (model_file_error == nullptr) throw py::error_already_set();
  m.add_object("ModelFileError", py::handle(model_file_error));
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const ModelFileError& e) {
      PyErr_SetObject(model_file_error, message(e.what()).ptr());
    } catch (const sok::hps::OsError& e) {
      const auto os_error = py::reinterpret_borrow<py::object>(PyExc_OSError);
      const py::object error = e.filename().empty()
                                   ? os_error(e.code(), std::strerror(e.code()))
                                   : os_error(e.code(), std::strerror(e.code()), message(e.filename().c_str()));
      PyErr_SetObject(PyExc_OSError, error.ptr());
    }
  });

  py::class_<ChunkIterator>(m, "TableChunks")
      .def("__iter__", [](ChunkIterator& self) -> ChunkIterator& { return self; })
      .def("__next__", &ChunkIterator::next);

  py::class_<TableSource>(m, "TableSource", "The rows of one table on disk (model_files.TableSource).")
      .def_property_readonly("path", [](const TableSource& t) { return message(t.path().c_str()); })
      .def_property_readonly("rows", &TableSource::rows)
      .def_property_readonly("dim", &TableSource::dim)
      .def_property_readonly("format", &TableSource::format)
      .def_property_readonly(
          "keys",
          [](py::object self) {
            const auto& keys = self.cast<const TableSource&>().keys();
            py::array_t<int64_t> out(static_cast<py::ssize_t>(keys.size()), keys.data(), self);
            out.attr("flags").attr("writeable") = false;
            return out;
          },
          "Every key of the table, int64 [rows] in file order (read-only).")
      .def("verify", &TableSource::verify, py::call_guard<py::gil_scoped_release>(),
           "Check a checkpoint's weight file against the manifest's checksum (ModelFileError if not).")
      .def(
          "chunks",
          [](const TableSource& t, int64_t chunk_rows) { return ChunkIterator(t.chunks(chunk_rows), t.dim()); },
          py::arg("chunk_rows"), "The rows in file order, chunk_rows at a time: (int64 [n], float32 [n, dim]).");

  m.attr("MIRRORED_CONSTANTS") = mirrored_constants();
  m.def(
      "open_table",
      [](const py::object& path, int64_t dim) {
        const std::string file = fs_path(path);
        py::gil_scoped_release released;
        return sok::hps::open_table(file, dim);
      },
      py::arg("path"), py::arg("dim"),
      "Open one table of sparse_files and check its files (model_files.open_table); ModelFileError if not.");
}
