// What each instruction-set build of the f32 GEMM (sgemm_avx512.cc,
// sgemm_avx2.cc) exports to the dispatcher in sgemm.cc.
#pragma once
#include "sgemm.h"

namespace sd::cpu::sgemm_isa {

// The right operand: raw (b, ldb, tb), packed into this ISA's panels, or
// indirect: row p of op(B) starts at b + rowOffsets[p] (tb false, ldb unused),
// as the shifted input rows of an implicit-GEMM convolution.
struct BOperand {
  const float *b = nullptr;
  int64_t ldb = 0;
  bool tb = false;
  const PackedB *packed = nullptr;
  const int64_t *rowOffsets = nullptr;
};

// The left operand: raw (a, lda, ta) or packed into this ISA's row panels,
// starting at row i0 of the packed matrix (a multiple of rowTile).
struct AOperand {
  const float *a = nullptr;
  int64_t lda = 0;
  bool ta = false;
  const PackedA *packed = nullptr;
  int64_t i0 = 0;
};

struct Kernels {
  const char *name;
  int panelWidth; // columns per register tile (NR)
  int rowTile;    // rows per register tile (MR)
  // Packs all of op(B) (k x n) into ceil(n / panelWidth) panels at dst.
  void (*packPanels)(bool tb, int64_t k, int64_t n, const float *b, int64_t ldb, float *dst);
  // Packs all of op(A) (m x k) into ceil(m / rowTile) row panels at dst.
  void (*packRowPanels)(bool ta, int64_t m, int64_t k, const float *a, int64_t lda, float *dst);
  // One thread's share: columns [j0, j0 + n) of op(B) into c (already offset
  // to that column); with a packed B, j0 is a multiple of panelWidth.
  void (*gemm)(const AOperand &a, int64_t m, int64_t n, int64_t k, float alpha, const BOperand &b, int64_t j0,
               float beta, float *c, int64_t ldc);
};

const Kernels &avx512Kernels();
const Kernels &avx2Kernels();

} // namespace sd::cpu::sgemm_isa
