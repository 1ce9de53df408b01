/* A reference to one storage, as sok-core's TensorFlow ops receive it.
 *
 * The Python side (sparse_operation_kit.table_ref) fills this struct with a backend's function table
 * and storage handle and passes its address to the ops as an int64 scalar. The magic number lets an
 * op refuse an address that does not point at a live reference: a struct, once made, stays allocated
 * for the life of the process, and reads magic 0 after its table is gone. `storage` may be swapped for a
 * wider copy (when an optimizer adds state columns) while ops keep the same reference; `inits` say
 * how every column of a new row is filled (embedding and optimizer state alike), so a graph traced
 * before the swap still inserts rows right.
 */
#ifndef SOK_TABLE_REF_H_
#define SOK_TABLE_REF_H_

#include <stddef.h>
#include <stdint.h>

#include "sok/storage_api.h"

#define SOK_TABLE_REF_MAGIC 0x534F4B5441424C45ull /* "SOKTABLE" */

typedef struct sok_table_ref {
  uint64_t magic; /* SOK_TABLE_REF_MAGIC while alive, 0 once released */
  const sok_storage_api* api;
  sok_storage* storage;
  int32_t key_type; /* sok_key_type */
  int32_t row_width;
  const sok_initializer* inits; /* (num_inits,) */
  int32_t num_inits;
} sok_table_ref;

/* Whether `ref` points at a live reference (a released one reads magic 0). */
static inline int sok_table_ref_is_live(const sok_table_ref* ref) {
  return ref != NULL && ref->magic == SOK_TABLE_REF_MAGIC;
}

#endif /* SOK_TABLE_REF_H_ */
