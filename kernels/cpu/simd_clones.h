// SD_CLONES: a function built once per x86 instruction set (AVX-512,
// AVX2 + FMA, baseline x86-64) and picked when the program loads (GCC's
// target_clones); elsewhere an ordinary function.
#pragma once

#if defined(__x86_64__) && !defined(__clang__)
#define SD_CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define SD_CLONES
#endif
