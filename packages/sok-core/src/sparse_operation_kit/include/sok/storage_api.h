/* The storage C ABI of SparseOperationKit: one embedding-table shard in one process.
 *
 * A backend exports one `sok_storage_api` table (as a PyCapsule named "sok_storage_api" from its
 * Python extension). sok-core's TensorFlow ops, HPS and the tools drive every backend through it
 * without linking the backend. Rules of the ABI:
 *   - plain C, no exceptions cross it, nothing prints; every call returns a sok_status and, on
 *     failure, `last_error(storage)` gives a message (valid until the next call on that storage);
 *   - arrays are raw pointers plus counts, living on the device named by the execution context
 *     (host memory for SOK_DEVICE_CPU; device memory and a CUDA stream for SOK_DEVICE_CUDA);
 *   - a row is `row_width` floats: [embedding | optimizer state]. Row reads and writes take a
 *     column range [col_begin, col_end) so a lookup never touches optimizer state;
 *   - keys have the storage's key type; every value of that type is a valid key (no sentinels);
 *   - calls on one storage may come from several threads: the backend serialises what it must.
 *
 * Versioning: `api_version` changes when the meaning of a field changes; new functions are only
 * appended, and `struct_size` tells a caller which ones a backend has.
 */
#ifndef SOK_STORAGE_API_H_
#define SOK_STORAGE_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SOK_STORAGE_API_VERSION 1
#define SOK_STORAGE_CAPSULE_NAME "sok_storage_api"
#define SOK_STORAGE_HANDLE_CAPSULE_NAME "sok_storage"

typedef enum sok_status {
  SOK_OK = 0,
  SOK_ERROR_INVALID_ARGUMENT = 1, /* a caller error: bad option, range, count or pointer */
  SOK_ERROR_OUT_OF_MEMORY = 2,    /* an allocation failed; the storage is unchanged */
  SOK_ERROR_UNSUPPORTED = 3,      /* the backend lacks this operation or device */
  SOK_ERROR_CAPACITY = 4,         /* the table is full and cannot grow or evict */
  SOK_ERROR_INTERNAL = 5          /* a bug or a device fault: the message says which */
} sok_status;

typedef enum sok_key_type { SOK_KEY_INT64 = 0, SOK_KEY_UINT64 = 1, SOK_KEY_INT32 = 2 } sok_key_type;

typedef enum sok_device_type { SOK_DEVICE_CPU = 0, SOK_DEVICE_CUDA = 1 } sok_device_type;

/* Where a call runs: the arrays of the call live on this device; `stream` is a cudaStream_t for
 * SOK_DEVICE_CUDA (NULL = the legacy default stream) and must be NULL for SOK_DEVICE_CPU. */
typedef struct sok_exec_context {
  int32_t device_type; /* sok_device_type */
  int32_t device_id;
  void* stream;
} sok_exec_context;

typedef enum sok_init_kind {
  SOK_INIT_CONSTANT = 0,        /* a                                                        */
  SOK_INIT_UNIFORM = 1,         /* U[a, b)                                                  */
  SOK_INIT_NORMAL = 2,          /* N(mean=a, stddev=b)                                      */
  SOK_INIT_TRUNCATED_NORMAL = 3 /* N(a, b) redrawn outside a +- 2b (as Keras TruncatedNormal) */
} sok_init_kind;

/* How the columns [col_begin, col_end) of a newly inserted row are filled. Random values are a
 * pure function of (seed, key, column): the same on every backend, device, thread count and batch
 * order. Columns covered by no initializer are 0. */
typedef struct sok_initializer {
  int32_t kind; /* sok_init_kind */
  int32_t col_begin;
  int32_t col_end;
  int32_t reserved; /* 0 */
  double a;
  double b;
  uint64_t seed;
} sok_initializer;

/* How a storage is made. Backend-specific settings come as string pairs (for example
 * "max_capacity" = "1048576"); a backend rejects names it does not know. */
typedef struct sok_storage_config {
  uint32_t struct_size; /* sizeof(sok_storage_config) */
  int32_t key_type;     /* sok_key_type */
  int32_t row_width;    /* floats per row, >= 1 */
  int32_t device_type;  /* sok_device_type of the memory the table lives in */
  int32_t device_id;
  int32_t num_options;
  const char* const* option_names;
  const char* const* option_values;
} sok_storage_config;

typedef struct sok_storage sok_storage; /* opaque, owned by the backend */

/* What a caller may promise about a call's keys (bit flags of insert_or_assign_hinted).
 * SOK_HINT_UNIQUE_KEYS: no key repeats within the batch (as after a deduplication). A backend may
 * then skip the deduplication of keys already present; if the promise is broken, which occurrence's
 * values a repeated key keeps is unspecified, but the table stays whole: no key is stored twice
 * and the size stays right. SOK_HINTS_ALL: every bit this header defines; other bits are refused. */
typedef enum sok_hint { SOK_HINT_UNIQUE_KEYS = 1 } sok_hint;
#define SOK_HINTS_ALL 1u

/* The callback of update_rows: called for each key of the batch, with i its position in the batch
 * and row its columns [col_begin, col_end) in the table (w floats, read and written in place). It
 * must not call back into the storage, and may run on several threads at once (for different
 * keys; the visits of one key come in batch order). */
typedef void (*sok_row_visitor)(void* user_data, int64_t i, float* row);

/* The callback of find_or_insert_rows: called once, under the storage's lock, with rows (n,) a
 * device array of the addresses of the batch's rows (row_width floats each, device-accessible; NULL
 * for a key the table refused). It enqueues its work on those rows on ctx's stream and returns
 * 0, or a non-zero code when it could not (the call then fails with SOK_ERROR_INTERNAL; the keys
 * stay inserted). It must not call back into the storage, nor wait for the stream. */
typedef int32_t (*sok_device_rows_visitor)(void* user_data, int64_t n, float* const* rows,
                                           const sok_exec_context* ctx);

/* Every function returns SOK_OK or an error code. Shapes of array arguments are in comments:
 * n = number of keys, w = col_end - col_begin, W = row_width. Optional outputs may be NULL. */
typedef struct sok_storage_api {
  uint32_t api_version; /* SOK_STORAGE_API_VERSION the backend was built with */
  uint32_t struct_size; /* sizeof(sok_storage_api) of the backend */
  const char* backend_name;

  sok_status (*create)(const sok_storage_config* config, sok_storage** out);
  void (*destroy)(sok_storage* storage);
  /* The message of the last failed call on `storage` (or of the last failed `create` in this
   * thread when storage is NULL). Never NULL. */
  const char* (*last_error)(const sok_storage* storage);

  sok_status (*size)(sok_storage* s, const sok_exec_context* ctx, int64_t* out);
  sok_status (*capacity)(sok_storage* s, int64_t* out);

  /* Copy columns of found keys to values (n, w); a missing key gets default_row (w,) or zeros
   * when default_row is NULL. found (n,) uint8 is 1 for a hit. Scores are not changed. */
  sok_status (*find)(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys,
                     int32_t col_begin, int32_t col_end, float* values, const float* default_row,
                     uint8_t* found);
  /* Find, inserting missing keys first: a new row is filled by the initializers, then columns are
   * copied to values (n, w). found (n,) is 1 for keys that existed before the call. The scores of
   * all keys are updated per the eviction policy; `scores` (n,) is read by score policies that
   * take caller scores and must otherwise be NULL. */
  sok_status (*find_or_insert)(sok_storage* s, const sok_exec_context* ctx, int64_t n,
                               const void* keys, int32_t col_begin, int32_t col_end, float* values,
                               uint8_t* found, const uint64_t* scores, const sok_initializer* inits,
                               int32_t num_inits);
  /* Write values (n, w) to the columns of each key, inserting new keys (other columns of a new row
   * from the initializers). For duplicate keys in a batch the last one wins. */
  sok_status (*insert_or_assign)(sok_storage* s, const sok_exec_context* ctx, int64_t n,
                                 const void* keys, int32_t col_begin, int32_t col_end,
                                 const float* values, const uint64_t* scores,
                                 const sok_initializer* inits, int32_t num_inits);
  /* Add values (n, w) to the columns of existing keys; a new key is inserted with the values
   * (other columns from the initializers). Duplicates accumulate. */
  sok_status (*accum_or_assign)(sok_storage* s, const sok_exec_context* ctx, int64_t n,
                                const void* keys, int32_t col_begin, int32_t col_end,
                                const float* values, const uint64_t* scores,
                                const sok_initializer* inits, int32_t num_inits);
  /* Remove keys; *num_erased (may be NULL) is the number of keys that were present. */
  sok_status (*erase)(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys,
                      int64_t* num_erased);
  /* Scan positions [offset, offset + limit) of the table's export order (its slots, or its row
   * storage: the backend's choice) and write the live rows compactly: keys (limit,), values
   * (limit, w), scores (limit,) uint64; *count = rows written. Positions are numbered
   * 0 .. capacity-1; scanning all of them exports every row exactly once if the table is not
   * modified meanwhile. */
  sok_status (*export_batch)(sok_storage* s, const sok_exec_context* ctx, int64_t offset,
                             int64_t limit, int32_t col_begin, int32_t col_end, void* keys,
                             float* values, uint64_t* scores, int64_t* count);
  /* As export_batch, keeping only rows whose score >= threshold. */
  sok_status (*export_if)(sok_storage* s, const sok_exec_context* ctx, uint64_t threshold,
                          int64_t offset, int64_t limit, int32_t col_begin, int32_t col_end,
                          void* keys, float* values, uint64_t* scores, int64_t* count);
  /* insert_or_assign that reports what it displaced: every evicted row (and every input the policy
   * refused) goes to evicted_keys (n,), evicted_values (n, W) (whole rows, optimizer state
   * included), evicted_scores (n,); *num_evicted = rows written. */
  sok_status (*insert_and_evict)(sok_storage* s, const sok_exec_context* ctx, int64_t n,
                                 const void* keys, int32_t col_begin, int32_t col_end,
                                 const float* values, const uint64_t* scores,
                                 const sok_initializer* inits, int32_t num_inits,
                                 void* evicted_keys, float* evicted_values,
                                 uint64_t* evicted_scores, int64_t* num_evicted);
  sok_status (*clear)(sok_storage* s, const sok_exec_context* ctx);
  /* The epoch of the epoch-LRU / epoch-LFU policies (SOK_ERROR_UNSUPPORTED elsewhere). */
  sok_status (*set_global_epoch)(sok_storage* s, uint64_t epoch);
  /* A short description of the storage's state for logs ("det: 1024 slots, ..."). */
  sok_status (*describe)(sok_storage* s, char* buffer, int64_t buffer_size);
  /* The inverse of export_batch: insert_or_assign that stores scores (n,) as they are, whatever the
   * eviction policy (for restoring checkpoints and copying tables). A table at capacity treats
   * them as custom scores: the lowest goes, or the input is dropped. */
  sok_status (*import_batch)(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys,
                             int32_t col_begin, int32_t col_end, const float* values,
                             const uint64_t* scores, const sok_initializer* inits, int32_t num_inits);
  /* Read-modify-write of existing rows with one probe per key, under the storage's lock: when
   * every key of keys (n,) is present, calls visit(user_data, i, row) for each key i and updates
   * its score as insert_or_assign of an existing key does (scores (n,) as there); duplicates are
   * visited once per occurrence, in batch order. When a key is missing nothing is visited, inserted
   * or rescored: *num_missing (never NULL) = the missing keys (0 when every row was visited) and
   * found (n,) uint8 (may be NULL) is 1 for the present ones. Optional: a backend may return
   * SOK_ERROR_UNSUPPORTED (sok::Storage's default; the CUDA tables do), and one built before this
   * field has a smaller struct_size (see sok_storage_api_has); callers then use find_or_insert and
   * insert_or_assign. Host rows only (SOK_DEVICE_CPU). Appended in sok-core 0.1.0 (API version 1). */
  sok_status (*update_rows)(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys,
                            int32_t col_begin, int32_t col_end, const uint64_t* scores,
                            sok_row_visitor visit, void* user_data, uint8_t* found, int64_t* num_missing);
  /* find that writes only the rows of present keys: values (n, w) of missing keys keep what the
   * caller put there (HierarchicalKV's find), which spares the writes of a miss. found (n,) as in
   * find. Scores are not changed. Optional: a backend built before this field has a smaller
   * struct_size (see sok_storage_api_has); callers then use find. Appended in sok-core 0.1.0
   * (API version 1). */
  sok_status (*find_hits)(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys,
                          int32_t col_begin, int32_t col_end, float* values, uint8_t* found);
  /* insert_or_assign with the caller's promises about its keys: hints is a set of sok_hint bits
   * (0 = insert_or_assign). Bits outside SOK_HINTS_ALL give SOK_ERROR_INVALID_ARGUMENT; a backend
   * may ignore the hints it has no use for. Optional: a backend built before this field has a
   * smaller struct_size (see sok_storage_api_has); callers then use insert_or_assign. Appended in
   * sok-core 0.1.0 (API version 1). */
  sok_status (*insert_or_assign_hinted)(sok_storage* s, const sok_exec_context* ctx, int64_t n,
                                        const void* keys, int32_t col_begin, int32_t col_end,
                                        const float* values, const uint64_t* scores,
                                        const sok_initializer* inits, int32_t num_inits,
                                        uint32_t hints);
  /* find_or_insert that lends the rows instead of copying them: missing keys are inserted (the
   * initializers) and every key's score updated as find_or_insert does (found (n,) and scores as
   * there), then visit(user_data, n, rows, ctx) enqueues the caller's reads and writes of the rows
   * in place, while the storage's lock keeps every other call out; calls after it are ordered after
   * that work on the device. This spares an optimizer step the copy of its rows out and the
   * insert_or_assign back. visit is not called when n is 0. A backend may decline a call it cannot
   * serve this way (one whose rows may move while the batch is placed, say) with
   * SOK_ERROR_UNSUPPORTED before anything changes; callers then use find_or_insert and
   * insert_or_assign. Optional: a backend built before this field has a smaller struct_size (see
   * sok_storage_api_has). CUDA tables (SOK_DEVICE_CUDA). Appended in sok-core 0.1.0 (API version 1). */
  sok_status (*find_or_insert_rows)(sok_storage* s, const sok_exec_context* ctx, int64_t n,
                                    const void* keys, uint8_t* found, const uint64_t* scores,
                                    const sok_initializer* inits, int32_t num_inits,
                                    sok_device_rows_visitor visit, void* user_data);
} sok_storage_api;

/* Whether `api` (built against any version of this header) has the function field `field`: its
 * struct_size covers it and it is not NULL. For example sok_storage_api_has(api, update_rows). */
#define sok_storage_api_has(api, field)                                                \
  ((api)->struct_size >= offsetof(sok_storage_api, field) + sizeof((api)->field) && \
   (api)->field != NULL)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SOK_STORAGE_API_H_ */
