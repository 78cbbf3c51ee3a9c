// The f32 GEMM against a double-precision reference loop: every transpose
// combination, alpha/beta cases, ragged edges of the register tiles, products
// larger than one cache block, a packed right operand and a threaded split.
// CTest runs it once per instruction set this CPU has (SD_CPU_ISA).
#include "../../kernels/cpu/sgemm.h"
#include "sd/ops/threadpool.h"
#include <cmath>
#include <cstdlib>
#include <gtest/gtest.h>
#include <random>
#include <string>
#include <vector>

using namespace sd;

namespace {

struct Case {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

// packed: bit 0 packs B, bit 1 packs A.
void checkCase(const Case &t, ThreadPool *pool, int packed, std::mt19937 &rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  int64_t lda = (t.ta ? t.m : t.k) + 3, ldb = (t.tb ? t.k : t.n) + 5, ldc = t.n + 2;
  std::vector<float> a(size_t((t.ta ? t.k : t.m) * lda + 1)), b(size_t((t.tb ? t.n : t.k) * ldb + 1)),
      c(size_t(t.m * ldc + 1));
  for (float &x : a) x = u(rng);
  for (float &x : b) x = u(rng);
  // beta == 0 must not read C: NaN there would leak into the result.
  for (float &x : c) x = t.beta == 0 ? NAN : u(rng);
  std::vector<float> c0 = c;
  cpu::PackedB pb;
  cpu::PackedA pa;
  if (packed & 1) pb = cpu::packB(t.tb, t.k, t.n, b.data(), ldb);
  if (packed & 2) pa = cpu::packA(t.ta, t.m, t.k, a.data(), lda);
  cpu::sgemm(pool, t.ta, t.tb, t.m, t.n, t.k, t.alpha, a.data(), lda, b.data(), ldb, t.beta, c.data(), ldc,
             packed & 1 ? &pb : nullptr, packed & 2 ? &pa : nullptr);
  for (int64_t i = 0; i < t.m; ++i)
    for (int64_t j = 0; j < t.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < t.k; ++p)
        acc += double(t.ta ? a[p * lda + i] : a[i * lda + p]) * double(t.tb ? b[j * ldb + p] : b[p * ldb + j]);
      double want = t.alpha * acc + (t.beta == 0 ? 0.0 : t.beta * double(c0[i * ldc + j]));
      ASSERT_NEAR(c[i * ldc + j], want, 1e-4 * (1 + std::sqrt(double(t.k))))
          << "m=" << t.m << " n=" << t.n << " k=" << t.k << " ta=" << t.ta << " tb=" << t.tb << " alpha=" << t.alpha
          << " beta=" << t.beta << " packed=" << packed << " at " << i << "," << j;
    }
  // Padding between rows (ldc > n) is never written.
  for (int64_t i = 0; i < t.m; ++i)
    for (int64_t j = t.n; j < ldc; ++j)
      if (t.beta != 0) ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]);
}

TEST(Sgemm, ReportsTheRequestedIsa) {
  const char *want = std::getenv("SD_CPU_ISA");
  if (!want) GTEST_SKIP() << "SD_CPU_ISA not set";
  EXPECT_EQ(std::string(cpu::sgemmIsa()), want);
}

TEST(Sgemm, SmallShapesEveryLayout) {
  std::mt19937 rng(7);
  for (int64_t m : {1, 2, 5, 6, 7, 12, 13, 25})
    for (int64_t n : {1, 3, 8, 16, 17, 32, 33, 70})
      for (int64_t k : {0, 1, 4, 31})
        for (int layout = 0; layout < 4; ++layout)
          for (int packed : {0, 1, 2, 3})
            checkCase({m, n, k, bool(layout & 1), bool(layout & 2), 1.0f, layout == 3 ? 0.5f : 0.0f}, nullptr,
                      packed, rng);
}

TEST(Sgemm, AlphaBetaAndBlocking) {
  std::mt19937 rng(11);
  // k past one K block (256), m past one M block, n past one N block (2048).
  checkCase({200, 90, 600, false, false, 0.5f, 1.0f}, nullptr, 0, rng);
  checkCase({200, 90, 600, true, false, 0.5f, 1.0f}, nullptr, 2, rng);
  checkCase({37, 2100, 300, false, true, 1.0f, 0.0f}, nullptr, 1, rng);
  checkCase({37, 2100, 300, true, false, -2.0f, 0.25f}, nullptr, 0, rng);
  checkCase({3, 300, 520, true, true, 1.0f, 1.0f}, nullptr, 3, rng);
  // One row against a packed B (a decode step's product) takes the GEMV path:
  // k past a K block, a ragged last panel, alpha and beta, A stored transposed.
  checkCase({1, 300, 600, false, false, 0.5f, 1.0f}, nullptr, 1, rng);
  checkCase({1, 70, 300, true, false, 1.0f, 0.0f}, nullptr, 1, rng);
  checkCase({1, 33, 7, false, true, -1.0f, 0.5f}, nullptr, 1, rng);
  // LoRA-rank outputs (n = 8, 16) with a long k take the skinny kernels.
  for (int layout = 0; layout < 4; ++layout) {
    checkCase({300, 8, 700, bool(layout & 1), bool(layout & 2), 1.0f, layout == 2 ? 1.0f : 0.0f}, nullptr, 0, rng);
    checkCase({45, 16, 129, bool(layout & 1), bool(layout & 2), 0.5f, 0.0f}, nullptr, layout == 3 ? 1 : 0, rng);
  }
}

TEST(Sgemm, ThreadedSplitsMatch) {
  std::mt19937 rng(13);
  ThreadPool pool(3);
  for (int packed : {0, 1, 2, 3}) {
    checkCase({256, 384, 128, false, false, 1.0f, 0.0f}, &pool, packed, rng); // split by columns
    checkCase({700, 40, 96, false, true, 1.0f, 1.0f}, &pool, packed, rng);    // split by rows
    checkCase({129, 130, 131, true, true, 0.5f, 0.5f}, &pool, packed, rng);
    checkCase({1, 1536, 512, false, false, 1.0f, 0.0f}, &pool, packed, rng); // B's panels split across threads
  }
}

} // namespace
