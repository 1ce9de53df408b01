// CRC-32 as zlib computes it (polynomial 0xEDB88320, reflected, inverted in and out): the checksum
// that Python's zlib.crc32 gives and a checkpoint's manifest.json holds (sparse_operation_kit's
// checkpoint/format.py, update_crc32). Our own table-driven code (8 bytes a step), so the server
// builds where zlib's header is not installed.
//
// Example:
//   uint32_t crc = sok::hps::update_crc32(header, 296);  // as zlib.crc32(header)
//   crc = sok::hps::update_crc32(rows, bytes, crc);      // as zlib.crc32(rows, crc)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sok::hps {

// The CRC-32 of the data checksummed into `crc` (0: none yet) followed by `bytes` bytes at `data`.
uint32_t update_crc32(const void* data, size_t bytes, uint32_t crc = 0);

// A CRC-32 as 8 lower-case hex digits (Python's f"{crc:08x}", as a manifest holds it).
std::string crc32_hex(uint32_t crc);

}  // namespace sok::hps
