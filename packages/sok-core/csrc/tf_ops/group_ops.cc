// SokGroupByKey: a stable order that groups small integer keys, and each group's count, without a
// comparison sort. sok.lookup_sparse's exchange groups its ids by owner rank, then by table, with
// it: TensorFlow's argsort (TopKV2) and bincount take no int64 keys on the GPU, so under a GPU they
// ran on the host, with every id copied there and back. The DEVICE_GPU kernel is group_ops_gpu.cc.
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_tf {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;
using ::tensorflow::shape_inference::InferenceContext;

REGISTER_OP("SokGroupByKey")
    .Input("keys: int64")
    .Output("order: int64")
    .Output("counts: int64")
    .Attr("num_groups: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int64_t groups = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_groups", &groups));
      c->set_output(0, c->Vector(c->NumElements(c->input(0))));
      c->set_output(1, c->Vector(groups));
      return Status();
    })
    .Doc("order: the indices of keys (a vector of values in [0, num_groups)), grouped by key in ascending "
         "order, ascending within a group (a stable sort by key); counts: how many keys each group has. The CPU "
         "kernel refuses a key outside [0, num_groups); the GPU kernel does not check (it sorts such a key last and "
         "counts it nowhere).");

class GroupByKeyOp : public OpKernel {
 public:
  explicit GroupByKeyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_groups", &num_groups_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys_t = ctx->input(0);
    OP_REQUIRES(ctx, keys_t.dims() == 1,
                errors::InvalidArgument("SokGroupByKey: keys has shape ", keys_t.shape().DebugString(),
                                        "; it takes a vector"));
    const auto keys = keys_t.flat<int64_t>();
    const int64_t n = keys.size();
    Tensor* order_t = nullptr;
    Tensor* counts_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &order_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({num_groups_}), &counts_t));
    auto counts = counts_t->flat<int64_t>();
    counts.setZero();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = keys(i);
      OP_REQUIRES(ctx, k >= 0 && k < num_groups_,
                  errors::InvalidArgument("SokGroupByKey: keys[", i, "] = ", k, " is outside [0, ", num_groups_,
                                          ")"));
      ++counts(k);
    }
    std::vector<int64_t> next(num_groups_, 0);  // where each group's next index goes
    for (int64_t g = 1; g < num_groups_; ++g) next[g] = next[g - 1] + counts(g - 1);
    auto order = order_t->flat<int64_t>();
    for (int64_t i = 0; i < n; ++i) order(next[keys(i)]++) = i;
  }

 private:
  int64_t num_groups_ = 1;
};
REGISTER_KERNEL_BUILDER(Name("SokGroupByKey").Device(DEVICE_CPU), GroupByKeyOp);

}  // namespace
}  // namespace sok_tf
