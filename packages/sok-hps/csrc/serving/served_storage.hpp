// The C++ server's tables as SOK storages (sok/kit/storage.hpp), read-only: what the storage ops of
// an HPS lookup graph traced while HPS ran in Python (SokFind, SokFindOrDefault on the table that
// SokResolveTable gives) read in a process with no Python. A thin wrapper over the rows the graph
// reads (Server::graph_table: the table's cache, a det storage or the evicting hkv cache, or the
// volatile hash map's det storage): a find is their find; every write is refused: only the server
// writes them (the model files, online updates, the cache's fills), which every graph of the process
// shares, and the storage ABI has no read-only flag. Where the library was built with CUDA, a find
// whose arrays are on a GPU (TensorFlow placed the graph's lookups there) runs there in the call's
// stream where the rows are on that GPU with keys of the graph's type (the caches, as Python's),
// else through host copies in that stream.
//
// Example:
//   const sok_table_ref* ref = served_table_ref(server, table, "cache", SOK_KEY_INT64);   // lives forever
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
