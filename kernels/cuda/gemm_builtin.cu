// A plain shared-memory tiled GEMM with cuBLASLt's semantics in gemm_lt.h
// (row-major, transposes, strided batches, alpha/beta, bias epilogue),
// accumulating in f32 (f64 for f64) in a fixed order: deterministic. It runs
// only where cuBLASLt cannot be loaded.
#include "gemm_lt.h"

namespace sd::cuda {
namespace {

constexpr int kTile = 16;

template <typename T>
__global__ void tiledGemm(GemmShape s, const T *A, const T *B, T *C, Compute<T> alpha, Compute<T> beta, const T *bias) {
  using Acc = Compute<T>;
  __shared__ Acc ta[kTile][kTile + 1], tb[kTile][kTile + 1];
  int64_t batch = blockIdx.z;
  const T *a = A + batch * s.strideA, *b = B + batch * s.strideB;
  T *c = C + batch * s.strideC;
  int64_t row = int64_t(blockIdx.y) * kTile + threadIdx.y, col = int64_t(blockIdx.x) * kTile + threadIdx.x;
  Acc acc = 0;
  for (int64_t l0 = 0; l0 < s.k; l0 += kTile) {
    int64_t la = l0 + threadIdx.x, lb = l0 + threadIdx.y;
    ta[threadIdx.y][threadIdx.x] =
        row < s.m && la < s.k ? load(s.transA ? a[la * s.lda + row] : a[row * s.lda + la]) : Acc(0);
    tb[threadIdx.y][threadIdx.x] =
        lb < s.k && col < s.n ? load(s.transB ? b[col * s.ldb + lb] : b[lb * s.ldb + col]) : Acc(0);
    __syncthreads();
    for (int l = 0; l < kTile; ++l) acc += ta[threadIdx.y][l] * tb[l][threadIdx.x];
    __syncthreads();
  }
  if (row >= s.m || col >= s.n) return;
  T *out = c + row * s.ldc + col;
  Acc v = alpha * acc;
  if (beta != Acc(0)) v += beta * load(*out);
  if (bias) v += load(bias[col]);
  *out = store<T>(v);
}

} // namespace

Status builtinGemm(const GemmShape &s, const void *a, const void *b, void *c, double alpha, double beta,
                   cudaStream_t stream) {
  if (s.m == 0 || s.n == 0) return Status::ok();
  if (s.batch > 65535) return sdError("the built-in GEMM takes at most 65535 batches");
  dim3 block(kTile, kTile), grid(unsigned((s.n + kTile - 1) / kTile), unsigned((s.m + kTile - 1) / kTile),
                                 unsigned(std::max<int64_t>(1, s.batch)));
  return dispatchFloatStorage(s.dtype, [&](auto tag) {
    using T = decltype(tag);
    tiledGemm<T><<<grid, block, 0, stream>>>(s, static_cast<const T *>(a), static_cast<const T *>(b),
                                             static_cast<T *>(c), Compute<T>(alpha), Compute<T>(beta),
                                             static_cast<const T *>(s.bias));
    return launchStatus("GEMM");
  });
}

} // namespace sd::cuda
