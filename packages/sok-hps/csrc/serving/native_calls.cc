// libsok_hps_serving.so: HPS's lookups where no Python runs. Loaded after sok-core's
// libsok_tf_ops.so (TF_LoadLibrary, or tf.load_op_library), it registers with it (sok/tf/calls.h)
// native implementations of the functions of hierarchical_parameter_server.graph_calls that HPS's
// lookup graphs name: `lookup` (the whole lookup of a layer traced while HPS was not running:
// NVIDIA's flow, the model saved before hps.Init), and those of a graph traced on a running server:
// `cache_table` and `volatile_table` (the tables its SokFind reads: served_storage.hpp), `fetch`,
// `fill` and `schedule_fill` (its misses). Each context names the ps_config file, the model and the
// table; the process's Server (server.hpp) of that file answers. A SavedModel of HPS's layers then
// serves from a C++ process. In a Python process the Python server answers (the dispatch prefers
// Python).
#include <exception>
#include <memory>
#include <string>

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
  } catch (const std::exception& e) {  // ConfigError, ModelFileError, a tier's std::invalid_argument
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

// Output 0 = the rows of input 0 (keys of the table's key dtype, any shape): keys.shape + [dim].
Status rows_of_keys(OpKernelContext* ctx, const std::string& what, const std::shared_ptr<Server>& server,
                    const ServedTable& table, bool check_count) {
  const Tensor& keys = ctx->input(0);
  const int64_t n = keys.NumElements();
  const auto wanted = table.int64_keys ? ::tensorflow::DT_INT64 : ::tensorflow::DT_INT32;
  if (keys.dtype() != wanted) {
    return errors::InvalidArgument(what, ": keys of ", table.tag, " are ", ::tensorflow::DataTypeString(keys.dtype()),
                                   " but the ps_config's supportlonglong says ",
                                   ::tensorflow::DataTypeString(wanted));
  }
  if (check_count && n > table.max_keys) {  // ServedTable._checked_count's message
    return errors::InvalidArgument(
        what, ": HPS lookup of ", table.tag, ": more keys than max_batch_size x "
        "maxnum_catfeature_query_per_table_per_sample = ", table.max_keys,
        "; raise them in the ps_config or pass a smaller batch; keys: ", n);
  }
  TensorShape shape = keys.shape();
  TF_RETURN_IF_ERROR(shape.AddDimWithStatus(table.dim));
  Tensor* rows = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, shape, &rows));
  Tensor wide;
  const int64_t* k = nullptr;
  if (keys.dtype() == ::tensorflow::DT_INT64) {
    k = keys.flat<int64_t>().data();
  } else {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n}), &wide));
    auto narrow = keys.flat<int32_t>();
    auto out = wide.flat<int64_t>();
    for (int64_t i = 0; i < n; ++i) out(i) = narrow(i);
    k = out.data();
  }
  try {
    server->lookup(table, k, n, rows->flat<float>().data());
  } catch (const std::exception& e) {
    return errors::Internal(what, ": ", e.what());
  }
  return Status();
}

std::string what_of(const char* function) {
  return std::string("SokPyCall of ") + function + " (served without Python)";
}

// graph_calls.lookup: the whole lookup of a layer traced while HPS was not running.
Status lookup(OpKernelContext* ctx, const std::string& text) {
  const std::string what = what_of(kLookup);
  std::shared_ptr<Server> server;
  const ServedTable* table = nullptr;
  TF_RETURN_IF_ERROR(served(what, text, &server, &table));
  return rows_of_keys(ctx, what, server, *table, /*check_count=*/true);
}

// graph_calls.fetch and fill: the rows of the keys the graph's table lacked (the default value: the
// C++ server's table holds every row the model files have, and nothing else can).
Status fetch(OpKernelContext* ctx, const std::string& text) {
  const std::string what = what_of(kFetch);
  std::shared_ptr<Server> server;
  const ServedTable* table = nullptr;
  TF_RETURN_IF_ERROR(served(what, text, &server, &table));
  return rows_of_keys(ctx, what, server, *table, /*check_count=*/false);
}

// graph_calls.schedule_fill: True (there is nothing to fill: the table holds every row).
Status schedule_fill(OpKernelContext* ctx, const std::string& text) {
  std::shared_ptr<Server> server;
  const ServedTable* table = nullptr;
  TF_RETURN_IF_ERROR(served(what_of(kScheduleFill), text, &server, &table));
  Tensor* done = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({}), &done));
  done->scalar<bool>()() = true;
  return Status();
}

// graph_calls.cache_table and volatile_table: the table the graph's SokFind reads, with keys of the
// table's key dtype (the cache's) or int64 (the volatile DB's).
Status resolve(const char* function, const std::string& text, int32_t key_type, int64_t* address) {
  std::shared_ptr<Server> server;
  const ServedTable* table = nullptr;
  TF_RETURN_IF_ERROR(served(std::string("SokResolveTable by ") + function + " (served without Python)", text,
                            &server, &table));
  if (key_type < 0) key_type = table->int64_keys ? SOK_KEY_INT64 : SOK_KEY_INT32;
  *address = reinterpret_cast<intptr_t>(served_table_ref(server, *table, key_type));
  return Status();
}

Status cache_table(const std::string& text, int64_t* address) { return resolve(kCacheTable, text, -1, address); }
Status volatile_table(const std::string& text, int64_t* address) {
  return resolve(kVolatileTable, text, SOK_KEY_INT64, address);
}

bool register_all() {
  constexpr char kLibrary[] = "libsok_hps_serving.so";
  return sok_tf::register_with_sok_ops(kLookup, &lookup, nullptr, kLibrary) &&
         sok_tf::register_with_sok_ops(kFetch, &fetch, nullptr, kLibrary) &&
         sok_tf::register_with_sok_ops(kFill, &fetch, nullptr, kLibrary) &&
         sok_tf::register_with_sok_ops(kScheduleFill, &schedule_fill, nullptr, kLibrary) &&
         sok_tf::register_with_sok_ops(kCacheTable, nullptr, &cache_table, kLibrary) &&
         sok_tf::register_with_sok_ops(kVolatileTable, nullptr, &volatile_table, kLibrary);
}

[[maybe_unused]] const bool registered = register_all();

}  // namespace
}  // namespace hps
}  // namespace sok
