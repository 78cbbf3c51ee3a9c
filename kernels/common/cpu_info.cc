#include "sd/ops/cpu_info.h"
#include <cpuid.h>
#include <cstring>

namespace sd {
namespace {

// XCR0: which register states the OS saves on a context switch.
uint64_t osSavedState() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; // no OSXSAVE
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

} // namespace

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
  uint64_t xcr0 = osSavedState();
  bool ymm = (xcr0 & 0x6) == 0x6;     // XMM and YMM
  bool zmm = (xcr0 & 0xe6) == 0xe6;   // and opmask, ZMM0-15 upper halves, ZMM16-31
  bool tiles = (xcr0 & 0x60000) == 0x60000; // AMX tile config and data
  if (__get_cpuid(1, &a, &b, &c, &d)) info.fma = ymm && (c & (1u << 12));
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    info.avx2 = ymm && (b & (1u << 5));
    info.avx512f = zmm && (b & (1u << 16));
    info.amxTile = tiles && (d & (1u << 24));
    info.avx512vnni = zmm && (b & (1u << 30)) && (c & (1u << 11));
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) info.avx512bf16 = zmm && (a & (1u << 5));
  return info;
}

} // namespace sd
