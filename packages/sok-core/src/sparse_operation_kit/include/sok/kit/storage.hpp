// sok::Storage, the C++ face of a storage a backend implements (one class per device), and
// Columns, the column range every row operation takes. sok/kit/abi_adapter.hpp turns a Storage
// into the C function table.
#ifndef SOK_KIT_STORAGE_HPP_
#define SOK_KIT_STORAGE_HPP_

#include <cstdint>
#include <string>

#include "sok/kit/error.hpp"
#include "sok/storage_api.h"

namespace sok {

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
  // insert_or_assign_hinted of the C ABI (hints: sok_hint bits, already checked). The default
  // has no use for hints: insert_or_assign, which is right whatever the caller promised.
  virtual void insert_or_assign_hinted(const sok_exec_context& ctx, int64_t n, const void* keys, Columns cols,
                                       const float* values, const uint64_t* scores, const sok_initializer* inits,
                                       int32_t num_inits, uint32_t /*hints*/) {
    insert_or_assign(ctx, n, keys, cols, values, scores, inits, num_inits);
  }
  // find_or_insert_rows of the C ABI: find_or_insert, then visit(user_data, n, rows, &ctx) once
  // (n > 0) with the device array of the rows' addresses, before the call ends. Optional: the
  // default declines, and callers fall back to find_or_insert and insert_or_assign.
  virtual void find_or_insert_rows(const sok_exec_context&, int64_t, const void*, uint8_t*, const uint64_t*,
                                   const sok_initializer*, int32_t, sok_device_rows_visitor, void*) {
    fail(SOK_ERROR_UNSUPPORTED, "this backend has no find_or_insert_rows (rows lent in place); use find_or_insert "
                                "and insert_or_assign");
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

}  // namespace sok

#endif  // SOK_KIT_STORAGE_HPP_
