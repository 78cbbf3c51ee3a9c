// The blocked GEMM shared by every instruction-set build: GotoBLAS-style
// cache blocking (K by KC, M by MC, N by NC), operands packed into panels so
// the register tile streams through contiguous memory, and a register tile of
// ROWS x (2 vectors) accumulators. Included only by the ISA translation units,
// each compiled with its own -m flags and its own Vec traits:
//   Vec::W, Vec::V, zero(), load(p), loadN(p, n), store(p, v), storeN(p, v, n),
//   set1(x), fmadd(a, b, c), mul(a, b), add(a, b), sum(v), transpose(V (&rows)[W]).
#pragma once
#include "sgemm_isa.h"
#include <cstdlib>
#include <cstring>
#include <utility>

namespace sd::cpu::sgemm_isa {

template <class Vec, int MR> struct Blocked {
  static constexpr int W = Vec::W, NR = 2 * W;
  // KC x NR of B stays in L1 while a tile's row panel streams; MC x KC of A
  // (192 KiB) stays in L2; NC x KC of B (1 MiB) in L2 or L3. On the dev VM
  // (bench/gemm) KC 128-256 and NC 512-2048 were within its run-to-run noise.
  static constexpr int64_t KC = 256, MC = MR * 16, NC = 1024;
  // Up to this many rows of A, a row-major B is read in place. Measured on
  // bench/gemm (AVX-512): m=64 conv 90 vs 52 GFLOP/s, m=1 19 vs 3 in place;
  // m=256..512 lost 15-25% in place, where B's rows are far apart.
  static constexpr int64_t kDirectRows = 64;
  // Not std::min: an inline function with external linkage compiled here
  // with -mavx512f could be the copy the linker keeps for every caller.
  static int64_t lo(int64_t x, int64_t y) { return x < y ? x : y; }

  // B's row p is at bp + p * bs, or at bp + offs[p] when Indirect.
  template <int R, bool Indirect>
  static void tile(int64_t kc, const float *ap, const float *bp, int64_t bs, const int64_t *offs, float *c,
                   int64_t ldc, int cols, float alpha, float beta) {
    typename Vec::V acc0[R], acc1[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = Vec::zero();
    for (int64_t p = 0; p < kc; ++p, ap += MR) {
      const float *row = Indirect ? bp + offs[p] : bp + p * bs;
      typename Vec::V b0 = Vec::load(row), b1 = Vec::load(row + W);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        typename Vec::V a = Vec::set1(ap[r]);
        acc0[r] = Vec::fmadd(a, b0, acc0[r]);
        acc1[r] = Vec::fmadd(a, b1, acc1[r]);
      }
    }
    typename Vec::V va = Vec::set1(alpha), vb = Vec::set1(beta);
    int n0 = lo(cols, W), n1 = cols - n0;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      float *cr = c + r * ldc;
      typename Vec::V v0 = Vec::mul(acc0[r], va), v1 = Vec::mul(acc1[r], va);
      if (cols == NR) {
        if (beta != 0.0f) {
          v0 = Vec::fmadd(vb, Vec::load(cr), v0);
          v1 = Vec::fmadd(vb, Vec::load(cr + W), v1);
        }
        Vec::store(cr, v0);
        Vec::store(cr + W, v1);
        continue;
      }
      if (beta != 0.0f) v0 = Vec::fmadd(vb, Vec::loadN(cr, n0), v0);
      Vec::storeN(cr, v0, n0);
      if (n1 > 0) {
        if (beta != 0.0f) v1 = Vec::fmadd(vb, Vec::loadN(cr + W, n1), v1);
        Vec::storeN(cr + W, v1, n1);
      }
    }
  }

  template <int... Rs>
  static void tileRows(int rows, int64_t kc, const float *ap, const float *bp, int64_t bs, const int64_t *offs,
                       float *c, int64_t ldc, int cols, float alpha, float beta, std::integer_sequence<int, Rs...>) {
    using Fn = void (*)(int64_t, const float *, const float *, int64_t, const int64_t *, float *, int64_t, int, float,
                        float);
    static constexpr Fn fns[] = {&tile<Rs + 1, false>...}, indirect[] = {&tile<Rs + 1, true>...};
    (offs ? indirect : fns)[rows - 1](kc, ap, bp, bs, offs, c, ldc, cols, alpha, beta);
  }

  // dst[p * ds + j] = src[j * ss + p] for j < cols, p < kc: W x W tiles
  // transposed in registers (Vec::transpose), the ragged edges through
  // masked loads and stores. (Element by element, this was a fifth of a
  // small Llama's training step: every activation packed as A goes through it.)
  static void transposeInto(const float *src, int64_t ss, int cols, int64_t kc, float *dst, int ds) {
    for (int j0 = 0; j0 < cols; j0 += W) {
      int rows = int(lo(W, cols - j0));
      for (int64_t p0 = 0; p0 < kc; p0 += W) {
        int n = int(lo(W, kc - p0));
        typename Vec::V r[W];
#pragma GCC unroll 16
        for (int j = 0; j < W; ++j)
          r[j] = j >= rows ? Vec::zero() : n == W ? Vec::load(src + (j0 + j) * ss + p0)
                                                  : Vec::loadN(src + (j0 + j) * ss + p0, n);
        Vec::transpose(r);
        for (int p = 0; p < n; ++p) {
          float *d = dst + (p0 + p) * ds + j0;
          if (rows == W) Vec::store(d, r[p]);
          else Vec::storeN(d, r[p], rows);
        }
      }
    }
  }

  // Rows [i0, i0 + mc) of op(A), columns [p0, p0 + kc), as ceil(mc / MR)
  // panels of kc rows of MR floats (the last one zero-padded).
  static void packA(bool ta, const float *a, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
                    float *dst) {
    if (ta) { // op(A) row i is column i of A: each of A's rows gives every panel MR floats in a run
      for (int64_t p = 0; p < kc; ++p) {
        const float *src = a + (p0 + p) * lda + i0;
        for (int64_t ir = 0; ir < mc; ir += MR)
          std::memcpy(dst + ir * kc + p * MR, src + ir, size_t(lo(MR, mc - ir)) * sizeof(float));
      }
    } else {
      for (int64_t ir = 0; ir < mc; ir += MR)
        transposeInto(a + (i0 + ir) * lda + p0, lda, int(lo(MR, mc - ir)), kc, dst + ir * kc, MR);
    }
    if (int64_t rows = mc % MR) {
      float *last = dst + (mc / MR) * kc * MR;
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t r = rows; r < MR; ++r) last[p * MR + r] = 0.0f;
    }
  }

  // Columns [j0, j0 + cols) of op(B), rows [p0, p0 + kc): kc rows of NR
  // floats. With rowOffsets, row p of op(B) is at b + rowOffsets[p].
  static void packBPanel(bool tb, const float *b, int64_t ldb, int64_t j0, int cols, int64_t p0, int64_t kc,
                         float *dst, const int64_t *rowOffsets = nullptr) {
    if (!tb) {
      for (int64_t p = 0; p < kc; ++p) {
        const float *src = b + (rowOffsets ? rowOffsets[p0 + p] : (p0 + p) * ldb) + j0;
        float *d = dst + p * NR;
        std::memcpy(d, src, size_t(cols) * sizeof(float));
        for (int j = cols; j < NR; ++j) d[j] = 0.0f;
      }
      return;
    }
    transposeInto(b + j0 * ldb + p0, ldb, cols, kc, dst, NR);
    for (int j = cols; j < NR; ++j)
      for (int64_t p = 0; p < kc; ++p) dst[p * NR + j] = 0.0f;
  }

  static void packPanels(bool tb, int64_t k, int64_t n, const float *b, int64_t ldb, float *dst) {
    for (int64_t j = 0; j < n; j += NR)
      packBPanel(tb, b, ldb, j, int(lo(NR, n - j)), 0, k, dst + (j / NR) * k * NR);
  }

  static void packRowPanels(bool ta, int64_t m, int64_t k, const float *a, int64_t lda, float *dst) {
    packA(ta, a, lda, 0, m, 0, k, dst); // one block of all rows and columns: the same panels
  }

  static float *threadBuffer(size_t floats, int which) {
    struct Buffers {
      float *p[2] = {nullptr, nullptr};
      ~Buffers() {
        std::free(p[0]);
        std::free(p[1]);
      }
    };
    thread_local Buffers buffers;
    if (!buffers.p[which]) buffers.p[which] = static_cast<float *>(std::aligned_alloc(64, floats * sizeof(float)));
    return buffers.p[which];
  }

  // Skinny products (n <= W, as LoRA's x·A with rank 8 or 16): a register
  // tile 2W wide would waste most of its lanes, and packing A (m x k) would
  // cost more than the arithmetic. op(B)'s n columns are copied to a small
  // buffer; A is read in place, vectorized along its contiguous direction.
  // ob is op(B)'s N columns from gatherSkinnyB: k rows of N when A is stored
  // transposed, else N rows of k.
  template <int N> static void skinnyFixed(const AOperand &a, int64_t m, int64_t k, float alpha, const float *ob,
                                           float beta, float *c, int64_t ldc) {
    if (a.ta) { // A stored k x m: W rows of op(A) per vector, N accumulators
      alignas(64) float tmp[N * W];
      for (int64_t i0 = 0; i0 < m; i0 += W) {
        int rows = int(lo(W, m - i0));
        typename Vec::V acc[N];
#pragma GCC unroll 16
        for (int j = 0; j < N; ++j) acc[j] = Vec::zero();
        for (int64_t p = 0; p < k; ++p) {
          typename Vec::V av = rows == W ? Vec::load(a.a + p * a.lda + i0) : Vec::loadN(a.a + p * a.lda + i0, rows);
#pragma GCC unroll 16
          for (int j = 0; j < N; ++j) acc[j] = Vec::fmadd(av, Vec::set1(ob[p * N + j]), acc[j]);
        }
#pragma GCC unroll 16
        for (int j = 0; j < N; ++j) Vec::store(tmp + j * W, acc[j]);
        for (int r = 0; r < rows; ++r)
          for (int j = 0; j < N; ++j) {
            float *cr = c + (i0 + r) * ldc + j;
            *cr = alpha * tmp[j * W + r] + (beta == 0.0f ? 0.0f : beta * *cr);
          }
      }
      return;
    }
    for (int64_t i = 0; i < m; ++i) { // A row i is contiguous: N dot products along k
      const float *ai = a.a + i * a.lda;
      typename Vec::V acc[N];
#pragma GCC unroll 16
      for (int j = 0; j < N; ++j) acc[j] = Vec::zero();
      int64_t p = 0;
      for (; p + W <= k; p += W) {
        typename Vec::V av = Vec::load(ai + p);
#pragma GCC unroll 16
        for (int j = 0; j < N; ++j) acc[j] = Vec::fmadd(av, Vec::load(ob + j * k + p), acc[j]);
      }
      if (p < k) {
        int rest = int(k - p);
        typename Vec::V av = Vec::loadN(ai + p, rest);
#pragma GCC unroll 16
        for (int j = 0; j < N; ++j) acc[j] = Vec::fmadd(av, Vec::loadN(ob + j * k + p, rest), acc[j]);
      }
      for (int j = 0; j < N; ++j) {
        float *cij = c + i * ldc + j;
        *cij = alpha * Vec::sum(acc[j]) + (beta == 0.0f ? 0.0f : beta * *cij);
      }
    }
  }

  template <int... Ns>
  static void skinny(int n, const AOperand &a, int64_t m, int64_t k, float alpha, const float *ob, float beta,
                     float *c, int64_t ldc, std::integer_sequence<int, Ns...>) {
    using Fn = void (*)(const AOperand &, int64_t, int64_t, float, const float *, float, float *, int64_t);
    static constexpr Fn fns[] = {&skinnyFixed<Ns + 1>...};
    fns[n - 1](a, m, k, alpha, ob, beta, c, ldc);
  }

  // op(B)[p][j0 + j] for the skinny kernels: k rows of n, or n rows of k
  // when `transposed` (A row-major).
  static void gatherSkinnyB(const BOperand &b, int64_t j0, int64_t n, int64_t k, bool transposed, float *dst) {
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) {
        float v;
        if (b.packed) v = b.packed->data[((j0 + j) / NR) * b.packed->k * NR + p * NR + (j0 + j) % NR];
        else if (b.rowOffsets) v = b.b[b.rowOffsets[p] + j];
        else v = b.tb ? b.b[j * b.ldb + p] : b.b[p * b.ldb + j];
        dst[transposed ? j * k + p : p * n + j] = v;
      }
  }

  // C = alpha op(A) op(B) + beta C one element at a time, for when the
  // packing buffers cannot be allocated (an address-space limit): slow, but
  // a kernel has no way to report the failure mid-step, and must not crash.
  static void unbuffered(const AOperand &a, int64_t m, int64_t n, int64_t k, float alpha, const BOperand &b,
                         int64_t j0, float beta, float *c, int64_t ldc) {
    auto aAt = [&](int64_t i, int64_t p) {
      if (a.packed) return a.packed->data.get()[((a.i0 + i) / MR) * a.packed->k * MR + p * MR + (a.i0 + i) % MR];
      return a.ta ? a.a[p * a.lda + i] : a.a[i * a.lda + p];
    };
    auto bAt = [&](int64_t p, int64_t j) {
      const int64_t col = j0 + j;
      if (b.packed) return b.packed->data.get()[(col / NR) * b.packed->k * NR + p * NR + col % NR];
      if (b.rowOffsets) return b.b[b.rowOffsets[p] + col];
      return b.tb ? b.b[col * b.ldb + p] : b.b[p * b.ldb + col];
    };
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float sum = 0;
        for (int64_t p = 0; p < k; ++p) sum += aAt(i, p) * bAt(p, j);
        float &out = c[i * ldc + j];
        out = alpha * sum + (beta == 0.0f ? 0.0f : beta * out);
      }
  }

  // One row of A against a packed B (a decode step's matrix-vector
  // products): A is read in place and each panel streams once over all of k,
  // with no A panel, no K blocking and four interleaved accumulator pairs.
  static void gemvPacked(const float *a, int64_t n, int64_t k, float alpha, const PackedB &pb, int64_t j0, float beta,
                         float *c) {
    typename Vec::V va = Vec::set1(alpha), vb = Vec::set1(beta);
    for (int64_t jr = 0; jr < n; jr += NR) {
      const float *bp = pb.data.get() + ((j0 + jr) / NR) * pb.k * NR;
      typename Vec::V acc0[4], acc1[4];
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc0[u] = acc1[u] = Vec::zero();
      int64_t p = 0;
      for (; p + 4 <= k; p += 4, bp += 4 * NR) {
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          typename Vec::V x = Vec::set1(a[p + u]);
          acc0[u] = Vec::fmadd(x, Vec::load(bp + u * NR), acc0[u]);
          acc1[u] = Vec::fmadd(x, Vec::load(bp + u * NR + W), acc1[u]);
        }
      }
      for (; p < k; ++p, bp += NR) {
        typename Vec::V x = Vec::set1(a[p]);
        acc0[0] = Vec::fmadd(x, Vec::load(bp), acc0[0]);
        acc1[0] = Vec::fmadd(x, Vec::load(bp + W), acc1[0]);
      }
      typename Vec::V s0 = Vec::add(Vec::add(acc0[0], acc0[1]), Vec::add(acc0[2], acc0[3]));
      typename Vec::V s1 = Vec::add(Vec::add(acc1[0], acc1[1]), Vec::add(acc1[2], acc1[3]));
      s0 = Vec::mul(s0, va), s1 = Vec::mul(s1, va);
      int cols = int(lo(NR, n - jr)), n0 = lo(cols, W), n1 = cols - n0;
      float *cr = c + jr;
      if (beta != 0.0f) s0 = Vec::fmadd(vb, Vec::loadN(cr, n0), s0);
      Vec::storeN(cr, s0, n0);
      if (n1 > 0) {
        if (beta != 0.0f) s1 = Vec::fmadd(vb, Vec::loadN(cr + W, n1), s1);
        Vec::storeN(cr + W, s1, n1);
      }
    }
  }

  static void gemm(const AOperand &a, int64_t m, int64_t n, int64_t k, float alpha, const BOperand &b, int64_t j0,
                   float beta, float *c, int64_t ldc) {
    if (m == 1 && k > 0 && b.packed && !a.packed && (!a.ta || a.lda == 1)) // op(A)'s one row is contiguous
      return gemvPacked(a.a, n, k, alpha, *b.packed, j0, beta, c);
    if (n <= W && k > 0 && !a.packed && size_t(n * k) <= size_t(NC * KC)) {
      float *buf = threadBuffer(size_t(NC * KC), 1);
      if (!buf) return unbuffered(a, m, n, k, alpha, b, j0, beta, c, ldc);
      gatherSkinnyB(b, j0, n, k, !a.ta, buf);
      skinny(int(n), a, m, k, alpha, buf, beta, c, ldc, std::make_integer_sequence<int, W>());
      return;
    }
    if (k == 0) { // nothing to multiply: C = beta * C
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
      return;
    }
    float *apack = a.packed ? nullptr : threadBuffer(size_t(MC * KC), 0);
    float *bpack = b.packed ? nullptr : threadBuffer(size_t(NC * KC), 1);
    if ((!a.packed && !apack) || (!b.packed && !bpack)) return unbuffered(a, m, n, k, alpha, b, j0, beta, c, ldc);
    for (int64_t jc = 0; jc < n; jc += NC) {
      int64_t nc = lo(NC, n - jc);
      for (int64_t pc = 0; pc < k; pc += KC) {
        int64_t kc = lo(KC, k - pc);
        float betaNow = pc == 0 ? beta : 1.0f;
        // Panel q of this block starts at bBlock + q * bPanelStride; its rows
        // are bRowStride apart. A row-major B is read in place when few rows
        // of A share each panel: packing it would cost as much as using it.
        const float *bBlock;
        int64_t bPanelStride, bRowStride = NR;
        const int64_t *offs = nullptr; // an indirect B read in place
        // An indirect B (a convolution's shifted input rows) is always read in
        // place: its rows lie near each other, and packing them per call cost
        // 50% more on the CNN of bench/ (AVX-512, 1 thread).
        bool direct = !b.packed && !b.tb && (b.rowOffsets || m <= kDirectRows);
        if (b.packed) {
          bPanelStride = b.packed->k * NR;
          bBlock = b.packed->data.get() + ((j0 + jc) / NR) * bPanelStride + pc * NR;
        } else if (direct) {
          bBlock = b.b + (b.rowOffsets ? 0 : pc * b.ldb) + j0 + jc;
          offs = b.rowOffsets ? b.rowOffsets + pc : nullptr;
          bPanelStride = NR;
          bRowStride = b.ldb;
          if (nc % NR) // the ragged last panel would read past the row: pack it alone
            packBPanel(false, b.b, b.ldb, j0 + jc + nc / NR * NR, int(nc % NR), pc, kc, bpack, b.rowOffsets);
        } else {
          bPanelStride = kc * NR;
          bBlock = bpack;
          for (int64_t q = 0; q * NR < nc; ++q)
            packBPanel(b.tb, b.b, b.ldb, j0 + jc + q * NR, int(lo(NR, nc - q * NR)), pc, kc,
                       bpack + q * bPanelStride, b.rowOffsets);
        }
        for (int64_t ic = 0; ic < m; ic += MC) {
          int64_t mc = lo(MC, m - ic);
          const float *aBlock; // row panel q of this block at aBlock + q * aPanelStride
          int64_t aPanelStride;
          if (a.packed) {
            aPanelStride = a.packed->k * MR;
            aBlock = a.packed->data.get() + ((a.i0 + ic) / MR) * aPanelStride + pc * MR;
          } else {
            aPanelStride = kc * MR;
            aBlock = apack;
            packA(a.ta, a.a, a.lda, ic, mc, pc, kc, apack);
          }
          for (int64_t jr = 0; jr < nc; jr += NR) {
            int cols = int(lo(NR, nc - jr));
            bool packedTail = direct && cols < NR;
            const float *bp = packedTail ? bpack : bBlock + (jr / NR) * bPanelStride;
            int64_t bs = packedTail ? NR : bRowStride;
            for (int64_t ir = 0; ir < mc; ir += MR)
              tileRows(int(lo(MR, mc - ir)), kc, aBlock + (ir / MR) * aPanelStride, bp, bs, packedTail ? nullptr : offs,
                       c + (ic + ir) * ldc + jc + jr, ldc, cols, alpha, betaNow, std::make_integer_sequence<int, MR>());
          }
        }
      }
    }
  }

  static const Kernels &kernels(const char *name) {
    static const Kernels k{name, NR, MR, &packPanels, &packRowPanels, &gemm};
    return k;
  }
};

} // namespace sd::cpu::sgemm_isa
