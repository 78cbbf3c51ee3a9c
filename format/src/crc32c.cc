// CRC32C with the SSE4.2 instruction when the CPU has it, else slicing-by-1 table.
#include "sd/format/crc32c.h"
#include <cstring>

namespace sd {
namespace {

struct Table {
  uint32_t t[256];
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
      t[i] = c;
    }
  }
};

uint32_t crcSoftware(const uint8_t *p, size_t n, uint32_t c) {
  static const Table table;
  for (size_t i = 0; i < n; ++i) c = table.t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crcHardware(const uint8_t *p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = __builtin_ia32_crc32di(c64, v);
    p += 8;
    n -= 8;
  }
  c = uint32_t(c64);
  while (n--) c = __builtin_ia32_crc32qi(c, *p++);
  return c;
}
#endif

} // namespace

uint32_t crc32c(const void *data, size_t size, uint32_t crc) {
  const uint8_t *p = static_cast<const uint8_t *>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("sse4.2");
  c = hw ? crcHardware(p, size, c) : crcSoftware(p, size, c);
#else
  c = crcSoftware(p, size, c);
#endif
  return ~c;
}

} // namespace sd
