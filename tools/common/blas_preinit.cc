// Picks OpenBLAS's AVX-512 kernels on CPUs that have AVX-512 but that OpenBLAS
// 0.3.21 (Debian bookworm) does not recognize, such as AMD Zen 4, which it
// runs with its Haswell (AVX2) kernels at about 60% of the speed. OpenBLAS
// reads OPENBLAS_CORETYPE in its library constructor, so this runs from the
// executable's .preinit_array, before any shared-library constructor. An
// OPENBLAS_CORETYPE set by the user is left alone.
#include <cpuid.h>
#include <cstdlib>

namespace {

bool hasAvx512ForSkylakeXKernels() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  bool f = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
  if (!(f && dq && bw && vl)) return false;
  // The OS must save the ZMM state (XCR0 bits 5-7) for AVX-512 to be usable.
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xe6) == 0xe6;
}

void selectBlasKernels(int, char **, char **) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;
  if (hasAvx512ForSkylakeXKernels()) setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
}

} // namespace

__attribute__((section(".preinit_array"), used)) static void (*sdSelectBlasKernels)(int, char **,
                                                                                    char **) = selectBlasKernels;
