// libsok_hps_serving.so: HPS's lookups where no Python runs. Loaded after sok-core's
// libsok_tf_ops.so (TF_LoadLibrary, or tf.load_op_library), it registers with it (sok/tf/calls.h)
// the native implementation of hierarchical_parameter_server.graph_calls:lookup, which the lookup
// graph of a layer traced while HPS was not running holds (a SokPyCall; NVIDIA's flow: the model
// saved before hps.Init). A SavedModel of such layers then serves from a C++ process: the context
// names the ps_config file, the model and the table, and the process's Server (server.hpp) of that
// file answers. In a Python process the Python server answers (the dispatch prefers Python).
#include <exception>
#include <memory>
#include <string>

#include "json.hpp"
#include "model_files.hpp"
#include "ps_config.hpp"
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

// graph_context.LOOKUP: the name the graphs hold, which never changes.
constexpr char kLookup[] = "hierarchical_parameter_server.graph_calls:lookup";

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

Status lookup(OpKernelContext* ctx, const std::string& text) {
  const std::string what = std::string("SokPyCall of ") + kLookup + " (served without Python)";
  Context c;
  try {
    c = context_of(text);
  } catch (const std::exception& e) {
    return errors::InvalidArgument(what, ": the graph's context is not one HPS's layers write (", e.what(),
                                   "): ", text);
  }
  if (c.ps_config_file.empty()) {
    return errors::FailedPrecondition(
        what, ": the layer that traced this lookup had no ps_config_file, and a process without Python has no "
              "hps.Init to start HPS from; export the model with the layers' ps_config_file set");
  }
  std::shared_ptr<Server> server;
  const ServedTable* table = nullptr;
  try {
    server = Server::of(c.ps_config_file);
    table = &server->table(c.model, c.table_id);
  } catch (const std::exception& e) {  // ConfigError, ModelFileError, a tier's std::invalid_argument
    return errors::InvalidArgument(what, ": ", e.what());
  }
  const std::string key_dtype = table->int64_keys ? "int64" : "int32";
  if ((c.dim >= 0 && c.dim != table->dim) || (!c.key_dtype.empty() && c.key_dtype != key_dtype)) {
    return errors::InvalidArgument(  // graph_context.check_traced's message
        what, ": model '", c.model, "' table ", c.table_id, " was traced for width ", c.dim, " and keys of ",
        c.key_dtype, ", and the ps_config '", c.ps_config_file, "' serves it at width ", table->dim,
        " with keys of ", key_dtype,
        ": the graph would read the wrong columns. Re-export the model (trace it again) against the table as it "
        "is now, or serve it with the ps_config and model files it was exported with");
  }
  const Tensor& keys = ctx->input(0);
  const int64_t n = keys.NumElements();
  const auto wanted = table->int64_keys ? ::tensorflow::DT_INT64 : ::tensorflow::DT_INT32;
  if (keys.dtype() != wanted) {
    return errors::InvalidArgument(what, ": keys of ", table->tag, " are ", ::tensorflow::DataTypeString(keys.dtype()),
                                   " but the ps_config's supportlonglong says ", key_dtype);
  }
  if (n > table->max_keys) {
    return errors::InvalidArgument(
        what, ": HPS lookup of ", table->tag, ": more keys than max_batch_size x "
        "maxnum_catfeature_query_per_table_per_sample = ", table->max_keys,
        "; raise them in the ps_config or pass a smaller batch; keys: ", n);
  }
  TensorShape shape = keys.shape();
  TF_RETURN_IF_ERROR(shape.AddDimWithStatus(table->dim));
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
    server->lookup(*table, k, n, rows->flat<float>().data());
  } catch (const std::exception& e) {
    return errors::Internal(what, ": ", e.what());
  }
  return Status();
}

[[maybe_unused]] const bool registered =
    sok_tf::register_with_sok_ops(kLookup, &lookup, nullptr, "libsok_hps_serving.so");

}  // namespace
}  // namespace hps
}  // namespace sok
