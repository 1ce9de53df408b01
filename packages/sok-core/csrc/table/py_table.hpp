// sok::PyTable: a storage of any backend, driven through the backend's sok_storage_api function
// table (the same path the TensorFlow ops take, so the Python tests exercise exactly the ABI). It
// is sparse_operation_kit._table.Table (module.cpp), compiled once in sok-core for every backend.
//
// Intake: this binding only turns Python objects into (pointer, count) pairs: the dtype, C order,
// shape, writability and device of each array (NumPy for CPU tables; __cuda_array_interface__ or
// __dlpack__ for CUDA tables, read here and nowhere else), and the matching lengths of the arrays
// of one call. The semantic checks (counts, column ranges, initializers, scores against the policy,
// the execution context's device) belong to the backend's ABI adapter (sok/kit/abi_adapter.hpp);
// conversions of other dtypes and lists belong to sparse_operation_kit.storage.
#ifndef SOK_TABLE_PY_TABLE_HPP_
#define SOK_TABLE_PY_TABLE_HPP_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "sok/kit/error.hpp"
#include "sok/storage_api.h"

#ifdef SOK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sok {
namespace py = pybind11;

// (kind, col_begin, col_end, a, b, seed), as sparse_operation_kit.initializers produces them.
using InitTuple = std::tuple<int, int, int, double, double, uint64_t>;

// The sok_initializer array of initializer tuples.
inline std::vector<sok_initializer> to_inits(const std::vector<InitTuple>& inits) {
  std::vector<sok_initializer> out;
  for (const auto& t : inits) {
    sok_initializer i{};
    i.kind = std::get<0>(t);
    i.col_begin = std::get<1>(t);
    i.col_end = std::get<2>(t);
    i.a = std::get<3>(t);
    i.b = std::get<4>(t);
    i.seed = std::get<5>(t);
    out.push_back(i);
  }
  return out;
}

// The DLPack structs this file reads (dlpack.h, v0.8; the ABI every framework exports).
struct DLDevice {
  int32_t device_type;  // 1 CPU, 2 CUDA, 3 CUDA host, 13 CUDA managed
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// One array argument, borrowed for the call: a NumPy array (CPU tables) or a device array given
// through __cuda_array_interface__ or __dlpack__ (CUDA tables).
struct ArrayArg {
  void* data = nullptr;
  int ndim = 0;
  int64_t shape[2] = {0, 0};
  char kind = 0;  // 'i', 'u', 'f' or 'b'
  int itemsize = 0;
  bool writable = true;
  bool contiguous = true;
  py::object owner;                 // keeps the producer's object alive
  std::shared_ptr<void> dl_owner;   // calls the DLPack deleter at the end of the call
  int64_t elements() const { return ndim == 0 ? 1 : (ndim == 1 ? shape[0] : shape[0] * shape[1]); }
  std::string dtype_name() const { return std::string(1, kind) + std::to_string(itemsize * 8); }
};

class PyTable {
 public:
  PyTable(const sok_storage_api* api, const std::string& key_dtype, int row_width,
          const std::map<std::string, std::string>& options, const std::string& device)
      : api_(api), row_width_(row_width) {
    key_type_ = parse_key_dtype(key_dtype);
    parse_device(device);
    std::vector<const char*> names, values;
    for (const auto& kv : options) {
      names.push_back(kv.first.c_str());
      values.push_back(kv.second.c_str());
    }
    sok_storage_config config{};
    config.struct_size = sizeof(config);
    config.key_type = key_type_;
    config.row_width = row_width;
    config.device_type = device_type_;
    config.device_id = device_id_;
    config.num_options = static_cast<int32_t>(names.size());
    config.option_names = names.data();
    config.option_values = values.data();
    sok_storage* handle = nullptr;
    sok_status st = api_->create(&config, &handle);
    if (st != SOK_OK) raise(st, api_->last_error(nullptr));
    handle_ = handle;
  }
  ~PyTable() {
    if (handle_ != nullptr) api_->destroy(handle_);
  }
  PyTable(const PyTable&) = delete;
  PyTable& operator=(const PyTable&) = delete;

  int row_width() const { return row_width_; }
  std::string key_dtype() const { return key_dtype_name(key_type_); }
  std::string device() const {
    return device_type_ == SOK_DEVICE_CPU ? "cpu" : "cuda:" + std::to_string(device_id_);
  }

  int64_t size(intptr_t stream) {
    auto ctx = context(stream);
    int64_t out = 0;
    call([&] { return api_->size(handle_, &ctx, &out); });
    return out;
  }
  int64_t capacity(intptr_t stream) {
    context(stream);  // checks the stream; the slot count is host state
    int64_t out = 0;
    call([&] { return api_->capacity(handle_, &out); });
    return out;
  }

  void find(py::object keys, int cb, int ce, py::object values, py::object default_row, py::object found,
            intptr_t stream) {
    auto ctx = context(stream);
    ArrayArg k = keys_arg(keys, "keys", ctx);
    const int64_t n = k.shape[0];
    ArrayArg v = floats_arg(values, n, ce - cb, "values", true, ctx);
    ArrayArg f = bytes_arg(found, n, "found", ctx);
    const float* def = nullptr;
    ArrayArg d;
    if (!default_row.is_none()) {
      d = floats_arg(default_row, -1, ce - cb, "default_row", false, ctx);
      def = static_cast<const float*>(d.data);
    }
    call([&] {
      return api_->find(handle_, &ctx, n, k.data, cb, ce, static_cast<float*>(v.data), def,
                        static_cast<uint8_t*>(f.data));
    });
  }

  // find that leaves the rows of missing keys in values unwritten (the C ABI's find_hits).
  void find_hits(py::object keys, int cb, int ce, py::object values, py::object found, intptr_t stream) {
    require(sok_storage_api_has(api_, find_hits), "find_hits", " or use find");
    auto ctx = context(stream);
    ArrayArg k = keys_arg(keys, "keys", ctx);
    const int64_t n = k.shape[0];
    ArrayArg v = floats_arg(values, n, ce - cb, "values", true, ctx);
    ArrayArg f = bytes_arg(found, n, "found", ctx);
    call([&] {
      return api_->find_hits(handle_, &ctx, n, k.data, cb, ce, static_cast<float*>(v.data),
                             static_cast<uint8_t*>(f.data));
    });
  }

  void find_or_insert(py::object keys, int cb, int ce, py::object values, py::object found, py::object scores,
                      const std::vector<InitTuple>& inits, intptr_t stream) {
    auto ctx = context(stream);
    ArrayArg k = keys_arg(keys, "keys", ctx);
    const int64_t n = k.shape[0];
    ArrayArg v = floats_arg(values, n, ce - cb, "values", true, ctx);
    ArrayArg f = bytes_arg(found, n, "found", ctx);
    ArrayArg sc = scores_arg(scores, n, ctx);
    auto in = to_inits(inits);
    call([&] {
      return api_->find_or_insert(handle_, &ctx, n, k.data, cb, ce, static_cast<float*>(v.data),
                                  static_cast<uint8_t*>(f.data), static_cast<const uint64_t*>(sc.data), in.data(),
                                  static_cast<int32_t>(in.size()));
    });
  }

  void insert_or_assign(py::object keys, int cb, int ce, py::object values, py::object scores,
                        const std::vector<InitTuple>& inits, intptr_t stream) {
    write(api_->insert_or_assign, keys, cb, ce, values, scores, inits, stream);
  }
  // insert_or_assign with the caller's promises about its keys (sok_hint bits). A backend built
  // without insert_or_assign_hinted gets insert_or_assign: a hint only allows shortcuts, so
  // dropping it never changes a result.
  void insert_or_assign_hinted(py::object keys, int cb, int ce, py::object values, py::object scores,
                               const std::vector<InitTuple>& inits, uint32_t hints, intptr_t stream) {
    if ((hints & ~SOK_HINTS_ALL) != 0) {
      throw py::value_error(sok::unknown_hints(hints));
    }
    if (!sok_storage_api_has(api_, insert_or_assign_hinted)) {
      write(api_->insert_or_assign, keys, cb, ce, values, scores, inits, stream);
      return;
    }
    const auto hinted = [this, hints](sok_storage* s, const sok_exec_context* c, int64_t n, const void* k, int32_t b,
                                      int32_t e, const float* v, const uint64_t* sc, const sok_initializer* in,
                                      int32_t ni) {
      return api_->insert_or_assign_hinted(s, c, n, k, b, e, v, sc, in, ni, hints);
    };
    write(hinted, keys, cb, ce, values, scores, inits, stream);
  }
  void accum_or_assign(py::object keys, int cb, int ce, py::object values, py::object scores,
                       const std::vector<InitTuple>& inits, intptr_t stream) {
    write(api_->accum_or_assign, keys, cb, ce, values, scores, inits, stream);
  }

  int64_t erase(py::object keys, intptr_t stream) {
    auto ctx = context(stream);
    ArrayArg k = keys_arg(keys, "keys", ctx);
    int64_t erased = 0;
    call([&] { return api_->erase(handle_, &ctx, k.shape[0], k.data, &erased); });
    return erased;
  }

  int64_t export_batch(int64_t offset, int64_t limit, int cb, int ce, py::object keys, py::object values,
                       py::object scores, std::optional<uint64_t> threshold, intptr_t stream) {
    auto ctx = context(stream);
    ArrayArg k = keys_arg(keys, "keys", ctx);
    if (k.shape[0] < limit || !k.writable) {
      throw py::value_error("the keys output must be writable and hold " + std::to_string(limit) + " keys");
    }
    ArrayArg v, s;
    if (!values.is_none()) v = floats_arg(values, limit, ce - cb, "values", true, ctx);
    if (!scores.is_none()) s = u64_arg(scores, limit, "scores", true, ctx);
    int64_t count = 0;
    call([&] {
      if (threshold) {
        return api_->export_if(handle_, &ctx, *threshold, offset, limit, cb, ce, k.data, static_cast<float*>(v.data),
                               static_cast<uint64_t*>(s.data), &count);
      }
      return api_->export_batch(handle_, &ctx, offset, limit, cb, ce, k.data, static_cast<float*>(v.data),
                                static_cast<uint64_t*>(s.data), &count);
    });
    return count;
  }

  int64_t insert_and_evict(py::object keys, int cb, int ce, py::object values, py::object scores,
                           const std::vector<InitTuple>& inits, py::object evicted_keys, py::object evicted_values,
                           py::object evicted_scores, intptr_t stream) {
    auto ctx = context(stream);
    ArrayArg k = keys_arg(keys, "keys", ctx);
    const int64_t n = k.shape[0];
    ArrayArg v = floats_arg(values, n, ce - cb, "values", false, ctx);
    ArrayArg sc = scores_arg(scores, n, ctx);
    ArrayArg ek = keys_arg(evicted_keys, "evicted_keys", ctx);
    if (ek.shape[0] < n || !ek.writable) {
      throw py::value_error("evicted_keys must be writable and hold " + std::to_string(n) + " keys");
    }
    ArrayArg ev = floats_arg(evicted_values, n, row_width_, "evicted_values", true, ctx);
    ArrayArg es = u64_arg(evicted_scores, n, "evicted_scores", true, ctx);
    auto in = to_inits(inits);
    int64_t m = 0;
    call([&] {
      return api_->insert_and_evict(handle_, &ctx, n, k.data, cb, ce, static_cast<const float*>(v.data),
                                    static_cast<const uint64_t*>(sc.data), in.data(), static_cast<int32_t>(in.size()),
                                    ek.data, static_cast<float*>(ev.data), static_cast<uint64_t*>(es.data), &m);
    });
    return m;
  }

  void import_batch(py::object keys, int cb, int ce, py::object values, py::object scores,
                    const std::vector<InitTuple>& inits, intptr_t stream) {
    if (!sok_storage_api_has(api_, import_batch)) {
      throw py::value_error("this backend was built without import_batch; rebuild it against this sok-core");
    }
    write(api_->import_batch, keys, cb, ce, values, scores, inits, stream);
  }
  // update_rows with a visitor that swaps each row's columns [cb, ce) with the key's row of
  // new_values (n, w), the old ones going to old_values (n, w): rows are visited only when every
  // key is present (found (n,) tells which are). Returns the number of missing keys.
  int64_t update_rows(py::object keys, int cb, int ce, py::object old_values, py::object new_values, py::object found,
                      py::object scores, intptr_t stream) {
    require(sok_storage_api_has(api_, update_rows), "update_rows", "");
    auto ctx = context(stream);
    ArrayArg k = keys_arg(keys, "keys", ctx);
    const int64_t n = k.shape[0];
    ArrayArg o = floats_arg(old_values, n, ce - cb, "old_values", true, ctx);
    ArrayArg v = floats_arg(new_values, n, ce - cb, "new_values", false, ctx);
    ArrayArg f = bytes_arg(found, n, "found", ctx);
    ArrayArg sc = scores_arg(scores, n, ctx);
    RowSwap swap{static_cast<const float*>(v.data), static_cast<float*>(o.data), ce - cb};
    int64_t missing = 0;
    call([&] {
      return api_->update_rows(handle_, &ctx, n, k.data, cb, ce, static_cast<const uint64_t*>(sc.data),
                               &RowSwap::visit, &swap, static_cast<uint8_t*>(f.data), &missing);
    });
    return missing;
  }
  void clear(intptr_t stream) {
    auto ctx = context(stream);
    call([&] { return api_->clear(handle_, &ctx); });
  }
  void set_global_epoch(uint64_t epoch, intptr_t stream) {
    context(stream);
    call([&] { return api_->set_global_epoch(handle_, epoch); });
  }
  std::string describe(intptr_t stream) {
    context(stream);
    char buffer[512];
    call([&] { return api_->describe(handle_, buffer, sizeof(buffer)); });
    return buffer;
  }

  // A capsule holding the sok_storage* of this table (for the TF ops and tools). The table must
  // outlive every user of the capsule.
  py::capsule handle_capsule() { return py::capsule(handle_, SOK_STORAGE_HANDLE_CAPSULE_NAME); }

 private:
  // The visitor of update_rows above: row i goes to out, in's row i takes its place.
  struct RowSwap {
    const float* in;
    float* out;
    int width;
    static void visit(void* self, int64_t i, float* row) {
      const auto* s = static_cast<const RowSwap*>(self);
      std::memcpy(s->out + i * s->width, row, sizeof(float) * s->width);
      std::memcpy(row, s->in + i * s->width, sizeof(float) * s->width);
    }
  };

  // fn: a write of the C ABI's signature (insert_or_assign, accum_or_assign, or one with hints bound).
  template <class WriteFn>
  void write(const WriteFn& fn, py::object keys, int cb, int ce, py::object values, py::object scores,
             const std::vector<InitTuple>& inits, intptr_t stream) {
    auto ctx = context(stream);
    ArrayArg k = keys_arg(keys, "keys", ctx);
    const int64_t n = k.shape[0];
    ArrayArg v = floats_arg(values, n, ce - cb, "values", false, ctx);
    ArrayArg sc = scores_arg(scores, n, ctx);
    auto in = to_inits(inits);
    call([&] {
      return fn(handle_, &ctx, n, k.data, cb, ce, static_cast<const float*>(v.data),
                static_cast<const uint64_t*>(sc.data), in.data(), static_cast<int32_t>(in.size()));
    });
  }

  template <class Fn>
  void call(Fn&& fn) {
    sok_status st;
    {
      py::gil_scoped_release release;
      st = fn();
    }
    if (st != SOK_OK) raise(st, api_->last_error(handle_));
  }

  [[noreturn]] static void raise(sok_status st, const char* message) {
    std::string msg = message ? message : "unknown error";
    switch (st) {
      case SOK_ERROR_INVALID_ARGUMENT: throw py::value_error(msg);
      case SOK_ERROR_OUT_OF_MEMORY:  // a MemoryError with the backend's message, not a bare std::bad_alloc
        PyErr_SetString(PyExc_MemoryError, msg.c_str());
        throw py::error_already_set();
      case SOK_ERROR_UNSUPPORTED:
        PyErr_SetString(PyExc_NotImplementedError, msg.c_str());
        throw py::error_already_set();
      default: throw std::runtime_error(msg);
    }
  }

  void parse_device(const std::string& device) {
    if (device == "cpu") {
      device_type_ = SOK_DEVICE_CPU;
      device_id_ = 0;
      return;
    }
    const std::string prefix = "cuda";
    bool ok = device.compare(0, prefix.size(), prefix) == 0;
    int id = 0;
    if (ok && device.size() > prefix.size()) {
      const std::string rest = device.substr(prefix.size());
      ok = rest.size() > 1 && rest[0] == ':' && rest.find_first_not_of("0123456789", 1) == std::string::npos &&
           rest.size() < 8;
      if (ok) id = std::stoi(rest.substr(1));
    }
    if (!ok) throw py::value_error("device '" + device + "' is not valid; valid: 'cpu', 'cuda' or 'cuda:N'");
    device_type_ = SOK_DEVICE_CUDA;
    device_id_ = id;
  }

  // NotImplementedError unless the backend's API table has the optional function `name` (appended
  // after the backend was built).
  static void require(bool present, const char* name, const char* alternative) {
    if (present) return;
    const std::string msg = std::string("this backend was built without ") + name +
                            "; rebuild it against this sok-core" + alternative;
    PyErr_SetString(PyExc_NotImplementedError, msg.c_str());
    throw py::error_already_set();
  }

  sok_exec_context context(intptr_t stream) const {
    if (device_type_ == SOK_DEVICE_CPU && stream != 0) {
      throw py::value_error("stream=" + std::to_string(stream) + " was given but the table is on the CPU; pass stream=0");
    }
    return sok_exec_context{device_type_, device_id_, reinterpret_cast<void*>(stream)};
  }

  // -- array arguments ---------------------------------------------------------------------------
  ArrayArg array_arg(py::object obj, const char* what, const sok_exec_context& ctx) const {
    const bool is_numpy = py::isinstance<py::array>(obj);
    if (device_type_ == SOK_DEVICE_CPU) {
      if (!is_numpy) {
        const bool device_array = py::hasattr(obj, "__cuda_array_interface__") || py::hasattr(obj, "__dlpack__");
        throw py::value_error(std::string(what) + (device_array
                                                       ? " is a device array but the table is on the CPU; pass a NumPy array"
                                                       : " must be a NumPy array, got " +
                                                             std::string(py::str(py::type::of(obj).attr("__name__")))));
      }
      py::array a = py::reinterpret_borrow<py::array>(obj);
      ArrayArg r;
      r.data = a.ndim() >= 0 ? const_cast<void*>(a.data()) : nullptr;
      r.ndim = static_cast<int>(a.ndim());
      if (r.ndim > 2) throw py::value_error(std::string(what) + " has " + std::to_string(r.ndim) + " dimensions");
      for (int i = 0; i < r.ndim; ++i) r.shape[i] = a.shape(i);
      r.kind = a.dtype().kind();
      r.itemsize = static_cast<int>(a.itemsize());
      r.writable = a.writeable();
      r.contiguous = (a.flags() & py::array::c_style) != 0;
      r.owner = obj;
      return r;
    }
    if (is_numpy) {
      throw py::value_error(std::string(what) + " is a host (NumPy) array but the table is on " + device() +
                            "; pass a device array (CuPy, Torch, ...) on that GPU");
    }
    // The interface is read once: CuPy builds a new dict on every access.
    py::object cai = py::getattr(obj, "__cuda_array_interface__", py::none());
    if (!cai.is_none()) return cai_arg(obj, cai, what, ctx);
    if (py::hasattr(obj, "__dlpack__")) return dlpack_arg(obj, what, ctx);
    throw py::value_error(std::string(what) + " must be a device array with __cuda_array_interface__ or __dlpack__ "
                          "(CuPy, Torch, ...), got " + std::string(py::str(py::type::of(obj).attr("__name__"))));
  }

  ArrayArg cai_arg(py::object obj, py::dict cai, const char* what, const sok_exec_context& ctx) const {
    ArrayArg r;
    r.owner = obj;
    py::tuple shape = cai["shape"];
    r.ndim = static_cast<int>(shape.size());
    if (r.ndim > 2) throw py::value_error(std::string(what) + " has " + std::to_string(r.ndim) + " dimensions");
    for (int i = 0; i < r.ndim; ++i) r.shape[i] = shape[i].cast<int64_t>();
    const std::string typestr = cai["typestr"].cast<std::string>();
    if (typestr.size() < 3 || typestr[0] == '>') {
      throw py::value_error(std::string(what) + " has an unsupported typestr '" + typestr + "'");
    }
    r.kind = typestr[1];
    r.itemsize = std::stoi(typestr.substr(2));
    py::tuple data = cai["data"];
    r.data = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
    r.writable = !data[1].cast<bool>();
    if (cai.contains("mask") && !cai["mask"].is_none()) {
      throw py::value_error(std::string(what) + " is a masked array; pass a plain one");
    }
    r.contiguous = true;
    if (cai.contains("strides") && !cai["strides"].is_none()) {
      py::tuple strides = cai["strides"];
      int64_t expect = r.itemsize;
      for (int i = r.ndim - 1; i >= 0; --i) {
        if (r.shape[i] > 1 && strides[i].cast<int64_t>() != expect) r.contiguous = false;
        expect *= r.shape[i];
      }
    }
    check_device_pointer(r, what);
    if (cai.contains("stream") && !cai["stream"].is_none()) wait_for_producer(cai["stream"].cast<intptr_t>(), ctx);
    return r;
  }

  ArrayArg dlpack_arg(py::object obj, const char* what, const sok_exec_context& ctx) const {
    // The producer makes its data ready on our stream (DLPack: 1 = the legacy default stream).
    const intptr_t stream = ctx.stream == nullptr ? 1 : reinterpret_cast<intptr_t>(ctx.stream);
    py::capsule cap = obj.attr("__dlpack__")(py::arg("stream") = stream);
    if (std::string(cap.name() ? cap.name() : "") != "dltensor") {
      throw py::value_error(std::string(what) + ": __dlpack__ returned a capsule that is not an unused 'dltensor'");
    }
    auto* managed = static_cast<DLManagedTensor*>(cap.get_pointer());
    if (PyCapsule_SetName(cap.ptr(), "used_dltensor") != 0) throw py::error_already_set();
    ArrayArg r;
    r.owner = obj;
    r.dl_owner = std::shared_ptr<void>(managed, [](void* p) {
      auto* m = static_cast<DLManagedTensor*>(p);
      if (m->deleter != nullptr) m->deleter(m);
    });
    const DLTensor& t = managed->dl_tensor;
    if (t.device.device_type != 2 && t.device.device_type != 13) {
      throw py::value_error(std::string(what) + " is not on a CUDA device (DLPack device type " +
                            std::to_string(t.device.device_type) + ") but the table is on " + device());
    }
    if (t.device.device_id != device_id_) {
      throw py::value_error(std::string(what) + " is on cuda:" + std::to_string(t.device.device_id) +
                            " but the table is on " + device());
    }
    r.ndim = t.ndim;
    if (r.ndim > 2) throw py::value_error(std::string(what) + " has " + std::to_string(r.ndim) + " dimensions");
    for (int i = 0; i < r.ndim; ++i) r.shape[i] = t.shape[i];
    static const char kinds[] = {'i', 'u', 'f', '?', '?', '?', 'b'};
    r.kind = t.dtype.code < 7 ? kinds[t.dtype.code] : '?';
    r.itemsize = t.dtype.bits / 8;
    if (t.dtype.lanes != 1) r.kind = '?';
    r.data = static_cast<char*>(t.data) + t.byte_offset;
    r.contiguous = true;
    if (t.strides != nullptr) {
      int64_t expect = 1;
      for (int i = r.ndim - 1; i >= 0; --i) {
        if (r.shape[i] > 1 && t.strides[i] != expect) r.contiguous = false;
        expect *= r.shape[i];
      }
    }
    return r;
  }

  void check_device_pointer(const ArrayArg& r, const char* what) const {
#ifdef SOK_WITH_CUDA
    if (r.data == nullptr || r.elements() == 0) return;
    cudaPointerAttributes attrs{};
    if (cudaPointerGetAttributes(&attrs, r.data) != cudaSuccess) {
      cudaGetLastError();
      throw py::value_error(std::string(what) + ": its pointer is not CUDA memory");
    }
    if (attrs.type != cudaMemoryTypeDevice && attrs.type != cudaMemoryTypeManaged) {
      throw py::value_error(std::string(what) + " is not in device memory but the table is on " + device());
    }
    if (attrs.device != device_id_) {
      throw py::value_error(std::string(what) + " is on cuda:" + std::to_string(attrs.device) +
                            " but the table is on " + device());
    }
#else
    (void)r;
    (void)what;
#endif
  }

  // __cuda_array_interface__ v3: the producer's stream (1 legacy default, 2 per-thread default,
  // else a cudaStream_t) must finish writing before the call's stream reads.
  void wait_for_producer(intptr_t producer, const sok_exec_context& ctx) const {
#ifdef SOK_WITH_CUDA
    cudaStream_t theirs = producer == 1 ? cudaStreamLegacy
                          : producer == 2 ? cudaStreamPerThread
                                          : reinterpret_cast<cudaStream_t>(producer);
    cudaStream_t ours = ctx.stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(ctx.stream);
    if (theirs == ours) return;
    cudaEvent_t ready;
    if (cudaEventCreateWithFlags(&ready, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(ready, theirs) != cudaSuccess || cudaStreamWaitEvent(ours, ready, 0) != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error("could not order the call's stream after the array producer's stream");
    }
    cudaEventDestroy(ready);
#else
    (void)producer;
    (void)ctx;
#endif
  }

  ArrayArg keys_arg(py::object obj, const char* what, const sok_exec_context& ctx) const {
    ArrayArg a = array_arg(obj, what, ctx);
    const char want_kind = key_type_ == SOK_KEY_UINT64 ? 'u' : 'i';
    const int want_size = key_type_ == SOK_KEY_INT32 ? 4 : 8;
    if (a.ndim != 1 || !a.contiguous || a.kind != want_kind || a.itemsize != want_size) {
      throw py::value_error(std::string(what) + " must be a 1-D C-contiguous " + key_dtype_name(key_type_) +
                            " array, got " + a.dtype_name() + " with " + std::to_string(a.ndim) + " dimensions" +
                            (a.contiguous ? "" : " (not contiguous)"));
    }
    return a;
  }
  ArrayArg floats_arg(py::object obj, int64_t rows, int cols, const char* what, bool out,
                      const sok_exec_context& ctx) const {
    ArrayArg a = array_arg(obj, what, ctx);
    const bool shape_ok = rows < 0 ? (a.ndim == 1 && a.shape[0] == cols)
                                   : (a.ndim == 2 && a.shape[0] == rows && a.shape[1] == cols);
    if (!shape_ok || !a.contiguous || a.kind != 'f' || a.itemsize != 4 || (out && !a.writable)) {
      throw py::value_error(std::string(what) + " must be a " + (out ? "writable " : "") +
                            "C-contiguous float32 array of shape (" + (rows < 0 ? "" : std::to_string(rows) + ", ") +
                            std::to_string(cols) + ")");
    }
    return a;
  }
  ArrayArg bytes_arg(py::object obj, int64_t n, const char* what, const sok_exec_context& ctx) const {
    ArrayArg a = array_arg(obj, what, ctx);
    if (a.ndim != 1 || a.shape[0] != n || !a.contiguous || a.itemsize != 1 || !a.writable) {
      throw py::value_error(std::string(what) + " must be a writable 1-D bool or uint8 array of length " +
                            std::to_string(n));
    }
    return a;
  }
  ArrayArg u64_arg(py::object obj, int64_t n, const char* what, bool out, const sok_exec_context& ctx) const {
    ArrayArg a = array_arg(obj, what, ctx);
    if (a.ndim != 1 || a.shape[0] < n || !a.contiguous || a.kind != 'u' || a.itemsize != 8 || (out && !a.writable)) {
      throw py::value_error(std::string(what) + " must be a 1-D uint64 array of length " + std::to_string(n));
    }
    return a;
  }
  ArrayArg scores_arg(py::object obj, int64_t n, const sok_exec_context& ctx) const {
    if (obj.is_none()) return ArrayArg{};
    return u64_arg(obj, n, "scores", false, ctx);
  }

  static int32_t parse_key_dtype(const std::string& name) {
    if (name == "int64") return SOK_KEY_INT64;
    if (name == "uint64") return SOK_KEY_UINT64;
    if (name == "int32") return SOK_KEY_INT32;
    throw py::value_error("key_dtype '" + name + "' is not supported; valid: int64, uint64, int32");
  }
  static std::string key_dtype_name(int32_t t) {
    return t == SOK_KEY_INT32 ? "int32" : (t == SOK_KEY_UINT64 ? "uint64" : "int64");
  }


  const sok_storage_api* api_;
  sok_storage* handle_ = nullptr;
  int32_t key_type_;
  int row_width_;
  int32_t device_type_ = SOK_DEVICE_CPU;
  int32_t device_id_ = 0;
};

// The CUDA devices this process sees (0 in CPU builds).
inline int cuda_device_count() {
#ifdef SOK_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

}  // namespace sok

#endif  // SOK_TABLE_PY_TABLE_HPP_
