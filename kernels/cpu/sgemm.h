// f32 GEMM chosen by CPU features (cpuid: AVX-512F, AVX2+FMA), never by CPU
// model: BLAS libraries that pick kernels from a table of CPU models run new
// CPUs they do not know with their SSE3 kernels (OpenBLAS 0.3.21 on a current
// Xeon ran 4-5x slower). Row-major throughout.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>

namespace sd {
class ThreadPool;
}

namespace sd::cpu {

// The right operand packed once into the active kernel's panel layout: panel p
// holds columns [p*panelWidth, (p+1)*panelWidth) as k rows of panelWidth
// floats, zero-padded past n. Weights are packed at session creation.
struct PackedB {
  int64_t k = 0, n = 0, panelWidth = 0;
  std::unique_ptr<float[], void (*)(void *)> data{nullptr, nullptr};
};

// The left operand packed once into row panels of panelHeight rows: panel p
// holds rows [p*panelHeight, (p+1)*panelHeight) as k columns of panelHeight
// floats, zero-padded past m. Convolution weights are packed at session
// creation.
struct PackedA {
  int64_t m = 0, k = 0, panelHeight = 0;
  std::unique_ptr<float[], void (*)(void *)> data{nullptr, nullptr};
};

// The instruction set the f32 GEMM runs with: "avx512", "avx2" or "generic".
const char *sgemmIsa();
// Held around every call into the system BLAS, which is not thread-safe.
std::mutex &systemBlasLock();

// Packs op(B) (k x n; tb: B is stored n x k) for sgemm with packed operand.
PackedB packB(bool tb, int64_t k, int64_t n, const float *b, int64_t ldb);

// Packs op(A) (m x k; ta: A is stored k x m) for sgemm with packed operand.
PackedA packA(bool ta, int64_t m, int64_t k, const float *a, int64_t lda);

// C[m,n] = alpha * op(A) op(B) + beta * C; splits across `pool` when it pays.
// beta == 0 never reads C. `packed`, when given, replaces b/ldb/tb, and
// `packedA` replaces a/lda/ta.
void sgemm(ThreadPool *pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
           int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc,
           const PackedB *packed = nullptr, const PackedA *packedA = nullptr);

// C[m,n] = op(A) B + beta * C where B is indirect: row p of B is the n floats
// at b + rowOffsets[p]. An implicit-GEMM convolution's B rows are its input
// shifted by each kernel tap, so no im2col copy is made. `packedA`, when
// given, replaces a/lda/ta.
void sgemmIndirectB(ThreadPool *pool, bool ta, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, const int64_t *rowOffsets, float beta, float *c, int64_t ldc,
                    const PackedA *packedA = nullptr);

} // namespace sd::cpu
