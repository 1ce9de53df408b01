// libsok_hps_serving.so: HPS's lookups where no Python runs. Loaded after sok-core's
// libsok_tf_ops.so (TF_LoadLibrary, or tf.load_op_library), it registers with it (sok/tf/calls.h)
// native implementations of the functions of hierarchical_parameter_server.graph_calls that HPS's
// graphs name: `lookup` (the whole lookup of a layer traced while HPS was not running: NVIDIA's
// flow, the model saved before hps.Init); those of a graph traced on a running server: `cache_table`
// and `volatile_table` (the tables its SokFind reads: served_storage.hpp), `fetch`, `fill` and
// `schedule_fill` (its misses); and those of the ops of NVIDIA's HPS plugin
// (libsok_tf_hps_compat.so): `nvidia_init`, `nvidia_lookup`. A graph's context names the ps_config
// file (NVIDIA's Lookup: the one its Init named), the model and the table; the process's Server
// (server.hpp) of that file answers. So a SavedModel of HPS's layers, or of NVIDIA's plugin, serves
// from a C++ process. In a Python process the Python server answers (the dispatch prefers Python).
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "json.hpp"
#include "model_files.hpp"
#include "ps_config.hpp"
#include "served_storage.hpp"
#include "server.hpp"
#include "sok/tf/calls.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace sok {
namespace hps {
namespace {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// graph_context's names of the functions, which the graphs hold and which never change.
constexpr char kLookup[] = "hierarchical_parameter_server.graph_calls:lookup";
constexpr char kFetch[] = "hierarchical_parameter_server.graph_calls:fetch";
constexpr char kFill[] = "hierarchical_parameter_server.graph_calls:fill";
constexpr char kScheduleFill[] = "hierarchical_parameter_server.graph_calls:schedule_fill";
constexpr char kCacheTable[] = "hierarchical_parameter_server.graph_calls:cache_table";
constexpr char kVolatileTable[] = "hierarchical_parameter_server.graph_calls:volatile_table";
constexpr char kNvidiaInit[] = "hierarchical_parameter_server.graph_calls:nvidia_init";
constexpr char kNvidiaLookup[] = "hierarchical_parameter_server.graph_calls:nvidia_lookup";

struct Context {
  std::string ps_config_file;
  std::string model;
  int64_t table_id = 0;
  int64_t dim = -1;             // -1: not recorded
  std::string key_dtype;        // "": not recorded
};

// graph_context._context's JSON.
Context context_of(const std::string& text) {
  const json::Value v = json::parse(text);
  Context c;
  c.ps_config_file = v.find("ps_config_file")->as_string();
  c.model = v.find("model")->as_string();
  c.table_id = v.find("table_id")->as_int();
  if (const json::Value* dim = v.find("dim")) c.dim = dim->as_int();
  if (const json::Value* key_dtype = v.find("key_dtype")) c.key_dtype = key_dtype->as_string();
  return c;
}

// The server and table a graph's context names, checked against what the graph was traced for
// (graph_calls.served_table, graph_context.check_traced: their messages).
Status served(const std::string& what, const std::string& text, std::shared_ptr<Server>* server,
              const ServedTable** table) {
  Context c;
  try {
    c = context_of(text);
  } catch (const std::exception& e) {
    return errors::InvalidArgument(what, ": the graph's context is not one HPS writes (", e.what(), "): ", text);
  }
  if (c.ps_config_file.empty()) {
    return errors::FailedPrecondition(
        what, ": the graph names no ps_config file (it was traced on a server not started from one), and a process "
              "without Python has no hps.Init to start HPS from; export the model with HPS started by hps.Init "
              "(ps_config_file=...) or with the layers' ps_config_file set");
  }
  try {
    *server = Server::of(c.ps_config_file);
    *table = &(*server)->table(c.model, c.table_id);
  } catch (const std::exception& e) {  // ConfigError, ModelFileError, row_storage's std::runtime_error
    return errors::InvalidArgument(what, ": ", e.what());
  }
  const std::string key_dtype = (*table)->int64_keys ? "int64" : "int32";
  if ((c.dim >= 0 && c.dim != (*table)->dim) || (!c.key_dtype.empty() && c.key_dtype != key_dtype)) {
    return errors::InvalidArgument(
        what, ": model '", c.model, "' table ", c.table_id, " was traced for width ", c.dim, " and keys of ",
        c.key_dtype, ", and the ps_config '", c.ps_config_file, "' serves it at width ", (*table)->dim,
        " with keys of ", key_dtype,
        ": the graph would read the wrong columns. Re-export the model (trace it again) against the table as it "
        "is now, or serve it with the ps_config and model files it was exported with");
  }
  return Status();
}

// What a call does with its keys: the whole lookup (Server::lookup), or the rows of a lookup graph's
// misses from the databases (Server::fetch), filling the cache (Server::fill).
enum class Rows { kLookup, kFetch, kFill };

// The keys of input 0 (the table's key dtype, any shape) as int64, into *wide where they are int32;
// checked as ServedTable.check_call and _checked_count do (check_count).
Status int64_keys(OpKernelContext* ctx, const Tensor& keys, const std::string& what, const ServedTable& table,
                  bool check_count, Tensor* wide, const int64_t** out) {
  const int64_t n = keys.NumElements();
  const auto wanted = table.int64_keys ? ::tensorflow::DT_INT64 : ::tensorflow::DT_INT32;
  if (keys.dtype() != wanted) {  // ServedTable.check_call's message
    const std::string key_dtype = ::tensorflow::DataTypeString(wanted);
    return errors::InvalidArgument(what, ": ids of ", table.tag, " are ", ::tensorflow::DataTypeString(keys.dtype()),
                                   " but the ps_config's supportlonglong is ", table.int64_keys ? "true" : "false",
                                   ", so keys are ", key_dtype, "; cast the ids (tf.cast(ids, tf.", key_dtype,
                                   ")) or set \"supportlonglong\": ", table.int64_keys ? "false" : "true");
  }
  if (check_count && n > table.max_keys) {  // ServedTable._checked_count's message
    return errors::InvalidArgument(
        what, ": HPS lookup of ", table.tag, ": more keys than max_batch_size x "
        "maxnum_catfeature_query_per_table_per_sample = ", table.max_keys,
        "; raise them in the ps_config or pass a smaller batch; keys: ", n);
  }
  if (keys.dtype() == ::tensorflow::DT_INT64) {
    *out = keys.flat<int64_t>().data();
    return Status();
  }
  // in host memory: the kernel runs on the host even where TensorFlow placed SokPyCall on a GPU (its
  // inputs and outputs are host memory there; a temporary would be the GPU's)
  ::tensorflow::AllocatorAttributes on_host;
  on_host.set_on_host(true);
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n}), wide, on_host));
  auto narrow = keys.flat<int32_t>();
  auto widened = wide->flat<int64_t>();
  for (int64_t i = 0; i < n; ++i) widened(i) = narrow(i);
  *out = widened.data();
  return Status();
}

// Output 0 = the rows of input 0 (keys of the table's key dtype, any shape): keys.shape + [dim].
Status rows_of_keys(OpKernelContext* ctx, const Tensor& keys, const std::string& what,
                    const std::shared_ptr<Server>& server, const ServedTable& table, Rows how) {
  Tensor wide;
  const int64_t* k = nullptr;
  TF_RETURN_IF_ERROR(int64_keys(ctx, keys, what, table, /*check_count=*/how == Rows::kLookup, &wide, &k));
  TensorShape shape = keys.shape();
  TF_RETURN_IF_ERROR(shape.AddDimWithStatus(table.dim));
  Tensor* rows = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, shape, &rows));
  try {
    float* out = rows->flat<float>().data();
    if (how == Rows::kLookup) {
      server->lookup(table, k, keys.NumElements(), out);
    } else if (how == Rows::kFetch) {
      server->fetch(table, k, keys.NumElements(), out);
    } else {
      server->fill(table, k, keys.NumElements(), out);
    }
  } catch (const std::exception& e) {
    return errors::Internal(what, ": ", e.what());
  }
  return Status();
}

std::string what_of(const char* function) {
  return std::string("SokPyCall of ") + function + " (served without Python)";
}

// graph_calls.lookup: the whole lookup of a layer traced while HPS was not running.
Status lookup(OpKernelContext* ctx, const std::string& text, const std::vector<const Tensor*>& inputs) {
  const std::string what = what_of(kLookup);
  std::shared_ptr<Server> server;
  const ServedTable* table = nullptr;
  TF_RETURN_IF_ERROR(served(what, text, &server, &table));
  return rows_of_keys(ctx, *inputs.at(0), what, server, *table, Rows::kLookup);
}

// graph_calls.fetch and fill: the databases' rows of the keys the graph's table lacked; fill writes
// them into an evicting cache.
Status misses(const char* function, Rows how, OpKernelContext* ctx, const std::string& text,
              const std::vector<const Tensor*>& inputs) {
  const std::string what = what_of(function);
  std::shared_ptr<Server> server;
  const ServedTable* table = nullptr;
  TF_RETURN_IF_ERROR(served(what, text, &server, &table));
  return rows_of_keys(ctx, *inputs.at(0), what, server, *table, how);
}

Status fetch(OpKernelContext* ctx, const std::string& text, const std::vector<const Tensor*>& inputs) {
  return misses(kFetch, Rows::kFetch, ctx, text, inputs);
}

Status fill(OpKernelContext* ctx, const std::string& text, const std::vector<const Tensor*>& inputs) {
  return misses(kFill, Rows::kFill, ctx, text, inputs);
}

// graph_calls.schedule_fill: the keys' fetch in the server's background threads; True.
Status schedule_fill(OpKernelContext* ctx, const std::string& text, const std::vector<const Tensor*>& inputs) {
  const std::string what = what_of(kScheduleFill);
  std::shared_ptr<Server> server;
  const ServedTable* table = nullptr;
  TF_RETURN_IF_ERROR(served(what, text, &server, &table));
  Tensor wide;
  const int64_t* k = nullptr;
  TF_RETURN_IF_ERROR(int64_keys(ctx, *inputs.at(0), what, *table, /*check_count=*/false, &wide, &k));
  server->schedule_fill(*table, k, inputs.at(0)->NumElements());
  Tensor* done = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({}), &done));
  done->scalar<bool>()() = true;
  return Status();
}

// graph_calls.cache_table and volatile_table: the table the graph's SokFind reads, with keys of the
// table's key dtype (the cache's) or int64 (the volatile DB's).
Status resolve(const char* function, const char* tier, const std::string& text, int32_t key_type, int64_t* address) {
  const std::string what = std::string("SokResolveTable by ") + function + " (served without Python)";
  std::shared_ptr<Server> server;
  const ServedTable* table = nullptr;
  TF_RETURN_IF_ERROR(served(what, text, &server, &table));
  if (key_type < 0) key_type = table->int64_keys ? SOK_KEY_INT64 : SOK_KEY_INT32;
  try {
    *address = reinterpret_cast<intptr_t>(served_table_ref(server, *table, tier, key_type));
  } catch (const std::exception& e) {
    return errors::InvalidArgument(what, ": ", e.what());
  }
  return Status();
}

Status cache_table(const std::string& text, int64_t* address) {
  return resolve(kCacheTable, "cache", text, -1, address);
}
Status volatile_table(const std::string& text, int64_t* address) {
  return resolve(kVolatileTable, "volatile", text, SOK_KEY_INT64, address);
}

// The server of NVIDIA's Init: the first one's, for the process (later Inits change nothing, as the
// plugin's and graph_calls.nvidia_init).
std::mutex initialised_mu;
std::shared_ptr<Server> initialised;

// graph_calls.nvidia_init: the server of the op's ps_config_file, unless one is initialised already.
Status nvidia_init(OpKernelContext*, const std::string& text, const std::vector<const Tensor*>&) {
  std::lock_guard<std::mutex> lock(initialised_mu);
  if (initialised != nullptr) return Status();
  try {
    initialised = Server::of(json::parse(text).find("ps_config_file")->as_string());
  } catch (const std::exception& e) {
    return errors::InvalidArgument("Init (NVIDIA HPS, served without Python): ", e.what());
  }
  return Status();
}

// graph_calls.nvidia_lookup: the rows of the keys (any shape) in the initialised server's table.
Status nvidia_lookup(OpKernelContext* ctx, const std::string& text, const std::vector<const Tensor*>& inputs) {
  const std::string what = "Lookup (NVIDIA HPS, served without Python)";
  std::shared_ptr<Server> server;
  {
    std::lock_guard<std::mutex> lock(initialised_mu);
    server = initialised;
  }
  if (server == nullptr) {
    return errors::FailedPrecondition(what, ": HPS is not initialised: run the model's Init op first");
  }
  const ServedTable* table = nullptr;
  int64_t width = 0;
  try {
    const json::Value fields = json::parse(text);
    table = &server->table(fields.find("model_name")->as_string(), fields.find("table_id")->as_int());
    width = fields.find("emb_vec_size")->as_int();
  } catch (const std::exception& e) {
    return errors::InvalidArgument(what, ": ", e.what());
  }
  if (width != table->dim) {  // ServedTable.check_call's message
    return errors::InvalidArgument(what, ": emb_vec_size ", width, " of Lookup (NVIDIA HPS) is not the width of table ",
                                   table->table_id, " of model '", table->model, "': the ps_config says ", table->dim,
                                   " (embedding_vecsize_per_table); pass emb_vec_size=", table->dim);
  }
  return rows_of_keys(ctx, *inputs.at(0), what, server, *table, Rows::kLookup);
}

bool register_all() {
  constexpr char kLibrary[] = "libsok_hps_serving.so";
  return sok_tf::register_with_sok_ops(kLookup, &lookup, nullptr, kLibrary) &&
         sok_tf::register_with_sok_ops(kFetch, &fetch, nullptr, kLibrary) &&
         sok_tf::register_with_sok_ops(kFill, &fill, nullptr, kLibrary) &&
         sok_tf::register_with_sok_ops(kScheduleFill, &schedule_fill, nullptr, kLibrary) &&
         sok_tf::register_with_sok_ops(kCacheTable, nullptr, &cache_table, kLibrary) &&
         sok_tf::register_with_sok_ops(kVolatileTable, nullptr, &volatile_table, kLibrary) &&
         sok_tf::register_with_sok_ops(kNvidiaInit, &nvidia_init, nullptr, kLibrary) &&
         sok_tf::register_with_sok_ops(kNvidiaLookup, &nvidia_lookup, nullptr, kLibrary);
}

[[maybe_unused]] const bool registered = register_all();

}  // namespace
}  // namespace hps
}  // namespace sok
