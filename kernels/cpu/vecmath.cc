// Branch-free float32 exp/erf/sigmoid/tanh written so GCC vectorizes them; each
// loop is cloned per ISA and picked at load time (target_clones).
#include "vecmath.h"
#include "simd_clones.h"
#include <cmath>
#include <cstring>

namespace sd::cpu {
namespace {

// Cephes-style expf: x = n*ln2 + r, e^r by a degree-6 polynomial, times 2^n.
inline float expApprox(float x) {
  // Comparisons and truncating conversions (not fmin/floor) so GCC vectorizes.
  // The clamps are written so that NaN fails them and becomes -87.3 (a NaN
  // must not reach the float->int conversion: undefined); NaN is restored at
  // the end with bit arithmetic, not a branch, so the loops stay vector code.
  uint32_t inBits;
  std::memcpy(&inBits, &x, 4);
  uint32_t nanMask = 0u - uint32_t((inBits & 0x7fffffffu) > 0x7f800000u);
  // Below the smallest normal result, 0 (flushing denormals): exp(-inf) must
  // be exactly 0, or a softmax row of -inf becomes uniform instead of NaN and
  // masked keys keep a sliver of probability.
  uint32_t keepMask = 0u - uint32_t(!(x < -87.3365f));
  x = x >= -87.3365f ? x : -87.3365f;
  x = x <= 88.7228f ? x : 88.7228f;
  float t = x * 1.44269504088896341f;
  float n = float(int32_t(t + (t >= 0 ? 0.5f : -0.5f)));
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  float y = p * scale;
  uint32_t outBits;
  std::memcpy(&outBits, &y, 4);
  outBits &= keepMask;
  outBits |= nanMask & 0x7fc00000u; // all-ones exponent + quiet bit: NaN in, NaN out
  std::memcpy(&y, &outBits, 4);
  return y;
}

// Abramowitz & Stegun 7.1.26 refined coefficients; |error| < 2e-7.
inline float erfApprox(float x) {
  float ax = x < 0 ? -x : x;
  float t = 1.0f / (1.0f + 0.3275911f * ax);
  float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  float y = 1.0f - poly * expApprox(-ax * ax);
  return x < 0 ? -y : y;
}

// tanh |x| = 1 - 2 / (e^{2|x|} + 1) loses digits to cancellation near 0, so
// below |x| = 0.55 (tanh 0.5) its odd Taylor series through x^15 is used
// instead (truncation under 5e-8 relative there). Past |x| = 10, tanh is +-1
// in float; the clamp is written so that NaN passes through to expApprox,
// which returns NaN.
inline float tanhApprox(float x) {
  const float ax = x < 0 ? -x : x, c = ax > 10.0f ? 10.0f : ax;
  const float far = 1.0f - 2.0f / (expApprox(2.0f * c) + 1.0f);
  const float x2 = x * x;
  float p = -1.4558343870513183e-3f;
  p = p * x2 + 3.592128036572481e-3f;
  p = p * x2 - 8.863235529902197e-3f;
  p = p * x2 + 2.1869488536155203e-2f;
  p = p * x2 - 5.396825396825397e-2f;
  p = p * x2 + 1.3333333333333333e-1f;
  p = p * x2 - 3.333333333333333e-1f;
  const float near = x + x * x2 * p;
  const float sfar = x < 0 ? -far : far;
  const float r = ax < 0.55f ? near : sfar;
  return x == 0 ? x : r; // keeps -0
}

} // namespace

SD_CLONES void vtanh(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = tanhApprox(x[i]);
}

SD_CLONES void vexp(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = expApprox(x[i]);
}

SD_CLONES void verf(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = erfApprox(x[i]);
}

SD_CLONES void vgelu(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + erfApprox(x[i] * 0.70710678118654752f));
}

// GELU's tanh form as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3):
// 0.5 x (1 + tanh(u)) is the same function, and exp vectorizes.
SD_CLONES void vgeluTanh(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i], u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    y[i] = v / (1.0f + expApprox(-2.0f * u));
  }
}

SD_CLONES void vgeluGrad(const float *dy, const float *x, float *dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float d = 0.5f * (1.0f + erfApprox(v * 0.70710678118654752f)) + v * 0.3989422804014327f * expApprox(-0.5f * v * v);
    dx[i] = dy[i] * d;
  }
}

SD_CLONES void vsigmoid(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + expApprox(-x[i]));
}

SD_CLONES void vswiglu(const float *x, const float *up, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + expApprox(-x[i]));
    y[i] = x[i] * s * up[i];
  }
}

// silu'(x) = s + x * s * (1 - s), s = sigmoid(x).
SD_CLONES void vswigluGrad(const float *dy, const float *x, const float *up, float *dx, float *dup, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i], s = 1.0f / (1.0f + expApprox(-v)), g = dy[i];
    dup[i] = g * v * s;
    dx[i] = g * up[i] * (s + v * s * (1.0f - s));
  }
}

SD_CLONES float vexpShiftSum(const float *x, float *y, int64_t n, float shift) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    y[i] = expApprox(x[i] - shift);
    sum += y[i];
  }
  return sum;
}

SD_CLONES float vmax(const float *x, int64_t n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

void vsoftmaxRow(const float *x, float *y, int64_t n, float *lse) {
  const float rowMax = vmax(x, n);
  float mx = std::isfinite(rowMax) ? rowMax : 0; // all -inf rows: exp gives 0s, sum 0, as libm would
  const float sum = vexpShiftSum(x, y, n, mx);
  if (lse) *lse = std::isfinite(rowMax) ? rowMax + std::log(sum) : rowMax; // -inf: a row that sees no key
  float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) y[j] *= inv;
}

SD_CLONES void vlayerNormRow(const float *x, const float *g, const float *b, float *y, int64_t n, float eps,
                             float &meanOut, float &rstdOut) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  float mean = sum / float(n), var = 0;
#pragma omp simd reduction(+ : var)
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  float rstd = 1.0f / std::sqrt(var / float(n) + eps);
  if (b) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * rstd * g[i] + b[i];
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * rstd * g[i];
  }
  meanOut = mean;
  rstdOut = rstd;
}

SD_CLONES float vrmsNormRow(const float *x, const float *g, float *y, int64_t n, float eps) {
  float ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  float rstd = 1.0f / std::sqrt(ss / float(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * rstd * g[i];
  return rstd;
}

SD_CLONES void vrmsNormGradRow(const float *x, const float *dy, const float *g, float *dx, double *dscale, int64_t n,
                               float eps) {
  float ss = 0, mgx = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  float rstd = 1.0f / std::sqrt(ss / float(n) + eps);
#pragma omp simd reduction(+ : mgx)
  for (int64_t i = 0; i < n; ++i) mgx += dy[i] * g[i] * (x[i] * rstd);
  mgx /= float(n);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float xhat = x[i] * rstd;
    dx[i] = rstd * (dy[i] * g[i] - xhat * mgx);
    if (dscale) dscale[i] += double(dy[i] * xhat);
  }
}

} // namespace sd::cpu
