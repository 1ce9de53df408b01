// TensorFlow ops of the training step of sok.DynamicVariable that are not a storage's own calls:
// SokUniqueSum, SokUniqueIndex and SokUniqueIndexList (distinct keys and their positions in one
// pass over a hash index), and SokSparseApply (one optimizer rule of sparse_rules.h on the rows of
// the distinct keys, read and written back through the storage's C ABI).
//
// This file holds their registrations and CPU kernels (libsok_tf_ops.so); their GPU kernels are in
// training_ops_gpu.cc (libsok_tf_ops_gpu.so).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cpu_ops.h"
#include "sok/kit/prefetch.hpp"
#include "sok/kit/rows.hpp"
#include "sparse_rules.h"
#include "storage_ops.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_tf {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpInputList;
using ::tensorflow::OpOutputList;
using ::tensorflow::shape_inference::InferenceContext;

// The distinct keys of keys (n,) in order of first occurrence into *distinct, and for each key the
// position of its distinct key into *position (n,): an open-addressing index of positions into
// *distinct (4 bytes a slot, so that the index of a large batch stays in the caches). The home slots
// are hashed in a pass of their own, which lets the probing pass prefetch a home slot further on
// without hashing twice (faster than hashing inside the probing loop).
template <typename K>
void index_distinct(int64_t n, const K* keys, std::vector<int32_t>* position, std::vector<K>* distinct) {
  int64_t slots = 16;
  while (slots < 2 * n) slots <<= 1;
  const uint64_t mask = static_cast<uint64_t>(slots - 1);
  std::vector<uint32_t> home(n);
  for (int64_t i = 0; i < n; ++i) home[i] = static_cast<uint32_t>(sok::hash_key(static_cast<uint64_t>(keys[i])) & mask);
  std::vector<int32_t> index(slots, -1);  // -1: empty
  position->resize(n);
  distinct->resize(n);
  K* found = distinct->data();
  int32_t* out = position->data();
  int32_t u = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i + sok::kPrefetchDistance < n) sok::prefetch(&index[home[i + sok::kPrefetchDistance]]);
    const K key = keys[i];
    uint64_t s = home[i];
    int32_t p;
    while ((p = index[s]) >= 0 && found[p] != key) s = (s + 1) & mask;
    if (p < 0) {
      p = u++;
      index[s] = p;
      found[p] = key;
    }
    out[i] = p;
  }
  distinct->resize(u);
}

// sums (u, w) = 0, then row i of values (n, w) added to row position[i] of sums, in batch order.
// (Splitting the distinct keys over threads measured slower: each part scans every position.)
inline void sum_rows(int64_t n, const int32_t* position, const float* __restrict__ values, int64_t w, int64_t u,
                     float* __restrict__ sums) {
  std::fill(sums, sums + u * w, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    float* __restrict__ dst = sums + static_cast<int64_t>(position[i]) * w;
    const float* __restrict__ src = values + i * w;
    for (int64_t c = 0; c < w; ++c) dst[c] += src[c];
  }
}

// Checks that input values_input is (n, width) for the n keys of input keys_input, n below 2**31
// (positions are int32).
inline Status check_key_rows(OpKernelContext* ctx, int keys_input, int values_input) {
  const int64_t n = ctx->input(keys_input).NumElements();
  const Tensor& values = ctx->input(values_input);
  if (values.dims() != 2 || values.dim_size(0) != n) {
    return errors::InvalidArgument("values must have shape [", n, ", width] (one row per key), got ",
                                   values.shape().DebugString());
  }
  return check_key_count(n);
}

// unique_keys, sums = the distinct keys (in order of first occurrence) and the sum of the rows of
// values per distinct key: tf.unique + unsorted_segment_sum in one pass over a hash index.
// The GPU kernel (training_ops_gpu.cc) gives the same bits.
template <typename K>
class UniqueSumOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, check_key_rows(ctx, 0, 1));
    const Tensor& keys = ctx->input(0);
    const Tensor& values = ctx->input(1);
    const int64_t n = keys.NumElements();
    const int64_t w = values.dim_size(1);
    std::vector<int32_t> position;
    std::vector<K> distinct;
    index_distinct(n, keys.flat<K>().data(), &position, &distinct);
    const int64_t u = static_cast<int64_t>(distinct.size());
    Tensor *unique_t = nullptr, *sums_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u}), &unique_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({u, w}), &sums_t));
    std::copy(distinct.begin(), distinct.end(), unique_t->flat<K>().data());
    sum_rows(n, position.data(), values.flat<float>().data(), w, u, sums_t->flat<float>().data());
  }
};

// distinct_keys, positions = the distinct keys (in order of first occurrence) and, per key, the row
// of its distinct key: tf.unique with int32 positions, over a hash index. Stateless and fed by the
// batch's keys alone, so TensorFlow can run it while the forward pass runs.
template <typename K>
class UniqueIndexOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, check_key_count(n));
    std::vector<int32_t> position;
    std::vector<K> distinct;
    index_distinct(n, keys.flat<K>().data(), &position, &distinct);
    Tensor *distinct_t = nullptr, *positions_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({static_cast<int64_t>(distinct.size())}), &distinct_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &positions_t));
    std::copy(distinct.begin(), distinct.end(), distinct_t->flat<K>().data());
    std::copy(position.begin(), position.end(), positions_t->flat<int32_t>().data());
  }
};

// SokUniqueIndexList: SokUniqueIndex of each of several key tensors (the dynamic tables of one
// lookup), one table per task on TensorFlow's intra-op threads.
class UniqueIndexListOp : public OpKernel {
 public:
  explicit UniqueIndexListOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, check_unique_index_list(ctx));
  }
  void Compute(OpKernelContext* ctx) override {
    OpInputList keys;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    const int num = keys.size();
    OP_REQUIRES_OK(ctx, check_key_counts(keys));
    std::vector<std::vector<int32_t>> positions(num);
    std::vector<std::vector<char>> distinct(num);  // the distinct keys' bytes
    in_parallel(ctx, num, int64_t{1} << 20, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) index_distinct_bytes(keys[t], &positions[t], &distinct[t]);
    });
    OpOutputList distinct_out, positions_out;
    OP_REQUIRES_OK(ctx, ctx->output_list("distinct_keys", &distinct_out));
    OP_REQUIRES_OK(ctx, ctx->output_list("positions", &positions_out));
    for (int t = 0; t < num; ++t) {
      const int64_t key_bytes = ::tensorflow::DataTypeSize(keys[t].dtype());
      const int64_t u = static_cast<int64_t>(distinct[t].size()) / key_bytes;
      Tensor *d = nullptr, *p = nullptr;
      OP_REQUIRES_OK(ctx, distinct_out.allocate(t, TensorShape({u}), &d));
      OP_REQUIRES_OK(ctx, positions_out.allocate(t, TensorShape({keys[t].NumElements()}), &p));
      std::memcpy(d->data(), distinct[t].data(), distinct[t].size());
      std::copy(positions[t].begin(), positions[t].end(), p->flat<int32_t>().data());
    }
  }

 private:
  // index_distinct of keys (any key type), the distinct keys as bytes.
  static void index_distinct_bytes(const Tensor& keys, std::vector<int32_t>* position, std::vector<char>* bytes) {
    switch (keys.dtype()) {
      case ::tensorflow::DT_INT32: return index_distinct_as<int32_t>(keys, position, bytes);
      case ::tensorflow::DT_UINT64: return index_distinct_as<uint64_t>(keys, position, bytes);
      default: return index_distinct_as<int64_t>(keys, position, bytes);
    }
  }

  template <typename K>
  static void index_distinct_as(const Tensor& keys, std::vector<int32_t>* position, std::vector<char>* bytes) {
    std::vector<K> distinct;
    index_distinct(keys.NumElements(), keys.flat<K>().data(), position, &distinct);
    const char* begin = reinterpret_cast<const char*>(distinct.data());
    bytes->assign(begin, begin + distinct.size() * sizeof(K));
  }
};

// The row-wise optimizer rules SokSparseApply runs natively, on one row: w (d,) the embedding,
// s its state columns (slot k at s + k * d; rowwise_adagrad's one accumulator at s[0]), g (d,) the
// summed gradient. Each repeats, operation for operation in float32, the formula of the TensorFlow
// ops sok.OptimizerWrapper builds otherwise (optimizer.py), so both paths give the same bits; but
// rowwise_adagrad, whose mean over the row TensorFlow's reduction adds in an order of its own
// (equal within float rounding).
struct RowRule {
  enum Kind { kSgd, kMomentum, kAdagrad, kRowWiseAdagrad } kind;  // SOK_SPARSE_RULES' kinds, in its order
  SparseRuleSpec spec;  // its state (row_width) and hyper-parameters
  float hyper[2];       // kMomentum: momentum, nesterov (0/1); kAdagrad: epsilon, epsilon after sqrt (0/1);
                        // kRowWiseAdagrad: epsilon

  // The rule named `name` with hyper-parameters `hyper` (checked against sparse_rules.h).
  static Status parse(const std::string& name, const std::vector<float>& hyper, RowRule* out) {
    SparseRuleSpec spec{};
    TF_RETURN_IF_ERROR(find_sparse_rule(name, hyper.size(), &spec));
    *out = RowRule{static_cast<Kind>(spec.kind), spec, {0.0f, 0.0f}};
    std::copy(hyper.begin(), hyper.end(), out->hyper);
    return Status();
  }

  static_assert(kSgd == 0 && kMomentum == 1 && kAdagrad == 2 && kRowWiseAdagrad == 3,
                "RowRule::Kind follows SOK_SPARSE_RULES");

  // One loop per variant, without branches inside, so the compiler vectorises each (square roots
  // included: the library is built with -fno-math-errno).
  void apply(float* __restrict__ w, float* __restrict__ s, const float* __restrict__ g, int64_t d, float lr) const {
    switch (kind) {
      case kSgd:  // w - g * lr
        for (int64_t c = 0; c < d; ++c) w[c] = w[c] - g[c] * lr;
        break;
      case kMomentum: {  // m = m * momentum - g * lr; w + (m * momentum - g * lr if nesterov else m)
        const float momentum = hyper[0];
        if (hyper[1] != 0.0f) {
          for (int64_t c = 0; c < d; ++c) {
            s[c] = s[c] * momentum - g[c] * lr;
            w[c] = w[c] + (s[c] * momentum - g[c] * lr);
          }
        } else {
          for (int64_t c = 0; c < d; ++c) {
            s[c] = s[c] * momentum - g[c] * lr;
            w[c] = w[c] + s[c];
          }
        }
        break;
      }
      case kAdagrad: {  // acc + g**2; w - lr * g / (sqrt(acc) + eps if after sqrt else sqrt(acc + eps))
        const float eps = hyper[0];
        for (int64_t c = 0; c < d; ++c) s[c] = s[c] + g[c] * g[c];
        if (hyper[1] != 0.0f) {
          for (int64_t c = 0; c < d; ++c) w[c] = w[c] - lr * g[c] / (std::sqrt(s[c]) + eps);
        } else {
          for (int64_t c = 0; c < d; ++c) w[c] = w[c] - lr * g[c] / std::sqrt(s[c] + eps);
        }
        break;
      }
      case kRowWiseAdagrad: {  // acc + mean(g**2) over the row; w - lr * g / (sqrt(acc) + eps)
        float squares = 0.0f;
        for (int64_t c = 0; c < d; ++c) squares += g[c] * g[c];
        const float acc = s[0] + squares / static_cast<float>(d);
        s[0] = acc;
        const float denominator = std::sqrt(acc) + hyper[0];
        for (int64_t c = 0; c < d; ++c) w[c] = w[c] - lr * g[c] / denominator;
        break;
      }
    }
  }
};

// The visitor of update_rows that runs a rule on row i: the sums (u, d) of the gradient rows.
struct RowStep {
  const RowRule* rule;
  const float* sums;
  int64_t d;
  float lr;
  static void visit(void* self, int64_t i, float* row) {
    const auto* s = static_cast<const RowStep*>(self);
    s->rule->apply(row, row + s->d, s->sums + i * s->d, s->d, s->lr);
  }
};

// The lazy optimizer step of sok.OptimizerWrapper in one op: the gradient rows (n, d) are summed
// per distinct key (positions (n,) and distinct keys (u,) from SokUniqueIndex of the gradient's
// keys) and the rule updates the whole rows [embedding | state] of the distinct keys. Where the
// backend has update_rows and every key is present (the lookup of the step inserted them), the rows
// are updated in place, one probe per key; otherwise they are read (find_or_insert: a key evicted
// since its lookup comes back with initial values, as on the TensorFlow-ops path), updated and
// written back (insert_or_assign). Both give the same rows. The table's rows must be as wide as
// the rule's state needs (SparseRuleSpec::row_width). The GPU kernel (training_ops_gpu.cc): find_or_insert, one
// kernel that sums and applies the rule, insert_or_assign; the same bits, except for keys with more
// than 32 gradient rows: those are summed in a fixed parallel order (deterministic, equal to this
// kernel's within float rounding).
class SparseApplyOp : public OpKernel {
 public:
  explicit SparseApplyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string name;
    std::vector<float> hyper;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rule", &name));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hyper", &hyper));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("positions_checked", &positions_checked_));
    OP_REQUIRES_OK(ctx, RowRule::parse(name, hyper, &rule_));
  }

  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, table_from(ctx, kTable, &ref));
    const Tensor& distinct = ctx->input(kKeys);
    const Tensor& positions = ctx->input(kKeys + 1);
    const Tensor& grads = ctx->input(kKeys + 2);
    const Tensor& lr = ctx->input(kKeys + 3);
    OP_REQUIRES_OK(ctx, check_key_rows(ctx, kKeys + 1, kKeys + 2));
    OP_REQUIRES(ctx, key_type_of(distinct.dtype()) == ref->key_type,
                errors::InvalidArgument("keys have dtype ", ::tensorflow::DataTypeString(distinct.dtype()),
                                        " but the table's key type is ", sok::key_type_name(ref->key_type)));
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(lr.shape()),
                errors::InvalidArgument("lr must be a scalar, got shape ", lr.shape().DebugString()));
    const int64_t n = positions.NumElements();
    const int64_t u = distinct.NumElements();
    const int64_t d = grads.dim_size(1);
    const int32_t row = ref->row_width;
    OP_REQUIRES(ctx, rule_.spec.row_width(d) == row,
                errors::InvalidArgument("gradient rows of ", d, " floats need table rows of ", rule_.spec.row_width(d),
                                        " floats for this rule, the table's are ", row));
    if (!positions_checked_) OP_REQUIRES_OK(ctx, check_positions(positions, u));
    const int32_t* position = positions.flat<int32_t>().data();
    Tensor sums_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({u, d}), &sums_t));
    float* sums = sums_t.flat<float>().data();
    sum_rows(n, position, grads.flat<float>().data(), d, u, sums);
    RowStep step{&rule_, sums, d, lr.scalar<float>()()};
    bool done = false;
    SOK_OK_OR_RETURN(ctx, update_in_place(ref, distinct, step, &done));
    if (!done) SOK_OK_OR_RETURN(ctx, update_by_copy(ctx, ref, distinct, step));
  }

 private:
  // The step through update_rows: *done is false, and nothing changed, when the backend lacks it
  // or a key is missing.
  static Status update_in_place(const sok_table_ref* ref, const Tensor& distinct, RowStep& step, bool* done) {
    *done = false;
    if (!sok_storage_api_has(ref->api, update_rows)) return Status();
    int64_t missing = 0;
    const sok_status st =
        ref->api->update_rows(ref->storage, &kCpu, distinct.NumElements(), distinct.data(), 0, ref->row_width, nullptr,
                              &RowStep::visit, &step, nullptr, &missing);
    if (st == SOK_ERROR_UNSUPPORTED) return Status();
    TF_RETURN_IF_ERROR(status_of(ref, st, "update_rows"));
    *done = missing == 0;
    return Status();
  }

  // The step on copies of the rows: find_or_insert, the rule, insert_or_assign.
  static Status update_by_copy(OpKernelContext* ctx, const sok_table_ref* ref, const Tensor& distinct,
                               RowStep& step) {
    const int64_t u = distinct.NumElements();
    const int32_t row = ref->row_width;
    Tensor rows_t;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({u, row}), &rows_t));
    float* rows = rows_t.flat<float>().data();
    TF_RETURN_IF_ERROR(status_of(ref,
                                 ref->api->find_or_insert(ref->storage, &kCpu, u, distinct.data(), 0, row, rows,
                                                          nullptr, nullptr, ref->inits, ref->num_inits),
                                 "find_or_insert"));
    for (int64_t j = 0; j < u; ++j) RowStep::visit(&step, j, rows + j * row);
    return status_of(ref,
                     ref->api->insert_or_assign(ref->storage, &kCpu, u, distinct.data(), 0, row, rows, nullptr,
                                                ref->inits, ref->num_inits),
                     "insert_or_assign");
  }

  RowRule rule_{};
  bool positions_checked_ = false;
};

REGISTER_OP("SokUniqueSum")
    .Input("keys: Tkeys")
    .Input("values: float")
    .Output("unique_keys: Tkeys")
    .Output("sums: float")
    .Attr(SOK_KEY_TYPES)
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, c->Dim(c->input(1), 1)));
      return Status();
    })
    .Doc("Distinct keys in order of first occurrence and the per-key sums of the value rows.");

REGISTER_OP("SokUniqueIndex")
    .Input("keys: Tkeys")
    .Output("distinct_keys: Tkeys")
    .Output("positions: int32")
    .Attr(SOK_KEY_TYPES)
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(c->NumElements(c->input(0))));
      return Status();
    })
    .Doc("Distinct keys in order of first occurrence and, per key, the position of its distinct key.");

REGISTER_OP("SokUniqueIndexList")
    .Input("keys: Tkeys")
    .Output("distinct_keys: Tkeys")
    .Output("positions: num_tables * int32")
    .Attr("num_tables: int >= 1")
    .Attr("Tkeys: list({int32, int64, uint64})")
    .SetShapeFn([](InferenceContext* c) {
      int n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
      for (int t = 0; t < n; ++t) {
        c->set_output(t, c->Vector(InferenceContext::kUnknownDim));
        c->set_output(n + t, c->Vector(c->NumElements(c->input(t))));
      }
      return Status();
    })
    .Doc("SokUniqueIndex of each of num_tables key tensors (one key type each), in one op.");

REGISTER_OP("SokSparseApply")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("distinct_keys: Tkeys")
    .Input("positions: int32")
    .Input("grads: float")
    .Input("lr: float")
    .Attr(SOK_KEY_TYPES)
    .Attr("rule: string")  // one of SOK_SPARSE_RULES (sparse_rules.h), checked by the kernels
    .Attr("hyper: list(float) = []")
    // True: positions come from SOK's own index of the keys (SokUniqueIndex, a lookup's numbering),
    // so the kernel does not check them again (on a GPU that check waits for the device).
    .Attr("positions_checked: bool = false")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("One lazy optimizer step on the rows of distinct_keys: per-key sums of grads (rows at positions), "
         "the rule, whole rows written back.");


REGISTER_KERNEL_BUILDER(Name("SokUniqueSum").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tkeys"), UniqueSumOp<int64_t>);
REGISTER_KERNEL_BUILDER(Name("SokUniqueSum").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tkeys"), UniqueSumOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("SokUniqueSum").Device(DEVICE_CPU).TypeConstraint<uint64_t>("Tkeys"), UniqueSumOp<uint64_t>);
REGISTER_KERNEL_BUILDER(Name("SokSparseApply").Device(DEVICE_CPU), SparseApplyOp);
REGISTER_KERNEL_BUILDER(Name("SokUniqueIndex").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tkeys"), UniqueIndexOp<int64_t>);
REGISTER_KERNEL_BUILDER(Name("SokUniqueIndex").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tkeys"), UniqueIndexOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("SokUniqueIndex").Device(DEVICE_CPU).TypeConstraint<uint64_t>("Tkeys"), UniqueIndexOp<uint64_t>);
REGISTER_KERNEL_BUILDER(Name("SokUniqueIndexList").Device(DEVICE_CPU), UniqueIndexListOp);
}  // namespace sok_tf

// The native rules this library runs (sparse_rules.h), as text a test can read without loading it.
extern "C" __attribute__((visibility("default"))) const char sok_tf_sparse_rules[] = SOK_SPARSE_RULES_TEXT;
