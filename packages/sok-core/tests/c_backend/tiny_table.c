/* tiny: a third-party storage backend in plain C99, written against sok/storage_api.h alone.
 *
 * It is the proof that the contract suffices: tests/test_conformance_c_backend.py compiles it with
 * only storage_api.h on the include path, loads it with ctypes, registers it through the plugin
 * hook and runs the conformance suite on it. It uses nothing of sok-core's C++ kit, so it
 * validates its own arguments and implements the initializers' random stream itself (as the
 * contract defines it: a pure function of (seed, key, column)).
 *
 * Table: open addressing with linear probing over 2^k slots (state byte: empty, live, erased),
 * each slot holding a key (as a 64-bit pattern), a score (the time in ns of its last write,
 * strictly increasing per table) and a row of row_width floats; it doubles when live and erased
 * slots pass half of the slots. One mutex per table serialises the calls. CPU only; no eviction;
 * no update_rows (the field is NULL, which callers read as "absent").
 *
 * Build: cc -std=c99 -shared -fPIC -O2 -ffp-contract=off -pthread -I<dir of sok/storage_api.h>
 *        tiny_table.c -o libtiny.so -lm
 * Entry point: const sok_storage_api* tiny_storage_api(void).
 */
#define _POSIX_C_SOURCE 200112L

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sok/storage_api.h"

enum { EMPTY = 0, LIVE = 1, ERASED = 2 };

struct sok_storage {
  int32_t key_type;
  int32_t row_width;
  pthread_mutex_t lock;
  int64_t slots; /* a power of two */
  int64_t live;
  int64_t erased;
  uint8_t* state;   /* (slots,) */
  uint64_t* keys;   /* (slots,) */
  uint64_t* scores; /* (slots,) */
  float* rows;      /* (slots, row_width) */
  uint64_t last_score;
  char error[256];
};

/* The message of the last failed create (tests create tables from one thread at a time). */
static char create_error[256];

static void set_error(char* buffer, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(buffer, 256, format, args);
  va_end(args);
}

/* -- keys and the random stream of initializers (as sok/storage_api.h defines them) ---------- */
static uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t load_key(const void* keys, int32_t key_type, int64_t i) {
  if (key_type == SOK_KEY_INT32) return (uint64_t)(int64_t)((const int32_t*)keys)[i];
  return ((const uint64_t*)keys)[i];
}

static void store_key(void* keys, int32_t key_type, int64_t i, uint64_t key) {
  if (key_type == SOK_KEY_INT32) {
    ((int32_t*)keys)[i] = (int32_t)(int64_t)key;
  } else {
    ((uint64_t*)keys)[i] = key;
  }
}

static double uniform01(uint64_t seed, uint64_t key, int32_t col, uint32_t draw) {
  const uint64_t base = mix64(key ^ mix64(seed));
  const uint64_t r = mix64(base + (((uint64_t)col << 8) | draw));
  return (double)(r >> 11) * 0x1.0p-53;
}

static double normal01(uint64_t seed, uint64_t key, int32_t col, uint32_t attempt) {
  const double u1 = 1.0 - uniform01(seed, key, col, 2 * attempt);
  const double u2 = uniform01(seed, key, col, 2 * attempt + 1);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static float init_value(const sok_initializer* init, uint64_t key, int32_t col) {
  switch (init->kind) {
    case SOK_INIT_CONSTANT: return (float)init->a;
    case SOK_INIT_UNIFORM: return (float)(init->a + (init->b - init->a) * uniform01(init->seed, key, col, 0));
    case SOK_INIT_NORMAL: return (float)(init->a + init->b * normal01(init->seed, key, col, 0));
    default: { /* SOK_INIT_TRUNCATED_NORMAL: redrawn outside +-2, at most 64 times, then clipped */
      double z = 0.0;
      uint32_t t;
      for (t = 0; t < 64; ++t) {
        z = normal01(init->seed, key, col, t);
        if (fabs(z) <= 2.0) break;
      }
      z = z > 2.0 ? 2.0 : (z < -2.0 ? -2.0 : z);
      return (float)(init->a + init->b * z);
    }
  }
}

static void init_row(float* row, int32_t width, uint64_t key, const sok_initializer* inits, int32_t n) {
  int32_t i, c;
  for (c = 0; c < width; ++c) row[c] = 0.0f;
  for (i = 0; i < n; ++i) {
    for (c = inits[i].col_begin; c < inits[i].col_end; ++c) row[c] = init_value(&inits[i], key, c);
  }
}

/* -- the table ------------------------------------------------------------------------------- */
static float* row_of(sok_storage* s, int64_t slot) { return s->rows + slot * s->row_width; }

static uint64_t tick(sok_storage* s) {
  struct timespec now;
  uint64_t t;
  clock_gettime(CLOCK_REALTIME, &now);
  t = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
  s->last_score = t > s->last_score ? t : s->last_score + 1;
  return s->last_score;
}

/* The live slot of key, or -1. */
static int64_t lookup(const sok_storage* s, uint64_t key) {
  const int64_t mask = s->slots - 1;
  int64_t i = (int64_t)(mix64(key) & (uint64_t)mask);
  for (;;) {
    if (s->state[i] == EMPTY) return -1;
    if (s->state[i] == LIVE && s->keys[i] == key) return i;
    i = (i + 1) & mask;
  }
}

static int allocate(sok_storage* s, int64_t slots) {
  s->state = (uint8_t*)calloc((size_t)slots, 1);
  s->keys = (uint64_t*)malloc((size_t)slots * sizeof(uint64_t));
  s->scores = (uint64_t*)malloc((size_t)slots * sizeof(uint64_t));
  s->rows = (float*)malloc((size_t)slots * (size_t)s->row_width * sizeof(float));
  s->slots = slots;
  s->live = s->erased = 0;
  return s->state != NULL && s->keys != NULL && s->scores != NULL && s->rows != NULL;
}

static void release(sok_storage* s) {
  free(s->state);
  free(s->keys);
  free(s->scores);
  free(s->rows);
}

/* Places key (absent) in the first free slot of its probe sequence. */
static int64_t place(sok_storage* s, uint64_t key) {
  const int64_t mask = s->slots - 1;
  int64_t i = (int64_t)(mix64(key) & (uint64_t)mask);
  while (s->state[i] == LIVE) i = (i + 1) & mask;
  if (s->state[i] == ERASED) --s->erased;
  s->state[i] = LIVE;
  s->keys[i] = key;
  ++s->live;
  return i;
}

/* Doubles the slots when one more key would fill more than half of them (rehashing in place of
 * erased slots when live keys fill less than a quarter). */
static sok_status make_room(sok_storage* s) {
  uint8_t* state = s->state;
  uint64_t* keys = s->keys;
  uint64_t* scores = s->scores;
  float* rows = s->rows;
  const int64_t slots = s->slots, live = s->live, erased = s->erased;
  int64_t i;
  if (2 * (live + erased + 1) <= slots) return SOK_OK;
  if (!allocate(s, (live + 1) * 4 > slots ? slots * 2 : slots)) {
    release(s);
    s->state = state;
    s->keys = keys;
    s->scores = scores;
    s->rows = rows;
    s->slots = slots;
    s->live = live;
    s->erased = erased;
    set_error(s->error, "out of memory growing the table past %lld slots", (long long)slots);
    return SOK_ERROR_OUT_OF_MEMORY;
  }
  for (i = 0; i < slots; ++i) {
    if (state[i] == LIVE) {
      const int64_t j = place(s, keys[i]);
      s->scores[j] = scores[i];
      memcpy(row_of(s, j), rows + i * s->row_width, sizeof(float) * (size_t)s->row_width);
    }
  }
  free(state);
  free(keys);
  free(scores);
  free(rows);
  return SOK_OK;
}

/* The slot of key, inserted (its row from the initializers) when absent; -1 on failure. */
static int64_t find_or_place(sok_storage* s, uint64_t key, const sok_initializer* inits, int32_t num_inits,
                             sok_status* status) {
  int64_t slot = lookup(s, key);
  if (slot >= 0) return slot;
  *status = make_room(s);
  if (*status != SOK_OK) return -1;
  slot = place(s, key);
  init_row(row_of(s, slot), s->row_width, key, inits, num_inits);
  return slot;
}

/* -- argument checks ------------------------------------------------------------------------- */
static sok_status check(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys,
                        int32_t cb, int32_t ce) {
  if (ctx == NULL || ctx->device_type != SOK_DEVICE_CPU || ctx->stream != NULL) {
    set_error(s->error, "tiny runs on the CPU only: pass a CPU execution context with a null stream");
    return ctx != NULL && ctx->device_type == SOK_DEVICE_CUDA ? SOK_ERROR_UNSUPPORTED : SOK_ERROR_INVALID_ARGUMENT;
  }
  if (n < 0) {
    set_error(s->error, "n must be >= 0, got %lld", (long long)n);
    return SOK_ERROR_INVALID_ARGUMENT;
  }
  if (n > 0 && keys == NULL) {
    set_error(s->error, "keys is null but the batch has %lld keys", (long long)n);
    return SOK_ERROR_INVALID_ARGUMENT;
  }
  if (cb < 0 || ce > s->row_width || cb >= ce) {
    set_error(s->error, "column range [%d, %d) is not a non-empty range within the row width %d", cb, ce,
              s->row_width);
    return SOK_ERROR_INVALID_ARGUMENT;
  }
  return SOK_OK;
}

static sok_status check_writes(sok_storage* s, int64_t n, const float* values, const uint64_t* scores,
                               const sok_initializer* inits, int32_t num_inits) {
  int32_t i;
  if (n > 0 && values == NULL) {
    set_error(s->error, "values is null but the batch has %lld keys", (long long)n);
    return SOK_ERROR_INVALID_ARGUMENT;
  }
  if (scores != NULL) {
    set_error(s->error, "tiny computes scores itself (the time of the last write); pass no scores");
    return SOK_ERROR_INVALID_ARGUMENT;
  }
  if (num_inits < 0 || (num_inits > 0 && inits == NULL)) {
    set_error(s->error, "inits must hold num_inits (%d) initializers", num_inits);
    return SOK_ERROR_INVALID_ARGUMENT;
  }
  for (i = 0; i < num_inits; ++i) {
    if (inits[i].kind < SOK_INIT_CONSTANT || inits[i].kind > SOK_INIT_TRUNCATED_NORMAL ||
        inits[i].col_begin < 0 || inits[i].col_end > s->row_width || inits[i].col_begin > inits[i].col_end) {
      set_error(s->error, "initializer %d (kind %d, columns [%d, %d)) is not valid for rows of %d floats", i,
                inits[i].kind, inits[i].col_begin, inits[i].col_end, s->row_width);
      return SOK_ERROR_INVALID_ARGUMENT;
    }
  }
  return SOK_OK;
}

/* -- the ABI --------------------------------------------------------------------------------- */
static sok_status tiny_create(const sok_storage_config* config, sok_storage** out) {
  int64_t capacity = 64, slots = 16;
  int32_t i;
  sok_storage* s;
  if (config == NULL || out == NULL || config->struct_size < sizeof(sok_storage_config)) {
    set_error(create_error, "config and out must not be null, and config->struct_size must cover sok_storage_config");
    return SOK_ERROR_INVALID_ARGUMENT;
  }
  if (config->device_type != SOK_DEVICE_CPU) {
    set_error(create_error, "tiny has no CUDA (GPU) tables: it runs on the CPU only (device_type 0)");
    return SOK_ERROR_UNSUPPORTED;
  }
  if (config->key_type < SOK_KEY_INT64 || config->key_type > SOK_KEY_INT32 || config->row_width < 1) {
    set_error(create_error, "key_type %d or row_width %d is not valid", config->key_type, config->row_width);
    return SOK_ERROR_INVALID_ARGUMENT;
  }
  for (i = 0; i < config->num_options; ++i) {
    const char* name = config->option_names[i];
    const char* value = config->option_values[i];
    char* end = NULL;
    if (strcmp(name, "init_capacity") != 0) {
      set_error(create_error, "unknown option '%s' for backend tiny; valid options: init_capacity", name);
      return SOK_ERROR_INVALID_ARGUMENT;
    }
    capacity = strtoll(value, &end, 10);
    if (end == value || *end != '\0' || capacity < 1) {
      set_error(create_error, "init_capacity='%s' is not an integer >= 1", value);
      return SOK_ERROR_INVALID_ARGUMENT;
    }
  }
  while (slots < 2 * capacity) slots *= 2;
  s = (sok_storage*)calloc(1, sizeof(sok_storage));
  if (s == NULL) {
    set_error(create_error, "out of memory creating a table");
    return SOK_ERROR_OUT_OF_MEMORY;
  }
  s->key_type = config->key_type;
  s->row_width = config->row_width;
  if (!allocate(s, slots)) {
    release(s);
    free(s);
    set_error(create_error, "out of memory allocating %lld slots of %d floats", (long long)slots, config->row_width);
    return SOK_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_init(&s->lock, NULL);
  *out = s;
  return SOK_OK;
}

static void tiny_destroy(sok_storage* s) {
  if (s == NULL) return;
  pthread_mutex_destroy(&s->lock);
  release(s);
  free(s);
}

static const char* tiny_last_error(const sok_storage* s) { return s == NULL ? create_error : s->error; }

static sok_status tiny_size(sok_storage* s, const sok_exec_context* ctx, int64_t* out) {
  (void)ctx;
  pthread_mutex_lock(&s->lock);
  *out = s->live;
  pthread_mutex_unlock(&s->lock);
  return SOK_OK;
}

static sok_status tiny_capacity(sok_storage* s, int64_t* out) {
  pthread_mutex_lock(&s->lock);
  *out = s->slots;
  pthread_mutex_unlock(&s->lock);
  return SOK_OK;
}

/* find and find_hits: write_missing says whether a missing key's row is written. */
static sok_status lookup_rows(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys, int32_t cb,
                              int32_t ce, float* values, const float* default_row, uint8_t* found, int write_missing) {
  const int32_t w = ce - cb;
  int64_t i;
  sok_status st = check(s, ctx, n, keys, cb, ce);
  if (st != SOK_OK) return st;
  pthread_mutex_lock(&s->lock);
  for (i = 0; i < n; ++i) {
    const int64_t slot = lookup(s, load_key(keys, s->key_type, i));
    float* out = values + i * w;
    if (slot >= 0) {
      memcpy(out, row_of(s, slot) + cb, sizeof(float) * (size_t)w);
    } else if (write_missing) {
      if (default_row != NULL) {
        memcpy(out, default_row, sizeof(float) * (size_t)w);
      } else {
        memset(out, 0, sizeof(float) * (size_t)w);
      }
    }
    if (found != NULL) found[i] = slot >= 0;
  }
  pthread_mutex_unlock(&s->lock);
  return SOK_OK;
}

static sok_status tiny_find(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys, int32_t cb,
                            int32_t ce, float* values, const float* default_row, uint8_t* found) {
  return lookup_rows(s, ctx, n, keys, cb, ce, values, default_row, found, 1);
}

static sok_status tiny_find_hits(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys,
                                 int32_t cb, int32_t ce, float* values, uint8_t* found) {
  return lookup_rows(s, ctx, n, keys, cb, ce, values, NULL, found, 0);
}

static sok_status tiny_find_or_insert(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys,
                                      int32_t cb, int32_t ce, float* values, uint8_t* found, const uint64_t* scores,
                                      const sok_initializer* inits, int32_t num_inits) {
  const int32_t w = ce - cb;
  int64_t i;
  uint64_t now;
  sok_status st = check(s, ctx, n, keys, cb, ce);
  if (st == SOK_OK) st = check_writes(s, n, values, scores, inits, num_inits);
  if (st != SOK_OK) return st;
  pthread_mutex_lock(&s->lock);
  now = tick(s);
  if (found != NULL) { /* whether each key existed before the call */
    for (i = 0; i < n; ++i) found[i] = lookup(s, load_key(keys, s->key_type, i)) >= 0;
  }
  for (i = 0; i < n && st == SOK_OK; ++i) {
    const int64_t slot = find_or_place(s, load_key(keys, s->key_type, i), inits, num_inits, &st);
    if (slot < 0) break;
    s->scores[slot] = now;
    memcpy(values + i * w, row_of(s, slot) + cb, sizeof(float) * (size_t)w);
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

/* How write_rows treats a row: insert_or_assign, accum_or_assign, import_batch (given scores). */
enum { ASSIGN, ACCUMULATE, IMPORT };

static sok_status write_rows(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys, int32_t cb,
                             int32_t ce, const float* values, const uint64_t* scores, const sok_initializer* inits,
                             int32_t num_inits, int mode) {
  const int32_t w = ce - cb;
  int64_t i;
  int32_t c;
  uint64_t now;
  sok_status st = check(s, ctx, n, keys, cb, ce);
  if (st == SOK_OK) st = check_writes(s, n, values, mode == IMPORT ? NULL : scores, inits, num_inits);
  if (st == SOK_OK && mode == IMPORT && n > 0 && scores == NULL) {
    set_error(s->error, "import_batch needs scores (one per key)");
    st = SOK_ERROR_INVALID_ARGUMENT;
  }
  if (st != SOK_OK) return st;
  pthread_mutex_lock(&s->lock);
  now = tick(s);
  for (i = 0; i < n; ++i) {
    const uint64_t key = load_key(keys, s->key_type, i);
    const int existed = lookup(s, key) >= 0;
    const int64_t slot = find_or_place(s, key, inits, num_inits, &st);
    float* row;
    if (slot < 0) break;
    row = row_of(s, slot) + cb;
    if (mode == ACCUMULATE && existed) {
      for (c = 0; c < w; ++c) row[c] += values[i * w + c];
    } else {
      memcpy(row, values + i * w, sizeof(float) * (size_t)w);
    }
    s->scores[slot] = mode == IMPORT ? scores[i] : now;
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

/* The three ABI functions of write_rows: one signature, one mode each. */
#define TINY_WRITER(name, mode)                                                                                 \
  static sok_status name(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys, int32_t cb, \
                         int32_t ce, const float* values, const uint64_t* scores, const sok_initializer* inits,  \
                         int32_t num_inits) {                                                                     \
    return write_rows(s, ctx, n, keys, cb, ce, values, scores, inits, num_inits, mode);                          \
  }
TINY_WRITER(tiny_insert_or_assign, ASSIGN)
TINY_WRITER(tiny_accum_or_assign, ACCUMULATE)
TINY_WRITER(tiny_import_batch, IMPORT)

static sok_status tiny_insert_and_evict(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys,
                                        int32_t cb, int32_t ce, const float* values, const uint64_t* scores,
                                        const sok_initializer* inits, int32_t num_inits, void* evicted_keys,
                                        float* evicted_values, uint64_t* evicted_scores, int64_t* num_evicted) {
  /* tiny grows instead of evicting: an insert_or_assign that displaces nothing. */
  sok_status st = tiny_insert_or_assign(s, ctx, n, keys, cb, ce, values, scores, inits, num_inits);
  (void)evicted_keys;
  (void)evicted_values;
  (void)evicted_scores;
  if (st == SOK_OK && num_evicted != NULL) *num_evicted = 0;
  return st;
}

static sok_status tiny_erase(sok_storage* s, const sok_exec_context* ctx, int64_t n, const void* keys,
                             int64_t* num_erased) {
  int64_t i, erased = 0;
  sok_status st = check(s, ctx, n, keys, 0, s->row_width);
  if (st != SOK_OK) return st;
  pthread_mutex_lock(&s->lock);
  for (i = 0; i < n; ++i) {
    const int64_t slot = lookup(s, load_key(keys, s->key_type, i));
    if (slot < 0) continue;
    s->state[slot] = ERASED;
    --s->live;
    ++s->erased;
    ++erased;
  }
  pthread_mutex_unlock(&s->lock);
  if (num_erased != NULL) *num_erased = erased;
  return SOK_OK;
}

/* export_batch (threshold NULL) and export_if. */
static sok_status export_rows(sok_storage* s, const sok_exec_context* ctx, const uint64_t* threshold, int64_t offset,
                              int64_t limit, int32_t cb, int32_t ce, void* keys, float* values, uint64_t* scores,
                              int64_t* count) {
  int64_t i, end, written = 0;
  sok_status st;
  if (values == NULL) { /* no values: the column range is unused */
    cb = 0;
    ce = s->row_width;
  }
  st = check(s, ctx, limit, keys, cb, ce);
  if (st != SOK_OK) return st;
  if (offset < 0 || count == NULL) {
    set_error(s->error, "offset must be >= 0 (got %lld) and count must not be null", (long long)offset);
    return SOK_ERROR_INVALID_ARGUMENT;
  }
  pthread_mutex_lock(&s->lock);
  end = offset + limit < s->slots ? offset + limit : s->slots;
  for (i = offset; i < end; ++i) {
    if (s->state[i] != LIVE || (threshold != NULL && s->scores[i] < *threshold)) continue;
    store_key(keys, s->key_type, written, s->keys[i]);
    if (values != NULL) {
      memcpy(values + written * (ce - cb), row_of(s, i) + cb, sizeof(float) * (size_t)(ce - cb));
    }
    if (scores != NULL) scores[written] = s->scores[i];
    ++written;
  }
  pthread_mutex_unlock(&s->lock);
  *count = written;
  return SOK_OK;
}

static sok_status tiny_export_batch(sok_storage* s, const sok_exec_context* ctx, int64_t offset, int64_t limit,
                                    int32_t cb, int32_t ce, void* keys, float* values, uint64_t* scores,
                                    int64_t* count) {
  return export_rows(s, ctx, NULL, offset, limit, cb, ce, keys, values, scores, count);
}

static sok_status tiny_export_if(sok_storage* s, const sok_exec_context* ctx, uint64_t threshold, int64_t offset,
                                 int64_t limit, int32_t cb, int32_t ce, void* keys, float* values, uint64_t* scores,
                                 int64_t* count) {
  return export_rows(s, ctx, &threshold, offset, limit, cb, ce, keys, values, scores, count);
}

static sok_status tiny_clear(sok_storage* s, const sok_exec_context* ctx) {
  sok_status st = check(s, ctx, 0, NULL, 0, s->row_width);
  if (st != SOK_OK) return st;
  pthread_mutex_lock(&s->lock);
  memset(s->state, EMPTY, (size_t)s->slots);
  s->live = s->erased = 0;
  pthread_mutex_unlock(&s->lock);
  return SOK_OK;
}

static sok_status tiny_set_global_epoch(sok_storage* s, uint64_t epoch) {
  (void)epoch;
  set_error(s->error, "tiny has no epoch-based eviction policy (epoch_lru, epoch_lfu)");
  return SOK_ERROR_UNSUPPORTED;
}

static sok_status tiny_describe(sok_storage* s, char* buffer, int64_t buffer_size) {
  if (buffer == NULL || buffer_size < 1) {
    set_error(s->error, "buffer is null or empty");
    return SOK_ERROR_INVALID_ARGUMENT;
  }
  pthread_mutex_lock(&s->lock);
  snprintf(buffer, (size_t)buffer_size, "tiny (C99): %lld keys, %lld slots, row width %d", (long long)s->live,
           (long long)s->slots, s->row_width);
  pthread_mutex_unlock(&s->lock);
  return SOK_OK;
}

const sok_storage_api* tiny_storage_api(void) {
  static sok_storage_api api;
  api.api_version = SOK_STORAGE_API_VERSION;
  api.struct_size = sizeof(sok_storage_api);
  api.backend_name = "tiny";
  api.create = tiny_create;
  api.destroy = tiny_destroy;
  api.last_error = tiny_last_error;
  api.size = tiny_size;
  api.capacity = tiny_capacity;
  api.find = tiny_find;
  api.find_or_insert = tiny_find_or_insert;
  api.insert_or_assign = tiny_insert_or_assign;
  api.accum_or_assign = tiny_accum_or_assign;
  api.erase = tiny_erase;
  api.export_batch = tiny_export_batch;
  api.export_if = tiny_export_if;
  api.insert_and_evict = tiny_insert_and_evict;
  api.clear = tiny_clear;
  api.set_global_epoch = tiny_set_global_epoch;
  api.describe = tiny_describe;
  api.import_batch = tiny_import_batch;
  api.update_rows = NULL; /* optional: callers fall back to find_or_insert and insert_or_assign */
  api.find_hits = tiny_find_hits;
  return &api;
}
