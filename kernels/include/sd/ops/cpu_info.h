// What this CPU offers the kernels, read from cpuid (features, never model
// numbers), and which f32 GEMM build runs on it.
#pragma once
#include <string>

namespace sd {

// A feature counts when the CPU has it and the OS saves its registers on a
// context switch (XCR0), i.e. when code may use it.
struct CpuInfo {
  std::string model; // the brand string, e.g. "AMD EPYC 9654 96-Core Processor"
  bool avx2 = false, fma = false, avx512f = false, avx512bf16 = false, amxTile = false;
  bool avx512vnni = false; // AVX512_VNNI with AVX512BW: u8 x s8 dot products into i32 (vpdpbusd)
};

CpuInfo cpuInfo();

// "avx512", "avx2" or "generic" (the system BLAS): the f32 GEMM in use, after
// the SD_CPU_ISA cap.
const char *f32GemmKernel();
// The system BLAS's own kernel choice, used for f64 products (OpenBLAS's
// core name, which it derives from the CPU model).
const char *f64GemmKernel();

} // namespace sd
