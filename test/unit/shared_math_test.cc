// The math the CPU and CUDA kernels share (sd/ops/math, counter_rng.h),
// checked on the CPU: against closed forms in long double, finite
// differences, and PyTorch's update rules written out step by step.
#include "sd/ops/counter_rng.h"
#include "sd/ops/math/activations.h"
#include "sd/ops/math/box_overlap.h"
#include "sd/ops/math/online_softmax.h"
#include "sd/ops/math/optimizer.h"
#include "sd/ops/math/recurrent_cell.h"
#include <algorithm>
#include <functional>
#include <numeric>
#include <cmath>
#include <gtest/gtest.h>
#include <limits>
#include <random>
#include <vector>

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

// seeded_random's draws: uniform in [0, 1) from the bits dropout's mask reads
// (dropout with ratio r keeps where u >= r), and
// standard normal (mean 0, variance 1, finite even for the extreme bits).
TEST(SharedMath, CounterUniformAndNormalHaveTheirMoments) {
  uint64_t key = counterRngKey(5, 2, 9);
  const int n = 200000;
  double sum = 0, normalSum = 0, normalSquares = 0;
  int agree = 0;
  for (int i = 0; i < n; ++i) {
    float u = counterUniform(key, uint64_t(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    agree += (u >= 0.25f) == dropoutKeeps(key, uint64_t(i), dropoutThreshold(0.25));
    float z = counterNormal(key, uint64_t(i));
    ASSERT_TRUE(std::isfinite(z));
    normalSum += z;
    normalSquares += double(z) * z;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.003);
  EXPECT_EQ(agree, n);
  EXPECT_NEAR(normalSum / n, 0.0, 0.01);
  EXPECT_NEAR(normalSquares / n, 1.0, 0.01);
  EXPECT_EQ(counterNormal(key, 17), counterNormal(key, 17));
}


// The RNN gate activations (the CUDA Recurrence kernel computes every gate
// with them; the CPU's vectorizes Sigmoid and Tanh itself): their slopes
// against central differences, away from each function's kinks.
TEST(SharedMath, GateActivationSlopesMatchFiniteDifferences) {
  const GateActivation fns[] = {
      {GateFn::Sigmoid, 0, 0},       {GateFn::Tanh, 0, 0},          {GateFn::Relu, 0, 0},
      {GateFn::Affine, 0.5f, 0.1f},  {GateFn::LeakyRelu, 0.1f, 0},  {GateFn::ThresholdedRelu, 0.7f, 0},
      {GateFn::ScaledTanh, 0.7f, 1.3f}, {GateFn::HardSigmoid, 0.2f, 0.45f}, {GateFn::Elu, 0.9f, 0},
      {GateFn::Softsign, 0, 0},      {GateFn::Softplus, 0, 0}};
  for (const GateActivation &f : fns)
    for (float x : {-3.5f, -1.0f, -0.25f, 0.3f, 1.0f, 2.5f}) {
      const float h = 1e-2f, numeric = (f(x + h) - f(x - h)) / (2 * h);
      EXPECT_NEAR(f.slope(x), numeric, 2e-3f * std::max(1.0f, std::fabs(numeric))) << int(f.fn) << " at " << x;
    }
  GateFn parsed;
  EXPECT_TRUE(parseGateFn("HardSigmoid", parsed));
  EXPECT_EQ(parsed, GateFn::HardSigmoid);
  EXPECT_FALSE(parseGateFn("Swish", parsed));
  EXPECT_EQ(clipGate(5.0f, 2.0f), 2.0f);
  EXPECT_EQ(clipGate(5.0f, 0.0f), 5.0f); // clip 0: none
  EXPECT_EQ(clippedSlope(0.3f, -5.0f, 2.0f), 0.0f);
}

// d(loss)/d(each argument) of `f` at `at`, by central differences in double.
std::vector<double> numericGradient(const std::function<double(const std::vector<double> &)> &f, std::vector<double> at) {
  std::vector<double> g;
  for (size_t k = 0; k < at.size(); ++k) {
    const double h = 1e-6, keep = at[k];
    at[k] = keep + h;
    const double up = f(at);
    at[k] = keep - h;
    const double down = f(at);
    at[k] = keep;
    g.push_back((up - down) / (2 * h));
  }
  return g;
}

double sig(double x) { return 1 / (1 + std::exp(-x)); }

// An LSTM unit's backward against the derivatives of its forward (ONNX's
// equations with the default activations): the loss wh·h_t + wc·c_t, so
// dht = wh and the gradient reaching the new cell state is wc.
TEST(SharedMath, LstmUnitGradientMatchesItsForward) {
  const double wh = 0.7, wc = -0.4;
  for (bool peep : {false, true})
    for (bool inputForget : {false, true}) {
      // ai, ao, af, ac (pre-activations before peepholes), cp, pi, po, pf
      const std::vector<double> at = {0.3, -0.6, 0.9, -0.2, 0.8, peep ? 0.5 : 0, peep ? -0.3 : 0, peep ? 0.25 : 0};
      auto forward = [&](const std::vector<double> &v) {
        const double cp = v[4], i = sig(v[0] + v[5] * cp);
        const double f = inputForget ? 1 - i : sig(v[2] + v[7] * cp), cn = f * cp + i * std::tanh(v[3]);
        const double o = sig(v[1] + v[6] * cn);
        return wh * o * std::tanh(cn) + wc * cn;
      };
      const double cp = at[4], ai = at[0] + at[5] * cp, af = at[2] + at[7] * cp, i = sig(ai);
      const double f = inputForget ? 1 - i : sig(af), cc = std::tanh(at[3]), cn = f * cp + i * cc;
      const double ao = at[1] + at[6] * cn, o = sig(ao), hc = std::tanh(cn);
      const LstmUnitGrad u = lstmUnitGrad(float(wh), float(wc), float(i), float(i * (1 - i)), float(o),
                                          float(o * (1 - o)), float(f), float(sig(af) * (1 - sig(af))), float(cc),
                                          float(1 - cc * cc), float(hc), float(1 - hc * hc), float(cp), float(cn),
                                          inputForget, peep, float(at[5]), float(at[6]), float(at[7]));
      const std::vector<double> want = numericGradient(forward, at);
      const float got[] = {u.di, u.dout, inputForget ? 0.0f : u.df, u.dcand, u.dcPrev, u.dpi, u.dpo, u.dpf};
      for (size_t k = 0; k < want.size(); ++k) {
        if (inputForget && k == 2) continue; // f's own input is unused
        if (!peep && k >= 5) continue;
        EXPECT_NEAR(got[k], want[k], 1e-5) << "peep " << peep << " input_forget " << inputForget << " argument " << k;
      }
    }
}

// A GRU unit's backward against its forward: h_t = (1 - z) c + z h_prev with
// c = tanh(xc + r·ex) (linear_before_reset: ex is h·Rhᵀ + Rbh) or
// c = tanh(xc + hh) (hh = (r·h)·Rhᵀ, whose r-gradient needs the GEMM).
TEST(SharedMath, GruUnitGradientMatchesItsForward) {
  const double wh = 0.9;
  for (bool lbr : {false, true}) {
    const std::vector<double> at = {0.4, -0.7, 0.2, 0.6, -0.5}; // az, ar, xc, ex (or hh), hp
    auto forward = [&](const std::vector<double> &v) {
      const double z = sig(v[0]), r = sig(v[1]), c = std::tanh(v[2] + (lbr ? r * v[3] : v[3]));
      return wh * ((1 - z) * c + z * v[4]);
    };
    const double z = sig(at[0]), r = sig(at[1]), c = std::tanh(at[2] + (lbr ? r * at[3] : at[3]));
    const GruUnitGrad u = gruUnitGrad(float(wh), float(z), float(z * (1 - z)), float(r), float(r * (1 - r)), float(c),
                                      float(1 - c * c), float(at[4]), float(at[3]), lbr);
    const std::vector<double> want = numericGradient(forward, at);
    EXPECT_NEAR(u.dz, want[0], 1e-5) << lbr;
    if (lbr) EXPECT_NEAR(u.dr, want[1], 1e-5);
    EXPECT_NEAR(u.dcand, want[2], 1e-5) << lbr;
    EXPECT_NEAR(u.dhh, want[3], 1e-5) << lbr;
    EXPECT_NEAR(u.dhPrev, want[4], 1e-5) << lbr;
  }
}

// The CUDA loss kernels' order: `threads` threads take every threads-th score
// from their own index, then adjacent partials merge pairwise (the shuffle
// tree within 32-thread warps, then over the warps' partials).
RowStats<float> stridedStats(const std::vector<float> &row, int threads) {
  std::vector<RowStats<float>> part(static_cast<size_t>(threads));
  for (size_t k = 0; k < row.size(); ++k) part[k % size_t(threads)].add(row[k]);
  auto tree = [](std::vector<RowStats<float>> p) {
    for (size_t width = p.size(); width > 1; width /= 2)
      for (size_t i = 0; i < width / 2; ++i) p[i] = p[i].merged(p[i + width / 2]);
    return p[0];
  };
  std::vector<RowStats<float>> warps;
  for (int w = 0; w < threads; w += 32) warps.push_back(tree({part.begin() + w, part.begin() + w + 32}));
  while (warps.size() < 32) warps.push_back(RowStats<float>{});
  return tree(warps);
}

// max + log(sum(exp(x - max))) in double, max taken first (the CPU kernels' order).
double twoPassShift(const std::vector<float> &row) {
  double mx = -INFINITY;
  for (float v : row) mx = std::max(mx, double(v));
  double s = 0;
  for (float v : row) s += std::exp(double(v) - mx);
  return mx + std::log(s);
}

TEST(SharedMath, OnlineSoftmaxStatisticsMatchTwoPasses) {
  std::mt19937 gen(7);
  for (int cls : {1, 3, 10, 255, 1000, 32000})
    for (float spread : {1.0f, 30.0f, 400.0f})
      for (int threads : {32, 256}) {
        std::normal_distribution<float> d(0.0f, spread);
        std::vector<float> row(static_cast<size_t>(cls));
        for (float &v : row) v = d(gen);
        RowStats<float> s = stridedStats(row, threads);
        double ref = twoPassShift(row);
        EXPECT_NEAR(s.shift(), ref, 2e-6 * std::max(1.0, std::abs(ref))) << cls << " classes, spread " << spread;
        double mx = -INFINITY, sum = 0;
        for (float v : row) mx = std::max(mx, double(v));
        for (float v : row) sum += std::exp(double(v) - mx);
        EXPECT_EQ(s.max, float(mx));
        EXPECT_NEAR(s.inverseSum(), 1.0 / sum, 2e-6 / sum);
      }
}

TEST(SharedMath, OnlineSoftmaxStatisticsRescaleAnIncreasingRow) {
  // Every score a new max: each one rescales the sum; no overflow at 1000.
  std::vector<float> row;
  for (int k = 0; k < 2000; ++k) row.push_back(float(k) * 0.5f);
  RowStats<float> s;
  for (float v : row) s.add(v);
  EXPECT_NEAR(s.shift(), twoPassShift(row), 1e-4);
  EXPECT_NEAR(stridedStats(row, 256).shift(), twoPassShift(row), 1e-4);
}

TEST(SharedMath, OnlineSoftmaxStatisticsAreNaNWhereTwoPassesAre) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  auto statsOf = [](std::vector<float> row) { return stridedStats(row, 32); };
  // NaN anywhere, a +inf score (exp(inf - inf)), a row of -inf only (exp(-inf + inf)).
  for (std::vector<float> row : {std::vector<float>{1, nan, 2}, {nan}, {3, inf, 1, 2}, {inf, inf}, {-inf, -inf, -inf}}) {
    EXPECT_TRUE(std::isnan(statsOf(row).shift())) << row.size();
    EXPECT_TRUE(std::isnan(statsOf(row).inverseSum())) << row.size();
  }
  // -inf next to finite scores contributes nothing, wherever it falls.
  std::vector<float> masked(100, -inf);
  masked[70] = 2.0f;
  masked[3] = 1.0f;
  EXPECT_NEAR(statsOf(masked).shift(), twoPassShift({1.0f, 2.0f}), 1e-6);
  EXPECT_EQ(statsOf(masked).max, 2.0f);
  // An empty piece (a thread past the row's end) changes nothing.
  RowStats<float> one;
  one.add(5.0f);
  EXPECT_EQ(one.merged(RowStats<float>{}).sum, 1.0f);
  EXPECT_EQ(RowStats<float>{}.merged(one).max, 5.0f);
}

} // namespace
} // namespace sd::math

// The CUDA NonMaxSuppression walks candidates by descending nmsWalkKey: the
// CPU's stable sort by descending score (ties: lower box first), signs, zeros
// and infinities included.
TEST(SharedMath, NmsWalkKeysOrderCandidatesAsTheCpusStableSort) {
  std::vector<float> scores = {0.5f, -0.0f, 0.0f, -1.5f, 0.5f, std::numeric_limits<float>::infinity(), 1e-30f, -1e-30f,
                               -std::numeric_limits<float>::infinity(), 3.0f, -1.5f, 0.25f};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int i = 0; i < 200; ++i) scores.push_back(i % 5 ? u(rng) : scores[size_t(i) % 12]);
  std::vector<int64_t> cpu(scores.size()), gpu(scores.size());
  std::iota(cpu.begin(), cpu.end(), 0);
  std::stable_sort(cpu.begin(), cpu.end(), [&](int64_t a, int64_t b) { return scores[size_t(a)] > scores[size_t(b)]; });
  std::iota(gpu.begin(), gpu.end(), 0);
  std::sort(gpu.begin(), gpu.end(), [&](int64_t a, int64_t b) {
    return sd::math::nmsWalkKey(scores[size_t(a)], a) > sd::math::nmsWalkKey(scores[size_t(b)], b);
  });
  EXPECT_EQ(gpu, cpu);
  for (size_t i = 0; i < scores.size(); ++i) {
    EXPECT_GT(sd::math::nmsWalkKey(scores[i], int64_t(i)), 0u);
    EXPECT_EQ(sd::math::nmsWalkBox(sd::math::nmsWalkKey(scores[i], int64_t(i))), int64_t(i));
  }
}
