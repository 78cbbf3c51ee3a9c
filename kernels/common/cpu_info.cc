#include "sd/ops/cpu_info.h"
#include <cpuid.h>
#include <cstring>

namespace sd {

CpuInfo cpuInfo() {
  CpuInfo info;
  unsigned a, b, c, d;
  char brand[49] = {};
  for (unsigned leaf = 0; leaf < 3; ++leaf)
    if (__get_cpuid(0x80000002 + leaf, &a, &b, &c, &d)) {
      unsigned regs[4] = {a, b, c, d};
      std::memcpy(brand + 16 * leaf, regs, 16);
    }
  info.model = brand;
  while (!info.model.empty() && info.model.back() == ' ') info.model.pop_back();
  while (!info.model.empty() && info.model.front() == ' ') info.model.erase(0, 1);
  if (__get_cpuid(1, &a, &b, &c, &d)) info.fma = c & (1u << 12);
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    info.avx2 = b & (1u << 5);
    info.avx512f = b & (1u << 16);
    info.amxTile = d & (1u << 24);
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) info.avx512bf16 = a & (1u << 5);
  return info;
}

} // namespace sd
