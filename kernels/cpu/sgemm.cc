// Picks the f32 GEMM from cpuid feature flags once per process and splits
// each product across the session's thread pool. Without AVX2+FMA (or with
// SD_CPU_ISA=generic) products go to the system BLAS.
#include "sgemm.h"
#include "sd/ops/cpu_info.h"
#include "sd/ops/threadpool.h"
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif
#include "sgemm_isa.h"
#include <algorithm>
#include <cblas.h>
#include <cstdlib>
#include <string_view>
#include <vector>

namespace sd::cpu {
namespace {

using sgemm_isa::Kernels;

// The best kernel set this CPU runs, capped by SD_CPU_ISA (avx512, avx2,
// generic) so benchmarks and tests can compare them on one machine; any other
// value is no cap.
const Kernels *selectKernels() {
  const char *cap = std::getenv("SD_CPU_ISA");
  std::string_view want = cap ? cap : "";
  int level = want == "generic" ? 0 : want == "avx2" ? 1 : 2;
  CpuInfo cpu = cpuInfo();
  bool avx2 = cpu.avx2 && cpu.fma; // both builds use FMA
  if (level >= 2 && avx2 && cpu.avx512f) return &sgemm_isa::avx512Kernels();
  if (level >= 1 && avx2) return &sgemm_isa::avx2Kernels();
  return nullptr;
}

const Kernels *active() {
  static const Kernels *k = selectKernels();
  return k;
}

void blasSgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
               const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  std::lock_guard<std::mutex> lock(systemBlasLock());
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

} // namespace

// Debian's serial OpenBLAS (the one we link, see kernels/CMakeLists.txt) is
// built without USE_LOCKING: two threads in it at once share its buffers and
// can get wrong results (measured: 3 of 300 three-thread f64 Conv runs of the
// op harness differed from the one-thread run). Its calls go one at a time.
std::mutex &systemBlasLock() {
  static std::mutex m;
  return m;
}

const char *sgemmIsa() { return active() ? active()->name : "generic"; }

// 64-byte-aligned storage for `dim` rows or columns, rounded up to whole
// panels of `panel`, of `k` floats each (at least one cache line).
static std::unique_ptr<float[], void (*)(void *)> panelStorage(int64_t dim, int64_t panel, int64_t k) {
  size_t floats = size_t((dim + panel - 1) / panel * panel * k);
  size_t bytes = (std::max<size_t>(floats * 4, 64) + 63) / 64 * 64;
  return {static_cast<float *>(std::aligned_alloc(64, bytes)), &std::free};
}

// op(X) (rows x cols; t: X is stored cols x rows) as a plain row-major
// matrix: the packed form the system BLAS reads.
static void copyOp(bool t, int64_t rows, int64_t cols, const float *x, int64_t ld, float *dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = t ? x[j * ld + i] : x[i * ld + j];
}

PackedB packB(bool tb, int64_t k, int64_t n, const float *b, int64_t ldb) {
  PackedB p;
  p.k = k;
  p.n = n;
  const Kernels *ks = active();
  p.panelWidth = ks ? ks->panelWidth : std::max<int64_t>(n, 1);
  p.data = panelStorage(n, p.panelWidth, k);
  if (!p.data) return p;
  if (ks) ks->packPanels(tb, k, n, b, ldb, p.data.get());
  else copyOp(tb, k, n, b, ldb, p.data.get());
  return p;
}

PackedA packA(bool ta, int64_t m, int64_t k, const float *a, int64_t lda) {
  PackedA p;
  p.m = m;
  p.k = k;
  const Kernels *ks = active();
  p.panelHeight = ks ? ks->rowTile : std::max<int64_t>(m, 1);
  p.data = panelStorage(m, p.panelHeight, k);
  if (!p.data) return p;
  if (ks) ks->packRowPanels(ta, m, k, a, lda, p.data.get());
  else copyOp(ta, m, k, a, lda, p.data.get());
  return p;
}

// Denormal operands or partial sums make x86 FMAs take microcode assists,
// about 30x slower (measured: a 16x128x32x128 batched MatMul of values near
// 1e-19 took 37 ms instead of 1.3 ms). Our GEMM kernels run with
// flush-to-zero and denormals-are-zero set, as MKL and oneDNN do; only
// results below 1.2e-38 change. The caller's mode is restored after.
class FlushDenormals {
public:
#if defined(__x86_64__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz | kDaz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

private:
  static constexpr unsigned kFtz = 1u << 15, kDaz = 1u << 6;
  unsigned saved_;
#endif
};

// The GEMM behind sgemm and sgemmIndirectB: op(B) is raw, packed or
// indirect (bop.rowOffsets).
static void gemmImpl(ThreadPool *pool, bool ta, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t lda, const PackedA *packedA, sgemm_isa::BOperand bop, float beta, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const PackedB *&packed = bop.packed;
  if (packed && (packed->k != k || packed->n != n || !packed->data)) packed = nullptr; // not this product's B
  if (packedA && (packedA->k != k || packedA->m != m || !packedA->data)) packedA = nullptr;
  if (packedA && !active()) { // the system BLAS: op(A) row-major m x k
    a = packedA->data.get();
    lda = k;
    ta = false;
    packedA = nullptr;
  }
  const Kernels *ks = active();
  std::vector<float> gathered; // an indirect B as the row-major k x n the system BLAS reads
  if (!ks && bop.rowOffsets) {
    gathered.resize(static_cast<size_t>(k * n));
    for (int64_t p = 0; p < k; ++p) std::copy_n(bop.b + bop.rowOffsets[p], n, gathered.data() + p * n);
    bop = {gathered.data(), n, false, nullptr, nullptr};
  }
  auto rows = [&](int64_t i0, int64_t i1) { // op(A) row i sits at a + i*lda, or column i when ta
    const float *ai = ta ? a + i0 : a + i0 * lda;
    if (!ks) {
      if (packed) blasSgemm(ta, false, i1 - i0, n, k, alpha, ai, lda, packed->data.get(), n, beta, c + i0 * ldc, ldc);
      else blasSgemm(ta, bop.tb, i1 - i0, n, k, alpha, ai, lda, bop.b, bop.ldb, beta, c + i0 * ldc, ldc);
      return;
    }
    FlushDenormals flush;
    ks->gemm({ai, lda, ta, packedA, i0}, i1 - i0, n, k, alpha, bop, 0, beta, c + i0 * ldc, ldc);
  };
  int threads = pool ? pool->size() : 1;
  // Products under ~2 MFLOP run on the calling thread: on the dev VM a
  // hand-off cost tens of microseconds (LoRA demo step at 2 threads: 16-17 ms
  // with the cut at 2^17, 13-15 ms at 2^20, 18-20 ms at 2^22).
  // A few rows against a large B (a decode step's matrix-vector products)
  // stream B from memory: splitting B's columns pays once B is about 128 KiB.
  const bool streamsB = m <= 4 && double(n) * double(k) >= double(1 << 15);
  if (threads <= 1 || (double(m) * double(n) * double(k) < double(1 << 20) && !streamsB)) {
    rows(0, m);
    return;
  }
  int64_t mr = ks ? ks->rowTile : 8, nr = ks ? ks->panelWidth : n;
  int64_t rowTiles = (m + mr - 1) / mr, panels = (n + nr - 1) / nr;
  // One contiguous share per thread: every share packs its own operands, so
  // more (smaller) shares would pack the same A or B again.
  auto split = [&](int64_t units, auto &&run) {
    int64_t parts = std::min<int64_t>(threads, units);
    pool->parallelFor(parts, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) run(units * t / parts, units * (t + 1) / parts);
    });
  };
  if (ks && panels >= threads && panels >= rowTiles) { // split columns, whole panels per thread
    split(panels, [&](int64_t p0, int64_t p1) {
      int64_t j0 = p0 * nr, j1 = std::min(n, p1 * nr);
      sgemm_isa::BOperand share = bop; // a packed B is addressed by j0, a raw one by pointer
      if (!packed) share.b = bop.tb ? bop.b + j0 * bop.ldb : bop.b + j0;
      FlushDenormals flush;
      ks->gemm({a, lda, ta, packedA, 0}, m, j1 - j0, k, alpha, share, packed ? j0 : 0, beta, c + j0, ldc);
    });
    return;
  }
  split(rowTiles, [&](int64_t t0, int64_t t1) { rows(t0 * mr, std::min(m, t1 * mr)); });
}

void sgemm(ThreadPool *pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
           int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc, const PackedB *packed,
           const PackedA *packedA) {
  gemmImpl(pool, ta, m, n, k, alpha, a, lda, packedA, {b, ldb, tb, packed, nullptr}, beta, c, ldc);
}

void sgemmIndirectB(ThreadPool *pool, bool ta, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, const int64_t *rowOffsets, float beta, float *c, int64_t ldc,
                    const PackedA *packedA) {
  gemmImpl(pool, ta, m, n, k, 1.0f, a, lda, packedA, {b, 0, false, nullptr, rowOffsets}, beta, c, ldc);
}

} // namespace sd::cpu

const char *sd::f32GemmKernel() { return cpu::sgemmIsa(); }
