// SD_HD marks math written once for every backend: a __host__ __device__
// function under nvcc, a plain inline function in the CPU build. The CPU
// kernels call the same functions the CUDA kernels do, so the math is
// unit-tested on machines without a GPU.
#pragma once

#if defined(__CUDACC__)
#define SD_HD __host__ __device__ inline
#else
#define SD_HD inline
#endif
