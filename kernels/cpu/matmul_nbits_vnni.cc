// MatMulNBits's int8 path (accuracy_level 4; see matmul_nbits.h) built for
// AVX-512 VNNI: 64 code bytes (4 blocks of 32) split into low and high
// halves, each dotted with the rows' int8 values by vpdpbusd (u8 x s8 summed
// in fours into i32: lanes 4b..4b+3 hold block b), then scaled per lane.
#include "matmul_nbits.h"
#include <immintrin.h>

namespace sd::cpu::nbits {
namespace {

template <int R>
void rowsOf(const Weights &q, const Int8Rows &x, int64_t first, int64_t n0, int64_t n1, float *y) {
  const __m512i lanesOfBlock = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t groups = x.groups;
  for (int64_t n = n0; n < n1; ++n) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const uint8_t *codes = q.codes + n * q.blocks * 16;
    const float *scales = q.scales + n * q.blocks;
    for (int64_t g = 0; g < groups; ++g) {
      // A whole group loads plainly (a masked load streams from memory slower); the last may hold fewer blocks.
      const int64_t inGroup = q.blocks - 4 * g < 4 ? q.blocks - 4 * g : 4;
      __m512i v;
      __m512 ws;
      if (inGroup == 4) {
        v = _mm512_loadu_si512(codes + 64 * g);
        ws = _mm512_permutexvar_ps(lanesOfBlock, _mm512_castps128_ps512(_mm_loadu_ps(scales + 4 * g)));
      } else {
        v = _mm512_maskz_loadu_epi8((__mmask64(1) << (16 * inGroup)) - 1, codes + 64 * g);
        ws = _mm512_permutexvar_ps(lanesOfBlock, _mm512_maskz_loadu_ps(__mmask16((1u << inGroup) - 1), scales + 4 * g));
      }
      const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      for (int r = 0; r < R; ++r) {
        const int64_t at = (first + r) * groups + g;
        const int8_t *a = x.values.data() + at * 128;
        __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(a));
        d = _mm512_dpbusd_epi32(d, hi, _mm512_loadu_si512(a + 64));
        const float *lane = x.scales.data() + at * 16, *share = x.zeroShare.data() + at * 16;
        const __m512 f = _mm512_sub_ps(_mm512_cvtepi32_ps(d), _mm512_loadu_ps(share));
        acc[r] = _mm512_fmadd_ps(f, _mm512_mul_ps(ws, _mm512_loadu_ps(lane)), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) y[(first + r) * q.N + n] = _mm512_reduce_add_ps(acc[r]);
  }
}

} // namespace

void rowsVnni(const Weights &q, const Int8Rows &x, int64_t rows, int64_t n0, int64_t n1, float *y) {
  // Eight rows at a time over the same weight rows, which stay in cache between them.
  for (int64_t first = 0; first < rows; first += kFewRows) {
    withRows(rows - first, [&](auto r) { rowsOf<decltype(r)::value>(q, x, first, n0, n1, y); });
  }
}

} // namespace sd::cpu::nbits
