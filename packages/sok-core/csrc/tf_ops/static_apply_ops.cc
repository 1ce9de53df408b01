// SokSparseApplyAdagradTables: Keras 3 Adagrad's step on the rows of IndexedSlices gradients of
// several static tables (resource variables) in one op, and its CPU kernel (static_apply.h says
// what it computes). One op per step for all tables instead of about ten per table, with no
// host round trip on the GPU (static_apply_ops_gpu.cc). Results equal Keras' own ops to the bit on
// the CPU: the same operations in the same order, each rounded (no fused multiply-add).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "static_apply.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_tf {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using static_apply::Table;

REGISTER_OP("SokSparseApplyAdagradTables")
    .Input("tables: N * resource")
    .Input("accumulators: N * resource")
    .Input("learning_rate: float")
    .Input("indices: N * int64")
    .Input("grads: N * float")
    .Attr("N: int >= 1")
    .Attr("epsilon: float")
    .Attr("check_indices: bool = true")
    .Attr("row_wise: bool = false")
    .Attr("names: list(string)")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Keras 3 Adagrad's sparse step on N static tables: accumulators[t][indices[t][i]] += grads[t][i]^2, "
         "then tables[t][indices[t][i]] -= learning_rate * grads[t][i] / sqrt(accumulator row + epsilon). "
         "check_indices=false: indices from SokPooledLookupGrad, whose padding rows (index -1) are skipped; the "
         "GPU kernel then checks nothing. row_wise=true: sok.RowWiseAdagrad's step (accumulators [rows, 1]: "
         "accumulator[i] += mean(grads[t][i]^2), tables[t][i] -= learning_rate * grads[t][i] / "
         "(sqrt(accumulator[i]) + epsilon)) on distinct indices.");

class SparseApplyAdagradTablesOp : public OpKernel {
 public:
  explicit SparseApplyAdagradTablesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_indices", &check_indices_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("row_wise", &row_wise_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("names", &names_));
  }

  void Compute(OpKernelContext* ctx) override {
    static_apply::LockedVariables locks;
    std::vector<Table> tables;
    const Tensor* learning_rate = nullptr;
    OP_REQUIRES_OK(ctx, static_apply::gather(ctx, names_, row_wise_, &locks, &tables, &learning_rate));
    const float lr = learning_rate->scalar<float>()();
    // Every index of every table is checked before anything is written (on the CPU it costs little);
    // without check_indices, -1 is a padding row (skipped).
    for (size_t t = 0; t < tables.size(); ++t) {
      const Table& x = tables[t];
      const auto idx = x.indices->flat<int64_t>();
      int64_t first = -1, bad = 0;
      for (int64_t i = 0; i < x.count; ++i) {
        if (static_cast<uint64_t>(idx(i)) >= static_cast<uint64_t>(x.rows) && (check_indices_ || idx(i) != -1)) {
          if (first < 0) first = i;
          ++bad;
        }
      }
      if (bad > 0) {
        ctx->SetStatus(static_apply::bad_index(names_, x, static_cast<int>(t), first, idx(first), bad));
        return;
      }
    }
    const auto copy = [](const char* from, char* to, size_t bytes) {
      std::memcpy(to, from, bytes);
      return Status();
    };
    OP_REQUIRES_OK(ctx, static_apply::prepare_in_place_writes(ctx, tables, copy));
    for (const Table& x : tables) {
      if (row_wise_) {
        with_row_type(x.row_type, [&](auto row) { apply_row_wise<decltype(row)>(x, lr); });
      } else {
        apply(x, lr);
      }
    }
  }

 private:
  // The buffers of one table's step (after prepare_in_place_writes).
  // Row: the table's C++ row type.
  template <class Row>
  struct Buffers {
    explicit Buffers(const Table& x)
        : w(reinterpret_cast<Row*>(const_cast<char*>(x.var->tensor()->tensor_data().data()))),
          acc(x.accumulator->tensor()->flat<float>().data()),
          idx(x.indices->flat<int64_t>().data()),
          g(x.grads->flat<float>().data()) {}
    Row* w;
    float* acc;
    const int64_t* idx;
    const float* g;
  };

  // sok.RowWiseAdagrad's step, row after row (the rows are distinct); the mean of the squares summed
  // in column order; rows read widened to float, stored rounded to nearest even.
  template <class Row>
  void apply_row_wise(const Table& x, float lr) const {
    const Buffers<Row> b(x);
    const int64_t d = x.dim;
    for (int64_t i = 0; i < x.count; ++i) {
      if (b.idx[i] < 0) continue;  // padding
      const float* gi = b.g + i * d;
      float squares = 0.0f;
      for (int64_t c = 0; c < d; ++c) squares = squares + gi[c] * gi[c];
      float& a = b.acc[b.idx[i]];
      a = a + (d > 0 ? squares / static_cast<float>(d) : 0.0f);
      const float denominator = std::sqrt(a) + epsilon_;
      Row* row = b.w + b.idx[i] * d;
      for (int64_t c = 0; c < d; ++c) row[c] = static_cast<Row>(static_cast<float>(row[c]) - lr * gi[c] / denominator);
    }
  }

  // Keras 3 Adagrad's step: every accumulator row first, then every table row.
  void apply(const Table& x, float lr) const {
    const Buffers<float> b(x);
    const int64_t d = x.dim;
    for (int64_t i = 0; i < x.count; ++i) {
      if (b.idx[i] < 0) continue;  // padding
      float* a = b.acc + b.idx[i] * d;
      const float* gi = b.g + i * d;
      for (int64_t c = 0; c < d; ++c) {
        const float square = gi[c] * gi[c];
        a[c] = a[c] + square;
      }
    }
    for (int64_t i = 0; i < x.count; ++i) {
      if (b.idx[i] < 0) continue;  // padding
      float* row = b.w + b.idx[i] * d;
      const float* a = b.acc + b.idx[i] * d;
      const float* gi = b.g + i * d;
      for (int64_t c = 0; c < d; ++c) {
        const float denominator = std::sqrt(a[c] + epsilon_);
        const float step = lr * gi[c];
        row[c] = row[c] - step / denominator;
      }
    }
  }

  float epsilon_ = 0.0f;
  bool check_indices_ = true;
  bool row_wise_ = false;
  std::vector<std::string> names_;
};

REGISTER_KERNEL_BUILDER(Name("SokSparseApplyAdagradTables").Device(DEVICE_CPU), SparseApplyAdagradTablesOp);

}  // namespace
}  // namespace sok_tf
