// hkv on the GPU: the shared CUDA bucket table (sok/gpu_engine/bucket_table.cuh) with HierarchicalKV's
// options: buckets of max_bucket_size slots, growth up to max_capacity, then per-bucket eviction by
// the policy's scores; rows past max_hbm_for_vectors (GB) live in pinned host memory.
#include <string>

#include "hkv_table.hpp"
#include "sok/gpu_engine/bucket_table.cuh"

namespace sok_hkv {

sok::Storage* create_cuda_storage(const sok_storage_config& config, const HkvOptions& options) {
  if (options.device_id >= 0 && options.device_id != config.device_id) {
    sok::invalid("device_id=" + std::to_string(options.device_id) + " contradicts the table's device cuda:" +
                 std::to_string(config.device_id) + "; leave device_id unset (-1) or make them agree");
  }
  sok::gpu::BucketConfig c{};
  c.backend = "hkv";
  c.bucket_size = static_cast<int32_t>(options.bucket_size);
  c.init_slots = options.init_capacity;
  c.max_slots = options.max_capacity;
  c.max_keys = 0;
  c.max_load_factor = options.max_load_factor;
  c.policy = static_cast<sok::gpu::Policy>(static_cast<int>(options.policy));
  c.evicts = true;
  c.hbm_bytes = options.max_hbm_gb * static_cast<double>(int64_t{1} << 30);  // HKV's GB(): 2**30 bytes
  return new sok::gpu::BucketTable(config, c);
}

}  // namespace sok_hkv
