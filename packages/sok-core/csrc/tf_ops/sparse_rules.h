// The row-wise optimizer rules that SokSparseApply runs natively (its `rule` attr names one): one
// list for its CPU kernel (training_ops.cc) and its GPU kernel (training_ops_gpu.cc), and the names
// sok.OptimizerWrapper's records give (optimizer.py, OptimizerRecord.natives), which a test
// compares with the list each library embeds (sok_tf_sparse_rules). Inline only: the two libraries
// are loaded separately and neither links the other.
#ifndef SOK_TF_OPS_SPARSE_RULES_H_
#define SOK_TF_OPS_SPARSE_RULES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"

// X(name, kind, state blocks of the embedding's width after it, state floats per row after those,
//   hyper-parameters)
//   sgd:             w - g * lr
//   momentum:        momentum, nesterov (0/1)
//   adagrad:         epsilon, epsilon after the square root (0/1: tf_keras legacy)
//   rowwise_adagrad: epsilon (after the square root); one accumulator per row, the mean of g * g
#define SOK_SPARSE_RULES(X)     \
  X(sgd, 0, 0, 0, 0)            \
  X(momentum, 1, 1, 0, 2)       \
  X(adagrad, 2, 1, 0, 2)        \
  X(rowwise_adagrad, 3, 0, 1, 1)

// The list as text, "name:blocks:floats:hyper," per rule, behind a prefix a test searches the library for.
#define SOK_SPARSE_RULE_TEXT(name, kind, blocks, floats, hyper) #name ":" #blocks ":" #floats ":" #hyper ","
#define SOK_SPARSE_RULES_TEXT "sok_tf sparse rules: " SOK_SPARSE_RULES(SOK_SPARSE_RULE_TEXT)

namespace sok_tf {

// One native rule: its kind (the index of its X line), state and hyper-parameters.
struct SparseRuleSpec {
  const char* name;
  int32_t kind;
  int32_t blocks;  // state blocks as wide as the embedding
  int32_t floats;  // state floats per row after them
  size_t num_hyper;

  // The width of a table row this rule updates, for an embedding of d floats.
  int64_t row_width(int64_t d) const { return d * (1 + blocks) + floats; }
};

// The rule `name` taking `num_hyper` hyper-parameters, checked.
inline ::tensorflow::Status find_sparse_rule(const std::string& name, size_t num_hyper, SparseRuleSpec* out) {
#define SOK_SPARSE_RULE_SPEC(n, kind, blocks, floats, hyper) {#n, kind, blocks, floats, hyper},
  static const SparseRuleSpec kRules[] = {SOK_SPARSE_RULES(SOK_SPARSE_RULE_SPEC)};
#undef SOK_SPARSE_RULE_SPEC
  std::string valid;
  for (const SparseRuleSpec& r : kRules) {
    valid += valid.empty() ? r.name : std::string(", ") + r.name;
    if (name != r.name) continue;
    if (num_hyper != r.num_hyper) {
      return ::tensorflow::errors::InvalidArgument("rule '", name, "' takes ", r.num_hyper,
                                                   " hyper-parameters, got ", num_hyper);
    }
    *out = r;
    return ::tensorflow::Status();
  }
  return ::tensorflow::errors::InvalidArgument("unknown rule '", name, "'; valid: ", valid);
}

}  // namespace sok_tf

#endif  // SOK_TF_OPS_SPARSE_RULES_H_
