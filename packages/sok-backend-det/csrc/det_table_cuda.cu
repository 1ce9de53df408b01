// det on the GPU: the shared CUDA bucket table (sok/gpu_engine/bucket_table.cuh) with every row in device
// memory, growing without limit of slots and never evicting.
#include <limits>

#include "det_table.hpp"
#include "sok/gpu_engine/bucket_table.cuh"

namespace sok_det {

// Buckets of 32 slots: a lookup reads one 32-byte sector of state bytes instead of a 128-byte line.
// Up to a load of 0.75 a bucket overflows rarely (Poisson, mean 24 of 32: ~5%); higher
// max_load_factor values get HKV's 128 slots, where chains stay short at any load.
constexpr double kSmallBucketMaxLoad = 0.75;

sok::Storage* create_cuda_storage(const sok_storage_config& config, const DetOptions& options) {
  const int32_t kBucket = options.max_load_factor <= kSmallBucketMaxLoad ? 32 : 128;
  int64_t slots = kBucket;
  while (static_cast<double>(slots) < static_cast<double>(options.init_capacity) / options.max_load_factor + 1) slots <<= 1;
  sok::gpu::BucketConfig c{};
  c.backend = "det";
  c.bucket_size = kBucket;
  c.init_slots = slots;
  c.max_slots = 0;
  c.max_keys = options.max_capacity;
  c.max_load_factor = options.max_load_factor;
  c.policy = sok::gpu::Policy::kLru;  // scores: the time of the last write, as on the CPU
  c.evicts = false;
  c.hbm_bytes = std::numeric_limits<double>::infinity();
  return new sok::gpu::BucketTable(config, c);
}

}  // namespace sok_det
