// What the MatMulNBits kernel (matmul_nbits.cc) shares with its
// instruction-set builds (matmul_nbits_avx512.cc, matmul_nbits_avx2.cc).
//
// Every f32 operand a block touches is laid out in the codes' byte order:
// within a block, the elements byte j holds in its bit slot t sit at
// t * blob + j (for 4 bits: the even elements, then the odd ones), so
// unpacking a run of bytes is a shift and a mask, never an interleave. A row
// of a is laid out so (zero past K), and the many-rows path widens weight rows
// into the same order, so the GEMM over the laid-out K gives a W^T unchanged.
#pragma once
#include <cstdint>
#include <type_traits>
#include <vector>

namespace sd::cpu::nbits {

constexpr int64_t kFewRows = 8; // up to this many rows of a: the packed weights read in place

// f(std::integral_constant<int, R>{}) with R = rows in 1..kFewRows (more: kFewRows), so
// the vector builds keep each row's accumulator in a register.
template <typename F> void withRows(int64_t rows, F &&f) {
  switch (rows) {
  case 1: return f(std::integral_constant<int, 1>{});
  case 2: return f(std::integral_constant<int, 2>{});
  case 3: return f(std::integral_constant<int, 3>{});
  case 4: return f(std::integral_constant<int, 4>{});
  case 5: return f(std::integral_constant<int, 5>{});
  case 6: return f(std::integral_constant<int, 6>{});
  case 7: return f(std::integral_constant<int, 7>{});
  default: return f(std::integral_constant<int, 8>{});
  }
}

struct Weights {
  int64_t K = 0, N = 0, bits = 4, block = 32, blocks = 0, blob = 0, perByte = 2, zeroStride = 0;
  uint32_t mask = 15;
  const uint8_t *codes = nullptr; // [N, blocks, blob]
  const float *scales = nullptr;  // [N, blocks]
  const uint8_t *packedZeros = nullptr; // u8 zero points, `bits` each: [N, zeroStride]
  const float *floatZeros = nullptr;    // or float ones [N, blocks]
  float defaultZero = 8;

  int64_t span() const { return blocks * block; } // K padded to whole blocks
  float zero(int64_t n, int64_t kb) const {
    if (floatZeros) return floatZeros[n * blocks + kb];
    if (!packedZeros) return defaultZero;
    const int64_t bit = kb * bits;
    return float((packedZeros[n * zeroStride + bit / 8] >> (bit % 8)) & mask);
  }
  // The vector builds take 4-bit codes in blocks of a multiple of 32 (16-byte runs).
  bool vectorForm() const { return bits == 4 && blob % 16 == 0; }
  // The int8 path takes 4-bit codes in blocks of 32 with the default zero point.
  bool int8Form() const { return bits == 4 && block == 32 && !packedZeros && !floatZeros; }
};

// Rows of a quantized to int8 per block of 32 (accuracy_level 4, as
// onnxruntime's CPU kernel computes there), for u8 x s8 dot products four
// blocks at a time: per row and group of 4 blocks, 64 bytes of the blocks'
// even elements (16 each, block after block: the low halves of the group's
// 64 code bytes), 64 of their odd ones, and 16 lanes each of the blocks'
// scales (lane 4b + i: block b's) and of 8 x the block's quantized sum / 4
// (the default zero point's share of a lane).
struct Int8Rows {
  int64_t groups = 0;
  std::vector<int8_t> values;          // [rows, groups, 128]
  std::vector<float> scales, zeroShare; // [rows, groups, 16] each
};
// y[r, n] for every row of x and n in [n0, n1).
void rowsVnni(const Weights &, const Int8Rows &, int64_t rows, int64_t n0, int64_t n1, float *y);

// y[r, n] (row stride N) for n in [n0, n1) and `rows` laid-out rows of a
// (stride span()), `sums` [rows, blocks] their block sums.
using FewRowsFn = void (*)(const Weights &, const float *laid, const float *sums, int64_t rows, int64_t n0,
                           int64_t n1, float *y);
// Weight rows [n0, n1) as f32 in byte order, [n1 - n0, span()].
using WidenFn = void (*)(const Weights &, int64_t n0, int64_t n1, float *w);

void fewRowsAvx512(const Weights &, const float *, const float *, int64_t, int64_t, int64_t, float *);
void widenAvx512(const Weights &, int64_t, int64_t, float *);
void fewRowsAvx2(const Weights &, const float *, const float *, int64_t, int64_t, int64_t, float *);
void widenAvx2(const Weights &, int64_t, int64_t, float *);

} // namespace sd::cpu::nbits
