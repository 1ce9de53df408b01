// det on the GPU: the shared CUDA bucket table (sok/cuda/bucket_table.cuh) with every row in device
// memory, growing without limit of slots and never evicting.
#include <limits>

#include "det_table.hpp"
#include "sok/cuda/bucket_table.cuh"

namespace sok_det {

sok::Storage* create_cuda_storage(const sok_storage_config& config, const DetOptions& options) {
  constexpr int32_t kBucket = 128;
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
