// MatMulNBits's 4-bit paths built for AVX-512 (see matmul_nbits.h): a
// 16-byte run of codes is 16 low and 16 high halves, each widened to 16 floats.
#include "matmul_nbits.h"
#include <immintrin.h>

namespace sd::cpu::nbits {
namespace {

struct Halves {
  __m512 lo, hi;
};

inline Halves unpack(const uint8_t *bytes) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(bytes)), mask = _mm_set1_epi8(0x0F);
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, mask))),
          _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), mask)))};
}

template <int R>
void fewRowsOf(const Weights &q, const float *laid, const float *sums, int64_t n0, int64_t n1, float *y) {
  const int64_t span = q.span(), runs = q.blob / 16;
  for (int64_t n = n0; n < n1; ++n) {
    __m512 acc[R];
    float corr[R] = {};
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const uint8_t *row = q.codes + n * q.blocks * q.blob;
    for (int64_t kb = 0; kb < q.blocks; ++kb) {
      const float s = q.scales[n * q.blocks + kb], sz = s * q.zero(n, kb);
      const __m512 vs = _mm512_set1_ps(s);
      for (int64_t c = 0; c < runs; ++c) {
        const Halves h = unpack(row + kb * q.blob + 16 * c);
        for (int r = 0; r < R; ++r) {
          const float *x = laid + r * span + kb * q.block + 16 * c;
          const __m512 part = _mm512_fmadd_ps(h.hi, _mm512_loadu_ps(x + q.blob), _mm512_mul_ps(h.lo, _mm512_loadu_ps(x)));
          acc[r] = _mm512_fmadd_ps(vs, part, acc[r]);
        }
      }
      for (int r = 0; r < R; ++r) corr[r] += sz * sums[r * q.blocks + kb];
    }
    for (int r = 0; r < R; ++r) y[r * q.N + n] = _mm512_reduce_add_ps(acc[r]) - corr[r];
  }
}

} // namespace

void fewRowsAvx512(const Weights &q, const float *laid, const float *sums, int64_t rows, int64_t n0, int64_t n1,
                 float *y) {
  withRows(rows, [&](auto r) { fewRowsOf<decltype(r)::value>(q, laid, sums, n0, n1, y); });
}

void widenAvx512(const Weights &q, int64_t n0, int64_t n1, float *w) {
  const int64_t span = q.span(), runs = q.blob / 16;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t *row = q.codes + n * q.blocks * q.blob;
    float *dst = w + (n - n0) * span;
    for (int64_t kb = 0; kb < q.blocks; ++kb) {
      const float s = q.scales[n * q.blocks + kb];
      const __m512 vs = _mm512_set1_ps(s), vz = _mm512_set1_ps(q.zero(n, kb));
      for (int64_t c = 0; c < runs; ++c) {
        const Halves h = unpack(row + kb * q.blob + 16 * c);
        float *out = dst + kb * q.block + 16 * c;
        _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_sub_ps(h.lo, vz), vs));
        _mm512_storeu_ps(out + q.blob, _mm512_mul_ps(_mm512_sub_ps(h.hi, vz), vs));
      }
    }
  }
}

} // namespace sd::cpu::nbits
