// C++ helpers for writing a storage backend against sok/storage_api.h.
//
// A backend derives from sok::Storage, implements its virtual operations on validated arguments,
// and gets the whole C function table from sok::make_storage_api<Impl>(): argument checks, error
// codes and messages, and exception safety live here once, for every backend.
#ifndef SOK_BACKEND_HPP_
#define SOK_BACKEND_HPP_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "sok/storage_api.h"
#include "sok/worker_pool.hpp"

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>
#endif

// Functions shared by host code and CUDA kernels (the initializers' random stream).
#if defined(__CUDACC__)
#define SOK_HD __host__ __device__
#else
#define SOK_HD
#endif

namespace sok {

// An error that crosses the ABI as (status, message).
class Error : public std::runtime_error {
 public:
  Error(sok_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  sok_status status() const { return status_; }

 private:
  sok_status status_;
};

[[noreturn]] inline void fail(sok_status status, const std::string& message) {
  throw Error(status, message);
}
[[noreturn]] inline void invalid(const std::string& message) {
  fail(SOK_ERROR_INVALID_ARGUMENT, message);
}

inline const char* key_type_name(int32_t key_type) {
  switch (key_type) {
    case SOK_KEY_INT64: return "int64";
    case SOK_KEY_UINT64: return "uint64";
    case SOK_KEY_INT32: return "int32";
    default: return "unknown";
  }
}

inline size_t key_size(int32_t key_type) { return key_type == SOK_KEY_INT32 ? 4 : 8; }

// Keys are stored as 64-bit patterns: int32 keys are sign-extended, so every key value is valid.
inline uint64_t load_key(const void* keys, int32_t key_type, int64_t i) {
  if (key_type == SOK_KEY_INT32) {
    return static_cast<uint64_t>(static_cast<int64_t>(static_cast<const int32_t*>(keys)[i]));
  }
  return static_cast<const uint64_t*>(keys)[i];
}
inline void store_key(void* keys, int32_t key_type, int64_t i, uint64_t key) {
  if (key_type == SOK_KEY_INT32) {
    static_cast<int32_t*>(keys)[i] = static_cast<int32_t>(static_cast<int64_t>(key));
  } else {
    static_cast<uint64_t*>(keys)[i] = key;
  }
}

// splitmix64's finaliser: a bijective 64-bit mixer, used for hashing keys and for initializers.
SOK_HD inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

SOK_HD inline uint64_t hash_key(uint64_t key) { return mix64(key); }

// The random stream of initializers: a pure function of (seed, key, column, draw), defined once
// here and mirrored by sparse_operation_kit/initializers.py (the NumPy reference). CUDA builds
// compile it with --fmad=false so that device results equal the host's bit for bit. stream_base
// is the part of a row's stream that depends on (seed, key) only.
SOK_HD inline uint64_t stream_base(uint64_t seed, uint64_t key) { return mix64(key ^ mix64(seed)); }

SOK_HD inline double uniform01_at(uint64_t base, int32_t col, uint32_t draw) {
  const uint64_t r = mix64(base + ((static_cast<uint64_t>(col) << 8) | draw));
  return static_cast<double>(r >> 11) * 0x1.0p-53;
}

SOK_HD inline double uniform01(uint64_t seed, uint64_t key, int32_t col, uint32_t draw) {
  return uniform01_at(stream_base(seed, key), col, draw);
}

// A uniform initializer's value at column col of the row whose stream_base is base.
SOK_HD inline float uniform_value(const sok_initializer& init, uint64_t base, int32_t col) {
  return static_cast<float>(init.a + (init.b - init.a) * uniform01_at(base, col, 0));
}

SOK_HD inline double normal01(uint64_t seed, uint64_t key, int32_t col, uint32_t attempt) {
  double u1 = 1.0 - uniform01(seed, key, col, 2 * attempt);  // (0, 1]
  double u2 = uniform01(seed, key, col, 2 * attempt + 1);
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
}

constexpr uint32_t kTruncatedNormalAttempts = 64;

SOK_HD inline float init_value(const sok_initializer& init, uint64_t key, int32_t col) {
  switch (init.kind) {
    case SOK_INIT_CONSTANT: return static_cast<float>(init.a);
    case SOK_INIT_UNIFORM: return uniform_value(init, stream_base(init.seed, key), col);
    case SOK_INIT_NORMAL:
      return static_cast<float>(init.a + init.b * normal01(init.seed, key, col, 0));
    case SOK_INIT_TRUNCATED_NORMAL: {
      double z = 0.0;
      for (uint32_t t = 0; t < kTruncatedNormalAttempts; ++t) {
        z = normal01(init.seed, key, col, t);
        if (::fabs(z) <= 2.0) break;
      }
      z = z > 2.0 ? 2.0 : (z < -2.0 ? -2.0 : z);
      return static_cast<float>(init.a + init.b * z);
    }
    default: return 0.0f;  // rejected by validate_inits before any row is touched
  }
}

// A full new row of `width` floats for `key`: zeros, then each initializer over its columns.
inline void init_row(float* row, int32_t width, uint64_t key, const sok_initializer* inits,
                     int32_t num_inits) {
  std::fill(row, row + width, 0.0f);
  for (int32_t i = 0; i < num_inits; ++i) {
    const sok_initializer& init = inits[i];
    if (init.kind == SOK_INIT_CONSTANT) {
      std::fill(row + init.col_begin, row + init.col_end, static_cast<float>(init.a));
    } else if (init.kind == SOK_INIT_UNIFORM) {
      // The row's part of the stream computed once: "random", the default, fills new rows 3x
      // faster than one init_value per column (the same bits).
      const uint64_t base = stream_base(init.seed, key);
      for (int32_t c = init.col_begin; c < init.col_end; ++c) row[c] = uniform_value(init, base, c);
    } else {
      for (int32_t c = init.col_begin; c < init.col_end; ++c) row[c] = init_value(init, key, c);
    }
  }
}

// A number for messages ("%g"). Backends build text with std::string, never with iostreams: some
// toolchains link libstdc++ statically into the module, and their iostreams then crash for want of
// locale initialisation (seen with the GPU host's GCC).
inline std::string fmt(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", v);
  return buffer;
}

// Nanoseconds since the Unix epoch: the clock of LRU scores and of incremental dumps.
inline uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// How many of places (n,) equal `absent` (a probe's "not found"); found (n,), unless null, gets 1
// for the others and 0 for those.
inline int64_t mark_found(int64_t n, const int64_t* places, int64_t absent, uint8_t* found) {
  int64_t missing = 0;
  for (int64_t i = 0; i < n; ++i) missing += places[i] == absent;
  if (found != nullptr) {
    for (int64_t i = 0; i < n; ++i) found[i] = places[i] != absent;
  }
  return missing;
}

// Copies a row of w floats (the arrays do not overlap) inline, 16 bytes a step: rows are short
// (tens of floats), and a memmove call per row cost more than the copy itself (perf of a dynamic
// training step: memmove 20% of the samples, 4% once the row copies were inline). Written with
// SSE2 loads and stores because GCC turns a plain copy loop back into a memcpy call.
inline void copy_row(float* dst, const float* src, int64_t w) {
  int64_t c = 0;
#if defined(__SSE2__) && !defined(__CUDACC__)
  for (; c + 4 <= w; c += 4) _mm_storeu_ps(dst + c, _mm_loadu_ps(src + c));
#endif
  for (; c < w; ++c) dst[c] = src[c];
}

// What a CPU find writes for a missing key's row: the default row, zeros when there is none, or
// nothing at all (find_hits).
struct MissingRow {
  const float* default_row;
  bool write;

  void fill(float* out, int64_t w) const {
    if (!write) return;
    if (default_row != nullptr) {
      copy_row(out, default_row, w);
    } else {
      std::memset(out, 0, sizeof(float) * static_cast<size_t>(w));
    }
  }
};

// Threads used by bulk operations: the hardware threads, at most 16.
inline int num_workers() {
  static const int n = static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  return n;
}

// Runs fn(worker, begin, end) over [0, n) split in contiguous parts, in parallel when n is at
// least `min_parallel`: on the threads of the WorkerPool, or on threads made for this call while the
// pool is busy (another caller, or a parallel_for inside a parallel_for). Exceptions in workers are
// rethrown in the caller.
template <class Fn>
void parallel_for(int64_t n, int64_t min_parallel, Fn&& fn) {
  const int workers = num_workers();
  if (n < min_parallel || workers == 1) {
    fn(0, int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> errors(workers);
  const int64_t chunk = (n + workers - 1) / workers;
  const std::function<void(int)> job = [&](int w) {
    try {
      fn(w, std::min(n, w * chunk), std::min(n, (w + 1) * chunk));
    } catch (...) {
      errors[w] = std::current_exception();
    }
  };
  if (!WorkerPool::instance(workers - 1).try_run(workers, job)) {
    std::vector<std::thread> threads;
    for (int w = 1; w < workers; ++w) threads.emplace_back(job, w);
    job(0);
    for (auto& t : threads) t.join();
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Runs fn(worker, workers) on every worker (for loops partitioned by owner, e.g. row % workers).
template <class Fn>
void parallel_workers(int64_t n, int64_t min_parallel, Fn&& fn) {
  int workers = (n < min_parallel) ? 1 : num_workers();
  parallel_for(workers, 2, [&](int, int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) fn(static_cast<int>(w), workers);
  });
}

// Parsed backend options: name -> value, each consumed once; leftovers are an error.
class Options {
 public:
  explicit Options(const sok_storage_config& config) {
    for (int32_t i = 0; i < config.num_options; ++i) {
      if (config.option_names == nullptr || config.option_values == nullptr ||
          config.option_names[i] == nullptr || config.option_values[i] == nullptr) {
        invalid("option " + std::to_string(i) + " has a null name or value");
      }
      values_[config.option_names[i]] = config.option_values[i];
    }
  }
  // The integer option `name`, or `fallback` when absent.
  int64_t integer(const std::string& name, int64_t fallback) {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    std::string text = it->second;
    values_.erase(it);
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size()) invalid(name + "=" + quote(text) + " is not an integer");
    return v;
  }
  double real(const std::string& name, double fallback) {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    std::string text = it->second;
    values_.erase(it);
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size()) invalid(name + "=" + quote(text) + " is not a number");
    return v;
  }
  std::string text(const std::string& name, const std::string& fallback) {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    std::string v = it->second;
    values_.erase(it);
    return v;
  }
  // Call after reading every known option: unknown names are an error that lists the valid ones.
  void reject_unknown(const std::string& backend, const std::vector<std::string>& known) const {
    if (values_.empty()) return;
    std::string valid;
    for (const auto& k : known) valid += (valid.empty() ? "" : ", ") + k;
    invalid("unknown option " + quote(values_.begin()->first) + " for backend " + backend +
            "; valid options: " + (valid.empty() ? "(none)" : valid));
  }
  static std::string quote(const std::string& s) { return "'" + s + "'"; }

 private:
  std::map<std::string, std::string> values_;
};

// Arguments every operation shares, checked once by the ABI adapter.
struct Columns {
  int32_t begin;
  int32_t end;
  int32_t width() const { return end - begin; }
};

// The C++ face of a storage. All arguments are validated before these are called: counts are
// >= 0, pointers are non-null where needed, columns lie within the row, initializers are valid,
// and the execution context's device is one the backend accepted in `supports_device`.
class Storage {
 public:
  Storage(int32_t key_type, int32_t row_width) : key_type_(key_type), row_width_(row_width) {}
  virtual ~Storage() = default;
  int32_t key_type() const { return key_type_; }
  int32_t row_width() const { return row_width_; }

  virtual bool supports_device(int32_t device_type) const { return device_type == SOK_DEVICE_CPU; }
  // Whether callers may pass scores (custom/LFU policies); otherwise scores must be NULL.
  virtual bool accepts_scores() const { return false; }
  virtual bool requires_scores() const { return false; }

  virtual int64_t size(const sok_exec_context& ctx) = 0;
  virtual int64_t capacity() = 0;
  virtual void find(const sok_exec_context& ctx, int64_t n, const void* keys, Columns cols,
                    float* values, const float* default_row, uint8_t* found) = 0;
  virtual void find_or_insert(const sok_exec_context& ctx, int64_t n, const void* keys,
                              Columns cols, float* values, uint8_t* found, const uint64_t* scores,
                              const sok_initializer* inits, int32_t num_inits) = 0;
  virtual void insert_or_assign(const sok_exec_context& ctx, int64_t n, const void* keys,
                                Columns cols, const float* values, const uint64_t* scores,
                                const sok_initializer* inits, int32_t num_inits) = 0;
  virtual void accum_or_assign(const sok_exec_context& ctx, int64_t n, const void* keys,
                               Columns cols, const float* values, const uint64_t* scores,
                               const sok_initializer* inits, int32_t num_inits) = 0;
  virtual int64_t erase(const sok_exec_context& ctx, int64_t n, const void* keys) = 0;
  // threshold == nullptr exports every row.
  virtual int64_t export_batch(const sok_exec_context& ctx, int64_t offset, int64_t limit,
                               Columns cols, const uint64_t* threshold, void* keys, float* values,
                               uint64_t* scores) = 0;
  virtual int64_t insert_and_evict(const sok_exec_context& ctx, int64_t n, const void* keys,
                                   Columns cols, const float* values, const uint64_t* scores,
                                   const sok_initializer* inits, int32_t num_inits,
                                   void* evicted_keys, float* evicted_values,
                                   uint64_t* evicted_scores) = 0;
  // insert_or_assign storing `scores` as they are (never null here).
  virtual void import_batch(const sok_exec_context& ctx, int64_t n, const void* keys, Columns cols,
                            const float* values, const uint64_t* scores, const sok_initializer* inits,
                            int32_t num_inits) = 0;
  // update_rows of the C ABI: visits the rows of keys in place when every key is present, else
  // changes nothing; fills found (may be null) and returns the number of missing keys. Optional:
  // the default says the backend lacks it, and callers fall back to find_or_insert and
  // insert_or_assign.
  virtual int64_t update_rows(const sok_exec_context&, int64_t, const void*, Columns, const uint64_t*,
                              sok_row_visitor, void*, uint8_t*) {
    fail(SOK_ERROR_UNSUPPORTED, "this backend has no update_rows (in-place row updates); use find_or_insert "
                                "and insert_or_assign");
  }
  // find_hits of the C ABI: find that leaves the rows of missing keys unwritten. Optional: the
  // default says the backend lacks it, and callers use find.
  virtual void find_hits(const sok_exec_context&, int64_t, const void*, Columns, float*, uint8_t*) {
    fail(SOK_ERROR_UNSUPPORTED, "this backend has no find_hits (a find that leaves missing rows unwritten); use find");
  }
  virtual void clear(const sok_exec_context& ctx) = 0;
  virtual void set_global_epoch(uint64_t) {
    fail(SOK_ERROR_UNSUPPORTED, "this backend has no epoch-based eviction policy");
  }
  virtual std::string describe() = 0;

  std::string last_error;

 private:
  int32_t key_type_;
  int32_t row_width_;
};

namespace detail {

inline std::string& create_error() {
  thread_local std::string message;
  return message;
}

inline sok_storage* to_handle(Storage* s) { return reinterpret_cast<sok_storage*>(s); }
inline Storage* from_handle(sok_storage* h) { return reinterpret_cast<Storage*>(h); }

// Runs body, turning exceptions into a status and the storage's last_error.
template <class Body>
sok_status guarded(sok_storage* handle, Body&& body) {
  if (handle == nullptr) {
    create_error() = "the storage handle is null";
    return SOK_ERROR_INVALID_ARGUMENT;
  }
  Storage* s = from_handle(handle);
  try {
    body(*s);
    return SOK_OK;
  } catch (const Error& e) {
    s->last_error = e.what();
    return e.status();
  } catch (const std::bad_alloc&) {
    s->last_error = "out of memory";
    return SOK_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    s->last_error = std::string("internal error: ") + e.what();
    return SOK_ERROR_INTERNAL;
  } catch (...) {
    s->last_error = "internal error: unknown exception";
    return SOK_ERROR_INTERNAL;
  }
}

inline const sok_exec_context& check_ctx(const Storage& s, const sok_exec_context* ctx) {
  if (ctx == nullptr) invalid("the execution context is null");
  if (ctx->device_type != SOK_DEVICE_CPU && ctx->device_type != SOK_DEVICE_CUDA) {
    invalid("unknown device_type " + std::to_string(ctx->device_type) + "; valid: 0 (CPU), 1 (CUDA)");
  }
  if (!s.supports_device(ctx->device_type)) {
    fail(SOK_ERROR_UNSUPPORTED, std::string("this storage does not run on ") +
                                    (ctx->device_type == SOK_DEVICE_CPU ? "CPU" : "CUDA") +
                                    " arrays; it was built or created for another device");
  }
  if (ctx->device_type == SOK_DEVICE_CPU && ctx->stream != nullptr) {
    invalid("a CPU execution context must have a null stream");
  }
  return *ctx;
}

inline void check_count(int64_t n, const char* what) {
  if (n < 0) invalid(std::string(what) + " must be >= 0, got " + std::to_string(n));
}

inline void check_ptr(const void* p, int64_t n, const char* what) {
  if (n > 0 && p == nullptr) invalid(std::string(what) + " is null but the batch has " + std::to_string(n) + " keys");
}

inline Columns check_cols(const Storage& s, int32_t begin, int32_t end) {
  if (begin < 0 || end > s.row_width() || begin >= end) {
    invalid("column range [" + std::to_string(begin) + ", " + std::to_string(end) +
            ") is not a non-empty range within the row width " + std::to_string(s.row_width()));
  }
  return Columns{begin, end};
}

inline void check_scores(const Storage& s, const uint64_t* scores, int64_t n) {
  if (scores != nullptr && !s.accepts_scores()) {
    invalid("this storage's eviction policy computes scores itself; pass no scores");
  }
  if (scores == nullptr && s.requires_scores() && n > 0) {
    invalid("this storage's eviction policy (custom) needs a score for every key; pass scores");
  }
}

inline void check_inits(const Storage& s, const sok_initializer* inits, int32_t num_inits) {
  if (num_inits < 0) invalid("num_inits must be >= 0, got " + std::to_string(num_inits));
  if (num_inits > 0 && inits == nullptr) invalid("inits is null but num_inits > 0");
  for (int32_t i = 0; i < num_inits; ++i) {
    const sok_initializer& init = inits[i];
    if (init.kind < SOK_INIT_CONSTANT || init.kind > SOK_INIT_TRUNCATED_NORMAL) {
      invalid("initializer " + std::to_string(i) + " has unknown kind " + std::to_string(init.kind) +
              "; valid: 0 constant, 1 uniform, 2 normal, 3 truncated normal");
    }
    if (init.col_begin < 0 || init.col_end > s.row_width() || init.col_begin > init.col_end) {
      invalid("initializer " + std::to_string(i) + " covers columns [" + std::to_string(init.col_begin) +
              ", " + std::to_string(init.col_end) + ") outside the row width " +
              std::to_string(s.row_width()));
    }
    if (!std::isfinite(init.a) || !std::isfinite(init.b)) {
      invalid("initializer " + std::to_string(i) + " has a non-finite parameter");
    }
    if (init.kind == SOK_INIT_UNIFORM && !(init.a <= init.b)) {
      invalid("uniform initializer " + std::to_string(i) + " needs low <= high");
    }
    if ((init.kind == SOK_INIT_NORMAL || init.kind == SOK_INIT_TRUNCATED_NORMAL) && init.b < 0) {
      invalid("normal initializer " + std::to_string(i) + " needs stddev >= 0");
    }
  }
}

}  // namespace detail

// Makes a storage for a validated config; must consume its options (see Options::reject_unknown).
using StorageFactory = Storage* (*)(const sok_storage_config& config, Options& options);

// The C function table of a backend whose storages `Create` makes (for example one CPU class and,
// in CUDA builds, one CUDA class chosen by config.device_type). `name` must outlive the program
// (a literal).
template <StorageFactory Create>
const sok_storage_api* make_storage_api(const char* name) {
  using namespace detail;
  static const sok_storage_api api = [name] {
    sok_storage_api a{};
    a.api_version = SOK_STORAGE_API_VERSION;
    a.struct_size = sizeof(sok_storage_api);
    a.backend_name = name;
    a.create = [](const sok_storage_config* config, sok_storage** out) -> sok_status {
      try {
        if (config == nullptr || out == nullptr) invalid("config and out must not be null");
        if (config->struct_size < sizeof(sok_storage_config)) {
          invalid("sok_storage_config.struct_size is " + std::to_string(config->struct_size) +
                  ", expected at least " + std::to_string(sizeof(sok_storage_config)) +
                  "; rebuild the caller against this sok-core's storage_api.h");
        }
        if (config->key_type < SOK_KEY_INT64 || config->key_type > SOK_KEY_INT32) {
          invalid("unknown key_type " + std::to_string(config->key_type) +
                  "; valid: 0 int64, 1 uint64, 2 int32");
        }
        if (config->row_width < 1) invalid("row_width must be >= 1, got " + std::to_string(config->row_width));
        if (config->num_options < 0) invalid("num_options must be >= 0");
        Options options(*config);
        if (config->device_type != SOK_DEVICE_CPU && config->device_type != SOK_DEVICE_CUDA) {
          invalid("unknown device_type " + std::to_string(config->device_type) + "; valid: 0 (CPU), 1 (CUDA)");
        }
        if (config->device_id < 0) invalid("device_id must be >= 0, got " + std::to_string(config->device_id));
        *out = to_handle(Create(*config, options));
        return SOK_OK;
      } catch (const Error& e) {
        create_error() = e.what();
        return e.status();
      } catch (const std::bad_alloc&) {
        create_error() = "out of memory while creating the storage";
        return SOK_ERROR_OUT_OF_MEMORY;
      } catch (const std::exception& e) {
        create_error() = std::string("internal error: ") + e.what();
        return SOK_ERROR_INTERNAL;
      }
    };
    a.destroy = [](sok_storage* h) { delete from_handle(h); };
    a.last_error = [](const sok_storage* h) -> const char* {
      if (h == nullptr) return create_error().c_str();
      return reinterpret_cast<const Storage*>(h)->last_error.c_str();
    };
    a.size = [](sok_storage* h, const sok_exec_context* ctx, int64_t* out) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        if (out == nullptr) invalid("out is null");
        *out = s.size(c);
      });
    };
    a.capacity = [](sok_storage* h, int64_t* out) {
      return guarded(h, [&](Storage& s) {
        if (out == nullptr) invalid("out is null");
        *out = s.capacity();
      });
    };
    a.find = [](sok_storage* h, const sok_exec_context* ctx, int64_t n, const void* keys,
                int32_t cb, int32_t ce, float* values, const float* default_row, uint8_t* found) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(n, "n");
        check_ptr(keys, n, "keys");
        check_ptr(values, n, "values");
        s.find(c, n, keys, check_cols(s, cb, ce), values, default_row, found);
      });
    };
    a.find_or_insert = [](sok_storage* h, const sok_exec_context* ctx, int64_t n, const void* keys,
                          int32_t cb, int32_t ce, float* values, uint8_t* found,
                          const uint64_t* scores, const sok_initializer* inits, int32_t ni) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(n, "n");
        check_ptr(keys, n, "keys");
        check_ptr(values, n, "values");
        check_scores(s, scores, n);
        check_inits(s, inits, ni);
        s.find_or_insert(c, n, keys, check_cols(s, cb, ce), values, found, scores, inits, ni);
      });
    };
    a.insert_or_assign = [](sok_storage* h, const sok_exec_context* ctx, int64_t n,
                            const void* keys, int32_t cb, int32_t ce, const float* values,
                            const uint64_t* scores, const sok_initializer* inits, int32_t ni) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(n, "n");
        check_ptr(keys, n, "keys");
        check_ptr(values, n, "values");
        check_scores(s, scores, n);
        check_inits(s, inits, ni);
        s.insert_or_assign(c, n, keys, check_cols(s, cb, ce), values, scores, inits, ni);
      });
    };
    a.accum_or_assign = [](sok_storage* h, const sok_exec_context* ctx, int64_t n,
                           const void* keys, int32_t cb, int32_t ce, const float* values,
                           const uint64_t* scores, const sok_initializer* inits, int32_t ni) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(n, "n");
        check_ptr(keys, n, "keys");
        check_ptr(values, n, "values");
        check_scores(s, scores, n);
        check_inits(s, inits, ni);
        s.accum_or_assign(c, n, keys, check_cols(s, cb, ce), values, scores, inits, ni);
      });
    };
    a.erase = [](sok_storage* h, const sok_exec_context* ctx, int64_t n, const void* keys,
                 int64_t* num_erased) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(n, "n");
        check_ptr(keys, n, "keys");
        int64_t erased = s.erase(c, n, keys);
        if (num_erased != nullptr) *num_erased = erased;
      });
    };
    a.export_batch = [](sok_storage* h, const sok_exec_context* ctx, int64_t offset,
                        int64_t limit, int32_t cb, int32_t ce, void* keys, float* values,
                        uint64_t* scores, int64_t* count) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(offset, "offset");
        check_count(limit, "limit");
        check_ptr(keys, limit, "keys");
        if (count == nullptr) invalid("count is null");
        Columns cols = values == nullptr ? Columns{0, s.row_width()} : check_cols(s, cb, ce);
        *count = s.export_batch(c, offset, limit, cols, nullptr, keys, values, scores);
      });
    };
    a.export_if = [](sok_storage* h, const sok_exec_context* ctx, uint64_t threshold,
                     int64_t offset, int64_t limit, int32_t cb, int32_t ce, void* keys,
                     float* values, uint64_t* scores, int64_t* count) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(offset, "offset");
        check_count(limit, "limit");
        check_ptr(keys, limit, "keys");
        if (count == nullptr) invalid("count is null");
        Columns cols = values == nullptr ? Columns{0, s.row_width()} : check_cols(s, cb, ce);
        *count = s.export_batch(c, offset, limit, cols, &threshold, keys, values, scores);
      });
    };
    a.insert_and_evict = [](sok_storage* h, const sok_exec_context* ctx, int64_t n,
                            const void* keys, int32_t cb, int32_t ce, const float* values,
                            const uint64_t* scores, const sok_initializer* inits, int32_t ni,
                            void* ek, float* ev, uint64_t* es, int64_t* num_evicted) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(n, "n");
        check_ptr(keys, n, "keys");
        check_ptr(values, n, "values");
        check_ptr(ek, n, "evicted_keys");
        check_scores(s, scores, n);
        check_inits(s, inits, ni);
        int64_t m = s.insert_and_evict(c, n, keys, check_cols(s, cb, ce), values, scores, inits,
                                       ni, ek, ev, es);
        if (num_evicted != nullptr) *num_evicted = m;
      });
    };
    a.import_batch = [](sok_storage* h, const sok_exec_context* ctx, int64_t n, const void* keys,
                        int32_t cb, int32_t ce, const float* values, const uint64_t* scores,
                        const sok_initializer* inits, int32_t ni) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(n, "n");
        check_ptr(keys, n, "keys");
        check_ptr(values, n, "values");
        check_ptr(scores, n, "scores");
        check_inits(s, inits, ni);
        s.import_batch(c, n, keys, check_cols(s, cb, ce), values, scores, inits, ni);
      });
    };
    a.update_rows = [](sok_storage* h, const sok_exec_context* ctx, int64_t n, const void* keys, int32_t cb,
                       int32_t ce, const uint64_t* scores, sok_row_visitor visit, void* user_data, uint8_t* found,
                       int64_t* num_missing) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(n, "n");
        check_ptr(keys, n, "keys");
        if (visit == nullptr) invalid("visit is null; pass the function to call on each row");
        if (num_missing == nullptr) invalid("num_missing is null; pass where to write the number of missing keys");
        check_scores(s, scores, n);
        *num_missing = s.update_rows(c, n, keys, check_cols(s, cb, ce), scores, visit, user_data, found);
      });
    };
    a.find_hits = [](sok_storage* h, const sok_exec_context* ctx, int64_t n, const void* keys, int32_t cb, int32_t ce,
                     float* values, uint8_t* found) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(n, "n");
        check_ptr(keys, n, "keys");
        check_ptr(values, n, "values");
        s.find_hits(c, n, keys, check_cols(s, cb, ce), values, found);
      });
    };
    a.clear = [](sok_storage* h, const sok_exec_context* ctx) {
      return guarded(h, [&](Storage& s) { s.clear(check_ctx(s, ctx)); });
    };
    a.set_global_epoch = [](sok_storage* h, uint64_t epoch) {
      return guarded(h, [&](Storage& s) { s.set_global_epoch(epoch); });
    };
    a.describe = [](sok_storage* h, char* buffer, int64_t buffer_size) {
      return guarded(h, [&](Storage& s) {
        if (buffer == nullptr || buffer_size < 1) invalid("buffer is null or empty");
        std::string d = s.describe();
        size_t len = std::min<size_t>(d.size(), static_cast<size_t>(buffer_size - 1));
        std::memcpy(buffer, d.data(), len);
        buffer[len] = '\0';
      });
    };
    return a;
  }();
  return &api;
}

}  // namespace sok

#endif  // SOK_BACKEND_HPP_
