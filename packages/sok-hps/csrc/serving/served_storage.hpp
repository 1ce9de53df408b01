// The C++ server's tables as SOK storages (sok/kit/storage.hpp), read-only: what the storage ops of
// an HPS lookup graph traced while HPS ran in Python (SokFind, SokFindOrDefault on the table that
// SokResolveTable gives) read in a process with no Python. A thin wrapper over the table's det
// storage (server.hpp): a find is det's find on it (int32 keys widened to its int64); every write is
// refused, although det's storage would take it: one Server's rows are shared by every graph of the
// process and must stay the model files' (they change only by a new model), and the storage ABI has
// no read-only flag. The rows live in host memory, and det's CPU storage refuses CUDA contexts: where
// the library was built with CUDA, a find whose arrays are on a GPU (TensorFlow placed the graph's
// lookups there) goes through host copies in the call's stream, then det's find on the host.
//
// Example:
//   const sok_table_ref* ref = served_table_ref(server, table, SOK_KEY_INT64);   // lives forever
//   ref->api->find(ref->storage, &cpu, n, keys, 0, table.dim, values, nullptr, found);
#ifndef SOK_HPS_SERVING_SERVED_STORAGE_HPP_
#define SOK_HPS_SERVING_SERVED_STORAGE_HPP_

#include <memory>
#include <string>

#include "server.hpp"
#include "sok/table_ref.h"

namespace sok {
namespace hps {

// The reference of `table`'s rows in `tier` ("cache" or "volatile": Server::graph_table) of `server`
// with keys of key_type (SOK_KEY_INT64 or SOK_KEY_INT32), made on first use and never freed (a
// sok_table_ref lives for the process, as sok/table_ref.h asks). Throws std::invalid_argument where
// the table has no such rows.
const sok_table_ref* served_table_ref(const std::shared_ptr<Server>& server, const ServedTable& table,
                                      const std::string& tier, int32_t key_type);

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_SERVED_STORAGE_HPP_
