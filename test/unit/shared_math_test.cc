// The math the CPU and CUDA kernels share (sd/ops/math, counter_rng.h),
// checked on the CPU: against closed forms in long double, finite
// differences, and PyTorch's update rules written out step by step.
#include "sd/ops/counter_rng.h"
#include "sd/ops/math/activations.h"
#include "sd/ops/math/optimizer.h"
#include <cmath>
#include <gtest/gtest.h>
#include <limits>

namespace sd::math {
namespace {

const double kPoints[] = {-30.0, -8.0, -3.5, -1.0, -0.25, 0.0, 1e-7, 0.3, 1.0, 2.5, 7.0, 30.0};

TEST(SharedMath, SigmoidMatchesClosedFormAndNeverOverflows) {
  for (double x : kPoints) {
    long double ref = 1.0L / (1.0L + std::exp(-(long double)x));
    EXPECT_NEAR(sigmoid(x), double(ref), 1e-15) << x;
    EXPECT_NEAR(sigmoid(float(x)), float(ref), 1e-7f) << x;
  }
  EXPECT_EQ(sigmoid(-1000.0f), 0.0f);
  EXPECT_EQ(sigmoid(1000.0f), 1.0f);
  EXPECT_TRUE(std::isnan(sigmoid(std::numeric_limits<float>::quiet_NaN())));
}

TEST(SharedMath, ReluKeepsNaN) {
  EXPECT_EQ(relu(-2.0f), 0.0f);
  EXPECT_EQ(relu(3.0f), 3.0f);
  EXPECT_TRUE(std::isnan(relu(std::numeric_limits<float>::quiet_NaN())));
}

TEST(SharedMath, GeluFormsMatchTheirDefinitions) {
  for (double x : kPoints) {
    long double lx = x;
    long double erfRef = 0.5L * lx * (1.0L + std::erf(lx / std::sqrt(2.0L)));
    long double tanhRef =
        0.5L * lx * (1.0L + std::tanh(std::sqrt(2.0L / 3.14159265358979323846L) * (lx + 0.044715L * lx * lx * lx)));
    EXPECT_NEAR(geluErf(x), double(erfRef), 1e-14 * std::max(1.0, std::fabs(x))) << x;
    EXPECT_NEAR(geluTanh(x), double(tanhRef), 1e-14 * std::max(1.0, std::fabs(x))) << x;
  }
}

TEST(SharedMath, GeluGradientsMatchFiniteDifferences) {
  for (double x : kPoints) {
    double h = 1e-6;
    double fdErf = (geluErf(x + h) - geluErf(x - h)) / (2 * h);
    double fdTanh = (geluTanh(x + h) - geluTanh(x - h)) / (2 * h);
    EXPECT_NEAR(geluErfGrad(x), fdErf, 1e-8) << x;
    EXPECT_NEAR(geluTanhGrad(x), fdTanh, 1e-8) << x;
  }
}

TEST(SharedMath, SoftplusIsStableAtBothEnds) {
  for (double x : kPoints) EXPECT_NEAR(softplus(x), double(std::log1p(std::exp((long double)x))), 1e-14) << x;
  EXPECT_EQ(softplus(1000.0f), 1000.0f);
  EXPECT_EQ(softplus(-1000.0f), 0.0f);
}

// torch.optim.AdamW's single-tensor step, written out in double.
struct TorchAdamW {
  double lr, beta1, beta2, eps, wd;
  double p, m = 0, v = 0;
  int step = 0;
  void update(double g) {
    ++step;
    p *= 1 - lr * wd;
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    double bc1 = 1 - std::pow(beta1, step), bc2 = 1 - std::pow(beta2, step);
    p -= lr / bc1 * (m / (std::sqrt(v) / std::sqrt(bc2) + eps));
  }
};

TEST(SharedMath, AdamWFollowsTorchForManySteps) {
  TorchAdamW ref{1e-3, 0.9, 0.999, 1e-8, 0.01, 0.5};
  float p = 0.5f, m = 0, v = 0;
  for (int step = 1; step <= 200; ++step) {
    double g = std::sin(step * 0.37) * (step % 7 == 0 ? 10.0 : 0.1);
    ref.update(g);
    AdamWStep s = adamWStep(step, 1e-3, 0.01, 0.9, 0.999, 1e-8, 1.0);
    adamWElement(s, float(g), p, m, v);
    // f32 state against the f64 reference: relative 1e-5 over 200 steps.
    ASSERT_NEAR(p, ref.p, 1e-5 * std::max(1.0, std::fabs(ref.p))) << "step " << step;
    ASSERT_NEAR(m, ref.m, 1e-5 * std::max(1.0, std::fabs(ref.m))) << "step " << step;
    ASSERT_NEAR(v, ref.v, 1e-5 * std::max(1.0, std::fabs(ref.v))) << "step " << step;
  }
}

TEST(SharedMath, AdamWAppliesTheGradientScaleFirst) {
  // The scale (token normalization, clipping, loss unscaling) multiplies g
  // before the moments see it: scaling g by 4 and the scale by 1/4 is the same step.
  float p1 = 1, m1 = 0.1f, v1 = 0.2f, p2 = 1, m2 = 0.1f, v2 = 0.2f;
  adamWElement(adamWStep(3, 1e-2, 0.1, 0.9, 0.999, 1e-8, 1.0), 0.5f, p1, m1, v1);
  adamWElement(adamWStep(3, 1e-2, 0.1, 0.9, 0.999, 1e-8, 0.25), 2.0f, p2, m2, v2);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
}

TEST(SharedMath, SgdMomentumAndNesterovFollowTorch) {
  for (bool nesterov : {false, true}) {
    SgdStep s{0.1f, 0.01f, 1.0f, 0.9f, 0.0f, nesterov, true};
    float p = 1.0f, buf = 0.0f;
    double rp = 1.0, rbuf = 0.0;
    for (int step = 1; step <= 50; ++step) {
      double g = std::cos(step * 0.5);
      double d = g + 0.01 * rp;
      rbuf = step == 1 ? d : 0.9 * rbuf + d;
      rp -= 0.1 * (nesterov ? d + 0.9 * rbuf : rbuf);
      s.first = step == 1;
      sgdElement(s, float(g), p, buf);
      ASSERT_NEAR(p, rp, 1e-5) << "step " << step << (nesterov ? " nesterov" : "");
    }
  }
}

TEST(SharedMath, CounterRngIsAPureFunctionAndDropsTheRatio) {
  uint64_t key = counterRngKey(42, 7, 3);
  EXPECT_EQ(key, counterRngKey(42, 7, 3));
  EXPECT_NE(key, counterRngKey(42, 8, 3));
  EXPECT_NE(key, counterRngKey(42, 7, 4));
  uint32_t threshold = dropoutThreshold(0.25);
  int kept = 0, n = 200000;
  for (int i = 0; i < n; ++i) kept += dropoutKeeps(key, uint64_t(i), threshold);
  EXPECT_NEAR(double(kept) / n, 0.75, 0.005);
  EXPECT_EQ(dropoutThreshold(0.0), 0u);
}

} // namespace
} // namespace sd::math
