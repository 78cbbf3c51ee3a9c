// MatMulNBits's 4-bit paths built for AVX2 + FMA (see matmul_nbits.h): a
// 16-byte run of codes is 16 low and 16 high halves, each widened to two
// vectors of 8 floats.
#include "matmul_nbits.h"
#include <immintrin.h>

namespace sd::cpu::nbits {
namespace {

struct Halves {
  __m256 lo[2], hi[2];
};

inline __m256 widen8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }

inline Halves unpack(const uint8_t *bytes) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(bytes)), mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  return {{widen8(lo), widen8(_mm_srli_si128(lo, 8))}, {widen8(hi), widen8(_mm_srli_si128(hi, 8))}};
}

inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R>
void fewRowsOf(const Weights &q, const float *laid, const float *sums, int64_t n0, int64_t n1, float *y) {
  const int64_t span = q.span(), runs = q.blob / 16;
  for (int64_t n = n0; n < n1; ++n) {
    __m256 acc[R];
    float corr[R] = {};
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const uint8_t *row = q.codes + n * q.blocks * q.blob;
    for (int64_t kb = 0; kb < q.blocks; ++kb) {
      const float s = q.scales[n * q.blocks + kb], sz = s * q.zero(n, kb);
      const __m256 vs = _mm256_set1_ps(s);
      for (int64_t c = 0; c < runs; ++c) {
        const Halves h = unpack(row + kb * q.blob + 16 * c);
        for (int r = 0; r < R; ++r) {
          const float *x = laid + r * span + kb * q.block + 16 * c;
          __m256 part = _mm256_mul_ps(h.lo[0], _mm256_loadu_ps(x));
          part = _mm256_fmadd_ps(h.lo[1], _mm256_loadu_ps(x + 8), part);
          part = _mm256_fmadd_ps(h.hi[0], _mm256_loadu_ps(x + q.blob), part);
          part = _mm256_fmadd_ps(h.hi[1], _mm256_loadu_ps(x + q.blob + 8), part);
          acc[r] = _mm256_fmadd_ps(vs, part, acc[r]);
        }
      }
      for (int r = 0; r < R; ++r) corr[r] += sz * sums[r * q.blocks + kb];
    }
    for (int r = 0; r < R; ++r) y[r * q.N + n] = sum8(acc[r]) - corr[r];
  }
}

} // namespace

void fewRowsAvx2(const Weights &q, const float *laid, const float *sums, int64_t rows, int64_t n0, int64_t n1,
                 float *y) {
  withRows(rows, [&](auto r) { fewRowsOf<decltype(r)::value>(q, laid, sums, n0, n1, y); });
}

void widenAvx2(const Weights &q, int64_t n0, int64_t n1, float *w) {
  const int64_t span = q.span(), runs = q.blob / 16;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t *row = q.codes + n * q.blocks * q.blob;
    float *dst = w + (n - n0) * span;
    for (int64_t kb = 0; kb < q.blocks; ++kb) {
      const __m256 vs = _mm256_set1_ps(q.scales[n * q.blocks + kb]), vz = _mm256_set1_ps(q.zero(n, kb));
      for (int64_t c = 0; c < runs; ++c) {
        const Halves h = unpack(row + kb * q.blob + 16 * c);
        float *out = dst + kb * q.block + 16 * c;
        for (int half = 0; half < 2; ++half) {
          _mm256_storeu_ps(out + 8 * half, _mm256_mul_ps(_mm256_sub_ps(h.lo[half], vz), vs));
          _mm256_storeu_ps(out + q.blob + 8 * half, _mm256_mul_ps(_mm256_sub_ps(h.hi[half], vz), vs));
        }
      }
    }
  }
}

} // namespace sd::cpu::nbits
