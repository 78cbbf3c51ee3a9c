// CRC32C (Castagnoli), the checksum of plan files and checkpoints.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sd {
uint32_t crc32c(const void *data, size_t size, uint32_t crc = 0);
}
