// SHA-256, for recording the source model's digest in the plan.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace sd {
std::array<uint8_t, 32> sha256(const void *data, size_t size);
std::string toHex(const uint8_t *data, size_t size);
} // namespace sd
