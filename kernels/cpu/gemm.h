// Row-major GEMM: float/double through OpenBLAS, other types by plain loops.
#pragma once
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
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n),
                int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
  } else if constexpr (std::is_same_v<T, double>) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n),
                int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
  } else {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        T acc = 0;
        for (int64_t p = 0; p < k; ++p)
          acc += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
        c[i * ldc + j] = T(alpha * acc + (beta == T(0) ? T(0) : beta * c[i * ldc + j]));
      }
  }
}

} // namespace sd::cpu
