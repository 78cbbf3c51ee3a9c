// One single-threaded f32 GEMM candidate timed on the product shapes our
// plans run (built once per candidate by gemm_candidates.sh, since several of
// these libraries export the same BLAS symbols). Prints one line per shape:
// candidate, shape, GFLOP/s (median of the repetitions), max |error| against
// a double-precision reference.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#if defined(USE_OPENBLAS)
#include <cblas.h>
static const char *kName = "openblas";
#elif defined(USE_BLIS)
#include <blis.h>
static const char *kName = "blis";
#elif defined(USE_XSMM)
#include <libxsmm.h>
static const char *kName = "libxsmm";
#elif defined(USE_DNNL)
#include <dnnl.h>
static const char *kName = "onednn";
#elif defined(USE_SD) || defined(USE_SD_PACKED)
#include "../../kernels/cpu/sgemm.h"
#ifdef USE_SD_PACKED
static const char *kName = "sdc-packed";
#else
static const char *kName = "sdc";
#endif
#endif

struct Shape {
  const char *label;
  int m, n, k;
  bool ta, tb;
};

// op(A) is m x k, op(B) is k x n; all row-major, tightly packed.
static void run(const Shape &s, const float *a, const float *b, float *c, const void *prepared) {
  int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n, ldc = s.n;
#if defined(USE_OPENBLAS)
  cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.0f,
              a, lda, b, ldb, 0.0f, c, ldc);
#elif defined(USE_BLIS)
  float one = 1, zero = 0;
  bli_sgemm(s.ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, s.tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, s.m, s.n, s.k, &one,
            const_cast<float *>(a), lda, 1, const_cast<float *>(b), ldb, 1, &zero, c, ldc, 1);
#elif defined(USE_XSMM)
  // Column-major: C^T = op(B)^T op(A)^T.
  char tA = s.tb ? 'T' : 'N', tB = s.ta ? 'T' : 'N';
  float one = 1, zero = 0;
  libxsmm_blasint m = s.n, n = s.m, k = s.k, la = ldb, lb = lda, lc = ldc;
  libxsmm_sgemm(&tA, &tB, &m, &n, &k, &one, b, &la, a, &lb, &zero, c, &lc);
#elif defined(USE_DNNL)
  dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
#elif defined(USE_SD)
  sd::cpu::sgemm(nullptr, s.ta, s.tb, s.m, s.n, s.k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
#elif defined(USE_SD_PACKED)
  sd::cpu::sgemm(nullptr, s.ta, s.tb, s.m, s.n, s.k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc,
                 static_cast<const sd::cpu::PackedB *>(prepared));
#endif
}

int main() {
  const Shape shapes[] = {
      {"gpt-demo qkv fwd", 512, 384, 128, false, false},   {"gpt-demo fc2 fwd", 512, 128, 512, false, false},
      {"gpt-demo fc1 dX", 512, 128, 512, false, true},     {"gpt-demo fc1 dW", 128, 512, 512, true, false},
      {"d512 qkv fwd", 256, 1536, 512, false, false},      {"d512 fc2 fwd", 256, 512, 2048, false, false},
      {"d512 fc1 dW", 512, 2048, 256, true, false},        {"d512 decode qkv", 1, 1536, 512, false, false},
      {"conv3x3 64ch 32px", 64, 1024, 576, false, false}, {"square 1024", 1024, 1024, 1024, false, false},
      // bench/decode_bench.py's Llama (hidden 256, MLP 688, vocab 1024): one decode token.
      {"llama decode q", 1, 256, 256, false, false},       {"llama decode gate", 1, 688, 256, false, false},
      {"llama decode down", 1, 256, 688, false, false},    {"llama decode head", 1, 1024, 256, false, false},
      // Its 64-token prefill chunk, q/k/v and gate/up fused (sd-fuse-projections).
      {"llama prefill qkv", 64, 512, 256, false, false},   {"llama prefill gate+up", 64, 1376, 256, false, false},
      {"llama prefill down", 64, 256, 688, false, false},
  };
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const Shape &s : shapes) {
    std::vector<float> a(size_t(s.m) * s.k), b(size_t(s.k) * s.n), c(size_t(s.m) * s.n);
    for (float &x : a) x = u(rng);
    for (float &x : b) x = u(rng);
    const void *prepared = nullptr;
#if defined(USE_SD_PACKED)
    sd::cpu::PackedB pb = sd::cpu::packB(s.tb, s.k, s.n, b.data(), s.tb ? s.k : s.n);
    prepared = &pb;
#endif
    double flops = 2.0 * s.m * s.n * s.k;
    int reps = std::max(5, int(2e9 / flops));
    run(s, a.data(), b.data(), c.data(), prepared); // warm-up: JIT, packing buffers
    std::vector<double> secs;
    for (int r = 0; r < 7; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) run(s, a.data(), b.data(), c.data(), prepared);
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
    }
    std::sort(secs.begin(), secs.end());
    double err = 0;
    for (int i = 0; i < s.m; i += std::max(1, s.m / 7))
      for (int j = 0; j < s.n; j += std::max(1, s.n / 7)) {
        double acc = 0;
        for (int p = 0; p < s.k; ++p)
          acc += double(s.ta ? a[size_t(p) * s.m + i] : a[size_t(i) * s.k + p]) *
                 double(s.tb ? b[size_t(j) * s.k + p] : b[size_t(p) * s.n + j]);
        err = std::max(err, std::fabs(acc - c[size_t(i) * s.n + j]));
      }
    std::printf("%s\t%s\t%d,%d,%d,%s%s\t%.1f\t%.1e\n", kName, s.label, s.m, s.n, s.k, s.ta ? "T" : "N",
                s.tb ? "T" : "N", flops / secs[3] / 1e9, err);
    std::fflush(stdout);
  }
}
