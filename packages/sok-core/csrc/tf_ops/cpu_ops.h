// What the CPU kernels of the storage ops (storage_ops.cc) and of the training ops (training_ops.cc)
// share, in libsok_tf_ops.so: the CPU's execution context, TensorFlow's intra-op threads, the check
// of positions from SokUniqueIndex, and the key types of the ops' Tkeys attribute.
#ifndef SOK_TF_OPS_CPU_OPS_H_
#define SOK_TF_OPS_CPU_OPS_H_

#include <cstdint>
#include <utility>

#include "storage_ops.h"
#include "tensorflow/core/util/work_sharder.h"

namespace sok_tf {

constexpr sok_exec_context kCpu{SOK_DEVICE_CPU, 0, nullptr};

// Runs fn(begin, end) over parts of [0, n) on TensorFlow's intra-op threads (the calling one
// included); a unit costs about cost_per_unit cycles, which decides how many parts are worth it.
template <class Fn>
void in_parallel(OpKernelContext* ctx, int64_t n, int64_t cost_per_unit, Fn&& fn) {
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(workers->num_threads, workers->workers, n, cost_per_unit, std::forward<Fn>(fn));
}

// Checks that positions (n,) are rows of u distinct keys, as SokUniqueIndex gives them.
inline Status check_positions(const Tensor& positions, int64_t u) {
  const int32_t* position = positions.flat<int32_t>().data();
  const int64_t n = positions.NumElements();
  for (int64_t i = 0; i < n; ++i) {
    if (position[i] < 0 || position[i] >= u) {
      return errors::InvalidArgument("positions[", i, "] = ", position[i], " is not a row of the ", u,
                                     " distinct keys; valid: 0 .. ", u - 1, " (from SokUniqueIndex)");
    }
  }
  return Status();
}

#define SOK_KEY_TYPES "Tkeys: {int32, int64, uint64}"
}  // namespace sok_tf

#endif  // SOK_TF_OPS_CPU_OPS_H_
