// MatMulNBits's int8 path (accuracy_level 4; see matmul_nbits.h) built for
// AVX-512 VNNI: per super-group of 16 blocks, 4 runs of 64 code bytes split
// into low and high halves, 8 vpdpbusd per row into one vector whose lane b
// is block b's sum, then both scales once per lane.
#include "matmul_nbits.h"
#include <immintrin.h>

namespace sd::cpu::nbits {
namespace {

template <int R>
void rowsOf(const Repacked &w, int64_t N, const Int8Rows &x, int64_t first, int64_t n0, int64_t n1, float *y) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t groups = w.superGroups;
  for (int64_t n = n0; n < n1; ++n) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t *codes = w.codes.data() + (n * groups + g) * 256;
      __m512i lo[4], hi[4];
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(codes + 64 * c);
        lo[c] = _mm512_and_si512(v, low);
        hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      const __m512 ws = _mm512_loadu_ps(w.scales.data() + (n * groups + g) * 16);
      for (int r = 0; r < R; ++r) {
        const int64_t at = (first + r) * groups + g;
        const int8_t *a = x.values.data() + at * 512;
        __m512i d = _mm512_loadu_si512(x.zeroSums.data() + at * 16);
        for (int c = 0; c < 4; ++c) {
          d = _mm512_dpbusd_epi32(d, lo[c], _mm512_loadu_si512(a + 128 * c));
          d = _mm512_dpbusd_epi32(d, hi[c], _mm512_loadu_si512(a + 128 * c + 64));
        }
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(ws, _mm512_loadu_ps(x.scales.data() + at * 16)),
                                 acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) y[(first + r) * N + n] = _mm512_reduce_add_ps(acc[r]);
  }
}

} // namespace

void rowsVnni(const Repacked &w, int64_t N, const Int8Rows &x, int64_t rows, int64_t n0, int64_t n1, float *y) {
  // Eight rows at a time over the same weight rows, which stay in cache between them.
  for (int64_t first = 0; first < rows; first += kFewRows)
    withRows(rows - first, [&](auto r) { rowsOf<decltype(r)::value>(w, N, x, first, n0, n1, y); });
}

} // namespace sd::cpu::nbits
