// The f32 GEMM for CPUs with AVX-512F (compiled with -mavx512f -mfma): a 12 x 32
// register tile, 24 of the 32 zmm registers as accumulators.
#include "sgemm_blocked.h"
#include <immintrin.h>

// GCC 12's AVX-512 shuffle intrinsics pass _mm512_undefined_ps() as the
// masked-off source and then warn that it may be used uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace sd::cpu::sgemm_isa {
namespace {

struct Avx512 {
  static constexpr int W = 16;
  using V = __m512;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float *p) { return _mm512_loadu_ps(p); }
  static __mmask16 mask(int n) { return __mmask16((1u << n) - 1u); }
  static V loadN(const float *p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static void store(float *p, V v) { _mm512_storeu_ps(p, v); }
  static void storeN(float *p, V v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  // r[i][j] <- r[j][i], 16 x 16: pairs of rows interleaved, then 2-, 4- and
  // 8-float blocks exchanged between ever farther rows.
  static void transpose(V (&r)[16]) {
    V t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
      r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
      r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 16; i += 8)
      for (int k = 0; k < 4; ++k) {
        t[i + k] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0x88);
        t[i + k + 4] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0xDD);
      }
    for (int k = 0; k < 8; ++k) {
      r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
      r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xDD);
    }
  }
  static float sum(V v) { // via memory: GCC 12's lane-extract intrinsics warn (-Wmaybe-uninitialized)
    alignas(64) float t[16];
    _mm512_store_ps(t, v);
    __m128 s = _mm_add_ps(_mm_add_ps(_mm_load_ps(t), _mm_load_ps(t + 4)),
                          _mm_add_ps(_mm_load_ps(t + 8), _mm_load_ps(t + 12)));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
};

} // namespace

const Kernels &avx512Kernels() { return Blocked<Avx512, 12>::kernels("avx512"); }

} // namespace sd::cpu::sgemm_isa
