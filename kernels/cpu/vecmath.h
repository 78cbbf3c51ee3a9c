// Vectorized float32 transcendental loops (exp, erf, sigmoid, tanh, ...), compiled for
// AVX-512, AVX2 and baseline x86-64 with runtime dispatch. Accuracy: exp
// within 2 ulp, erf within 2e-7 absolute.
#pragma once
#include <cstdint>

namespace sd::cpu {
void vexp(const float *x, float *y, int64_t n);
void verf(const float *x, float *y, int64_t n);
void vsigmoid(const float *x, float *y, int64_t n);
// tanh within 2 ulp (NaN in, NaN out; +-inf to +-1, -0 to -0).
void vtanh(const float *x, float *y, int64_t n);
// Exact (erf) GELU: 0.5 * x * (1 + erf(x / sqrt(2))).
void vgelu(const float *x, float *y, int64_t n);
void vgeluTanh(const float *x, float *y, int64_t n);
// dx = dy * GELU'(x), exact form: Phi(x) + x * phi(x).
void vgeluGrad(const float *dy, const float *x, float *dx, int64_t n);
// SwiGLU: y = x * sigmoid(x) * up; its gradient dx = dy * up * silu'(x), dup = dy * silu(x).
void vswiglu(const float *x, const float *up, float *y, int64_t n);
void vswigluGrad(const float *dy, const float *x, const float *up, float *dx, float *dup, int64_t n);
// y = exp(x - shift); returns the sum of y (softmax rows).
float vexpShiftSum(const float *x, float *y, int64_t n, float shift);
float vmax(const float *x, int64_t n);
// y = softmax(x) over one row (y may be x). An all -inf row gives 0/0 = NaN,
// as the unvectorized Softmax does.
// With `lse`, the row's natural-log log-sum-exp there too (its max + log of the sum).
void vsoftmaxRow(const float *x, float *y, int64_t n, float *lse = nullptr);
// y = (x - mean) * rstd * g + b over one row; returns mean and rstd.
void vlayerNormRow(const float *x, const float *g, const float *b, float *y, int64_t n, float eps, float &mean,
                   float &rstd);
// y = x * rstd * g over one row, rstd = 1 / sqrt(mean(x^2) + eps); returns rstd.
float vrmsNormRow(const float *x, const float *g, float *y, int64_t n, float eps);
// RMSNorm's backward over one row: dx = rstd * (dy * g - xhat * mean(dy * g * xhat)),
// xhat = x * rstd; adds dy * xhat to dscale (one block's partial sums, f64).
void vrmsNormGradRow(const float *x, const float *dy, const float *g, float *dx, double *dscale, int64_t n,
                     float eps);
} // namespace sd::cpu
