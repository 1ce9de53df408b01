// The one export chunk size: how many slots each export_batch / export_if call scans, wherever rows
// are exported in batches (the Python storage facade, the TensorFlow export ops, checkpoint rounds).
#ifndef SOK_KIT_EXPORT_HPP_
#define SOK_KIT_EXPORT_HPP_

#include <algorithm>
#include <cstdint>

namespace sok {

// Bytes of output rows (key, row values and score) one export call is sized for.
constexpr int64_t kExportChunkBytes = int64_t{64} << 20;
// The fewest slots one export call scans, so that narrow-row tables are not exported in tiny steps.
constexpr int64_t kExportChunkMinSlots = 4096;

// Slots per export call for rows of `row_bytes` bytes each: kExportChunkBytes of rows, at least
// kExportChunkMinSlots.
inline int64_t export_chunk_slots(int64_t row_bytes) {
  return std::max(kExportChunkMinSlots, kExportChunkBytes / std::max<int64_t>(row_bytes, 1));
}

}  // namespace sok

#endif  // SOK_KIT_EXPORT_HPP_
