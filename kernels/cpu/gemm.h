// Row-major GEMM: float through our feature-dispatched kernels (sgemm.h),
// double through the system BLAS, other types by plain loops.
#pragma once
#include "sd/ops/threadpool.h"
#include "sgemm.h"
#include <algorithm>
#include <cblas.h>
#include <cstdint>
#include <type_traits>

namespace sd::cpu {

// C[m,n] = alpha * op(A) op(B) + beta * C with leading dimensions lda/ldb/ldc.
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T *a, int64_t lda, const T *b,
          int64_t ldb, T beta, T *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    sgemm(nullptr, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else if constexpr (std::is_same_v<T, double>) {
    std::lock_guard<std::mutex> lock(systemBlasLock());
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n),
                int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
  } else {
    // Integers wrap as two's complement in T: computed in u64, where the
    // products cannot overflow into undefined behaviour (a u16 times a u16
    // promotes to int, which 65535 * 65535 overflows), then cut down to T.
    using W = std::conditional_t<std::is_integral_v<T>, uint64_t, T>;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        W acc = 0;
        for (int64_t p = 0; p < k; ++p)
          acc += W(ta ? a[p * lda + i] : a[i * lda + p]) * W(tb ? b[j * ldb + p] : b[p * ldb + j]);
        c[i * ldc + j] = T(W(alpha) * acc + (beta == T(0) ? W(0) : W(beta) * W(c[i * ldc + j])));
      }
  }
}

// The same product split across the session's threads. The system BLAS runs
// single-threaded (see configureCpuBackend): one pool for all parallelism,
// instead of two that preempt each other on few cores.
template <typename T>
void parallelGemm(ThreadPool *pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T *a,
                  int64_t lda, const T *b, int64_t ldb, T beta, T *c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    sgemm(pool, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  int threads = pool ? pool->size() : 1;
  if (threads <= 1 || m * n * k < (int64_t(1) << 18) || n < 64) {
    gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Column blocks that are multiples of 16 keep each thread's packing aligned.
  int64_t block = std::max<int64_t>(16, ((n + threads - 1) / threads + 15) / 16 * 16);
  pool->parallelFor((n + block - 1) / block, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      int64_t j0 = blk * block, cols = std::min(block, n - j0);
      gemm<T>(ta, tb, m, cols, k, alpha, a, lda, tb ? b + j0 * ldb : b + j0, ldb, beta, c + j0, ldc);
    }
  });
}

// f32 parallelGemm where k may be 0 (an empty sum): C is then left as it is,
// or zeroed when beta is 0, instead of reaching the GEMM kernels.
inline void sgemmOnPool(ThreadPool *pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f)
      for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
    return;
  }
  parallelGemm<float>(pool, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

} // namespace sd::cpu
