// The two ops of SavedModels exported with NVIDIA's HPS TensorFlow plugin, `Init` and `Lookup`,
// with the plugin's names, inputs and attrs (libsok_tf_hps_compat.so), so that such a SavedModel
// loads and serves with hierarchical_parameter_server. Their kernels compute
// hierarchical_parameter_server.graph_calls' nvidia_init and nvidia_lookup by name through sok-core's
// op library (sok/tf/calls.h): the Python functions in a Python process, the natives of
// libsok_hps_serving.so in a process with no Python (load sok-core's libsok_tf_ops.so first). A
// library of its own, because the generic names could clash with another library's ops, and a clash
// must not take SOK's other ops with it. No Python in it.
//
// Init(global_replica_id, num_replicas_in_sync, visible_devices) -> status "OK": initialises HPS
// from the ps_config_file attr, once per process (later calls change nothing).
// Lookup(values, global_replica_id, init_status) -> emb_vector [values.shape + emb_vec_size]: the
// rows of `values` in table `table_id` of `model_name`, after checking that Init said "OK".
// Inputs and outputs are host memory on every device.
#include <cstdio>
#include <string>
#include <vector>

#include "sok/tf/calls.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_tf_hps_compat {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;
namespace errors = ::tensorflow::errors;

constexpr char kLibrary[] = "libsok_tf_hps_compat.so";

constexpr char kInit[] = "hierarchical_parameter_server.graph_calls:nvidia_init";
constexpr char kLookup[] = "hierarchical_parameter_server.graph_calls:nvidia_lookup";

// A JSON string literal of `text` (the contexts hold file paths and model names).
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

class NvidiaInitOp : public OpKernel {
 public:
  explicit NvidiaInitOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string path;
    int64_t batch = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ps_config_file", &path));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("global_batch_size", &batch));
    context_ = "{\"ps_config_file\": " + json_string(path) + ", \"global_batch_size\": " + std::to_string(batch) + "}";
  }

  void Compute(OpKernelContext* ctx) override {
    const sok_tf::CallFunction call = sok_tf::call_function(kLibrary);
    OP_REQUIRES(ctx, call != nullptr, errors::FailedPrecondition("Init (NVIDIA HPS): load libsok_tf_ops.so first"));
    OP_REQUIRES_OK(ctx, call(ctx, kInit, context_, {}, {}));
    Tensor* status = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &status));
    status->scalar<::tensorflow::tstring>()() = "OK";
  }

 private:
  std::string context_;
};

class NvidiaLookupOp : public OpKernel {
 public:
  explicit NvidiaLookupOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string model;
    int64_t table = 0, width = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("model_name", &model));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_id", &table));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("emb_vec_size", &width));
    context_ = "{\"model_name\": " + json_string(model) + ", \"table_id\": " + std::to_string(table) +
               ", \"emb_vec_size\": " + std::to_string(width) + "}";
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& status = ctx->input(2);
    OP_REQUIRES(ctx, status.NumElements() == 1 && status.flat<::tensorflow::tstring>()(0) == "OK",
                errors::FailedPrecondition("Lookup (NVIDIA HPS): hierarchical parameter server is not initialized "
                                           "(init_status is not \"OK\")"));
    const sok_tf::CallFunction call = sok_tf::call_function(kLibrary);
    OP_REQUIRES(ctx, call != nullptr, errors::FailedPrecondition("Lookup (NVIDIA HPS): load libsok_tf_ops.so first"));
    OP_REQUIRES_OK(ctx, call(ctx, kLookup, context_, {&ctx->input(0)}, {::tensorflow::DT_FLOAT}));
  }

 private:
  std::string context_;
};

// The plugin's op definitions (reference: its REGISTER_OPs), shapes aside: emb_vector is
// values.shape + [emb_vec_size] here, where the plugin left it to its Python layer.
REGISTER_OP("Init")
    .Input("global_replica_id: int32")
    .Input("num_replicas_in_sync: int32")
    .Input("visible_devices: int32")
    .Attr("ps_config_file: string")
    .Attr("global_batch_size: int >= 1")
    .Output("status: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("Lookup")
    .Input("values: value_dtype")
    .Input("global_replica_id: int32")
    .Output("emb_vector: dtype")
    .Attr("value_dtype: {int32, int64}")
    .Attr("model_name: string")
    .Attr("table_id: int")
    .Attr("emb_vec_size: int")
    .Attr("dtype: {float32}")
    .Input("init_status: status_dtype")
    .Attr("status_dtype: {string}")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t width = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("emb_vec_size", &width));
      ::tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->Concatenate(c->input(0), c->Vector(width), &out));
      c->set_output(0, out);
      return Status();
    });

REGISTER_KERNEL_BUILDER(Name("Init").Device(::tensorflow::DEVICE_CPU), NvidiaInitOp);
REGISTER_KERNEL_BUILDER(Name("Init")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("global_replica_id")
                            .HostMemory("num_replicas_in_sync")
                            .HostMemory("visible_devices")
                            .HostMemory("status"),
                        NvidiaInitOp);
REGISTER_KERNEL_BUILDER(Name("Lookup").Device(::tensorflow::DEVICE_CPU), NvidiaLookupOp);
REGISTER_KERNEL_BUILDER(Name("Lookup")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("values")
                            .HostMemory("global_replica_id")
                            .HostMemory("init_status")
                            .HostMemory("emb_vector"),
                        NvidiaLookupOp);

}  // namespace sok_tf_hps_compat
