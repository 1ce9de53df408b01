// The ABI adapter: sok::make_storage_api<Create>() gives a backend's whole sok_storage_api
// function table over its sok::Storage classes. It is the one place that validates the arguments
// of the C ABI, for every caller (the TensorFlow ops, the Python binding sparse_operation_kit._table,
// HPS, tools): null pointers, counts, column ranges, initializers, scores against the policy, the
// execution context's device. A Storage's virtual operations therefore see validated arguments
// only. Exceptions become a status and a last_error message here, so none crosses the ABI.
#ifndef SOK_KIT_ABI_ADAPTER_HPP_
#define SOK_KIT_ABI_ADAPTER_HPP_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "sok/kit/error.hpp"
#include "sok/kit/options.hpp"
#include "sok/kit/storage.hpp"
#include "sok/storage_api.h"

namespace sok {

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

// The checks every call that reads or writes n rows shares: context, count, keys and values.
inline const sok_exec_context& check_rows_call(const Storage& s, const sok_exec_context* ctx, int64_t n,
                                               const void* keys, const void* values) {
  const auto& c = check_ctx(s, ctx);
  check_count(n, "n");
  check_ptr(keys, n, "keys");
  check_ptr(values, n, "values");
  return c;
}

// export_batch and export_if (with `threshold`): their checks, then the storage's export_batch.
inline void export_checked(Storage& s, const sok_exec_context* ctx, int64_t offset, int64_t limit, int32_t cb,
                           int32_t ce, const uint64_t* threshold, void* keys, float* values, uint64_t* scores,
                           int64_t* count) {
  const auto& c = check_ctx(s, ctx);
  check_count(offset, "offset");
  check_count(limit, "limit");
  check_ptr(keys, limit, "keys");
  if (count == nullptr) invalid("count is null");
  Columns cols = values == nullptr ? Columns{0, s.row_width()} : check_cols(s, cb, ce);
  *count = s.export_batch(c, offset, limit, cols, threshold, keys, values, scores);
}

// The checks of a call that may insert rows: their scores and the initializers of new rows.
inline void check_new_rows(const Storage& s, const uint64_t* scores, int64_t n, const sok_initializer* inits,
                           int32_t ni) {
  check_scores(s, scores, n);
  check_inits(s, inits, ni);
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
        const auto& c = check_rows_call(s, ctx, n, keys, values);
        s.find(c, n, keys, check_cols(s, cb, ce), values, default_row, found);
      });
    };
    a.find_or_insert = [](sok_storage* h, const sok_exec_context* ctx, int64_t n, const void* keys,
                          int32_t cb, int32_t ce, float* values, uint8_t* found,
                          const uint64_t* scores, const sok_initializer* inits, int32_t ni) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_rows_call(s, ctx, n, keys, values);
        check_new_rows(s, scores, n, inits, ni);
        s.find_or_insert(c, n, keys, check_cols(s, cb, ce), values, found, scores, inits, ni);
      });
    };
    a.insert_or_assign = [](sok_storage* h, const sok_exec_context* ctx, int64_t n,
                            const void* keys, int32_t cb, int32_t ce, const float* values,
                            const uint64_t* scores, const sok_initializer* inits, int32_t ni) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_rows_call(s, ctx, n, keys, values);
        check_new_rows(s, scores, n, inits, ni);
        s.insert_or_assign(c, n, keys, check_cols(s, cb, ce), values, scores, inits, ni);
      });
    };
    a.accum_or_assign = [](sok_storage* h, const sok_exec_context* ctx, int64_t n,
                           const void* keys, int32_t cb, int32_t ce, const float* values,
                           const uint64_t* scores, const sok_initializer* inits, int32_t ni) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_rows_call(s, ctx, n, keys, values);
        check_new_rows(s, scores, n, inits, ni);
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
        export_checked(s, ctx, offset, limit, cb, ce, nullptr, keys, values, scores, count);
      });
    };
    a.export_if = [](sok_storage* h, const sok_exec_context* ctx, uint64_t threshold,
                     int64_t offset, int64_t limit, int32_t cb, int32_t ce, void* keys,
                     float* values, uint64_t* scores, int64_t* count) {
      return guarded(h, [&](Storage& s) {
        export_checked(s, ctx, offset, limit, cb, ce, &threshold, keys, values, scores, count);
      });
    };
    a.insert_and_evict = [](sok_storage* h, const sok_exec_context* ctx, int64_t n,
                            const void* keys, int32_t cb, int32_t ce, const float* values,
                            const uint64_t* scores, const sok_initializer* inits, int32_t ni,
                            void* ek, float* ev, uint64_t* es, int64_t* num_evicted) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_rows_call(s, ctx, n, keys, values);
        check_ptr(ek, n, "evicted_keys");
        check_new_rows(s, scores, n, inits, ni);
        int64_t m = s.insert_and_evict(c, n, keys, check_cols(s, cb, ce), values, scores, inits,
                                       ni, ek, ev, es);
        if (num_evicted != nullptr) *num_evicted = m;
      });
    };
    a.import_batch = [](sok_storage* h, const sok_exec_context* ctx, int64_t n, const void* keys,
                        int32_t cb, int32_t ce, const float* values, const uint64_t* scores,
                        const sok_initializer* inits, int32_t ni) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_rows_call(s, ctx, n, keys, values);
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
        const auto& c = check_rows_call(s, ctx, n, keys, values);
        s.find_hits(c, n, keys, check_cols(s, cb, ce), values, found);
      });
    };
    a.insert_or_assign_hinted = [](sok_storage* h, const sok_exec_context* ctx, int64_t n, const void* keys,
                                   int32_t cb, int32_t ce, const float* values, const uint64_t* scores,
                                   const sok_initializer* inits, int32_t ni, uint32_t hints) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_rows_call(s, ctx, n, keys, values);
        check_new_rows(s, scores, n, inits, ni);
        if ((hints & ~SOK_HINTS_ALL) != 0) {
          invalid(unknown_hints(hints));
        }
        s.insert_or_assign_hinted(c, n, keys, check_cols(s, cb, ce), values, scores, inits, ni, hints);
      });
    };
    a.find_or_insert_rows = [](sok_storage* h, const sok_exec_context* ctx, int64_t n, const void* keys,
                               uint8_t* found, const uint64_t* scores, const sok_initializer* inits, int32_t ni,
                               sok_device_rows_visitor visit, void* user_data) {
      return guarded(h, [&](Storage& s) {
        const auto& c = check_ctx(s, ctx);
        check_count(n, "n");
        check_ptr(keys, n, "keys");
        if (visit == nullptr) invalid("visit is null; pass the function that enqueues the work on the rows");
        check_new_rows(s, scores, n, inits, ni);
        s.find_or_insert_rows(c, n, keys, found, scores, inits, ni, visit, user_data);
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

#endif  // SOK_KIT_ABI_ADAPTER_HPP_
