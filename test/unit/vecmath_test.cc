// The vectorized float math of the CPU kernels (kernels/cpu/vecmath.h)
// against libm in double, over dense grids and the special values: the
// accuracy each function promises, and NaN/inf/-0 handled as libm does.
#include "vecmath.h"
#include <gtest/gtest.h>
#include <cmath>
#include <functional>
#include <vector>

namespace {

using Vec = void (*)(const float *, float *, int64_t);

// Largest error in units of the reference's last place over `xs`.
double worstUlp(Vec f, const std::function<double(double)> &ref, const std::vector<float> &xs, float &at) {
  std::vector<float> y(xs.size());
  f(xs.data(), y.data(), int64_t(xs.size()));
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float want = float(ref(double(xs[i])));
    if (want == 0 || !std::isfinite(want)) continue;
    const double ulp = std::fabs(double(std::nextafter(want, INFINITY)) - double(want));
    const double e = std::fabs(double(y[i]) - ref(double(xs[i]))) / ulp;
    if (e > worst) worst = e, at = xs[i];
  }
  return worst;
}

std::vector<float> grid(float lo, float hi, float step) {
  std::vector<float> v;
  for (float x = lo; x <= hi; x += step) v.push_back(x);
  for (float x = 1e-30f; x < 1e-2f; x *= 1.05f) v.push_back(x), v.push_back(-x);
  return v;
}

float one(Vec f, float x) {
  float y = 0;
  f(&x, &y, 1);
  return y;
}

TEST(VecMath, TanhWithinTwoUlp) {
  float at = 0;
  double e = worstUlp(sd::cpu::vtanh, [](double x) { return std::tanh(x); }, grid(-12, 12, 1e-4f), at);
  EXPECT_LE(e, 2.0) << "at x = " << at;
  EXPECT_TRUE(std::isnan(one(sd::cpu::vtanh, NAN)));
  EXPECT_EQ(one(sd::cpu::vtanh, INFINITY), 1.0f);
  EXPECT_EQ(one(sd::cpu::vtanh, -INFINITY), -1.0f);
  EXPECT_TRUE(std::signbit(one(sd::cpu::vtanh, -0.0f)));
  EXPECT_EQ(one(sd::cpu::vtanh, 1e-30f), 1e-30f);
}

TEST(VecMath, ExpAndSigmoidWithinTheirBounds) {
  float at = 0;
  double e = worstUlp(sd::cpu::vexp, [](double x) { return std::exp(x); }, grid(-87, 88, 1e-3f), at);
  EXPECT_LE(e, 2.0) << "exp at x = " << at;
  e = worstUlp(sd::cpu::vsigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, grid(-30, 30, 1e-3f), at);
  EXPECT_LE(e, 4.0) << "sigmoid at x = " << at;
  EXPECT_TRUE(std::isnan(one(sd::cpu::vexp, NAN)));
  EXPECT_EQ(one(sd::cpu::vexp, -INFINITY), 0.0f);
}

} // namespace
