// Per-element AdamW and SGD updates, shared by the CPU and CUDA kernels.
// Semantics follow torch.optim.AdamW and SGD: decoupled weight decay, bias
// correction from the step counter, eps added after the corrected sqrt(v).
#pragma once
#include "sd/ops/math/host_device.h"
#include <cmath>

namespace sd::math {

// GroupedAdamW (sd-group-updates): its scalar operands (step, lr,
// weight_decay, grad_scale, skip) come first, then 4 tensors per updated
// tensor, at most kMaxGroupedTensors of them per step.
constexpr unsigned kGroupedAdamWScalars = 5;
constexpr unsigned kMaxGroupedTensors = 1024;

// What one AdamW step needs besides the tensors, derived once per step from
// the step counter and hyper-parameters (the bias corrections in double, as
// PyTorch does on the host).
struct AdamWStep {
  float stepSize;  // lr / (1 - beta1^step)
  float bc2Sqrt;   // sqrt(1 - beta2^step)
  float decay;     // 1 - lr * weight_decay
  float beta1, beta2, oneMinusBeta1, oneMinusBeta2;
  float eps;
  float gradScale; // applied to the gradient first (token normalization, clipping, unscaling)
};

SD_HD AdamWStep adamWStep(double step, double lr, double weightDecay, double beta1, double beta2, double eps,
                          double gradScale) {
  AdamWStep s;
  double bc1 = 1 - std::pow(beta1, step), bc2 = 1 - std::pow(beta2, step);
  s.stepSize = float(lr / bc1);
  s.bc2Sqrt = float(std::sqrt(bc2));
  s.decay = float(1.0 - lr * weightDecay);
  s.beta1 = float(beta1);
  s.beta2 = float(beta2);
  s.oneMinusBeta1 = float(1 - beta1);
  s.oneMinusBeta2 = float(1 - beta2);
  s.eps = float(eps);
  s.gradScale = float(gradScale);
  return s;
}

// Updates one element: param p, moments m and v, from gradient g.
SD_HD void adamWElement(const AdamWStep &s, float g, float &p, float &m, float &v) {
  g *= s.gradScale;
  float pd = p * s.decay;
  m = m * s.beta1 + g * s.oneMinusBeta1;
  v = v * s.beta2 + g * g * s.oneMinusBeta2;
  p = pd - s.stepSize * (m / (std::sqrt(v) / s.bc2Sqrt + s.eps));
}

struct SgdStep {
  float lr, weightDecay, gradScale, momentum, dampening;
  bool nesterov, first; // first: the momentum buffer starts as the gradient
};

// Updates one element: param p and momentum buffer buf, from gradient g.
SD_HD void sgdElement(const SgdStep &s, float g, float &p, float &buf) {
  float d = g * s.gradScale + s.weightDecay * p;
  float b = 0;
  if (s.momentum != 0) {
    b = s.first ? d : buf * s.momentum + d * (1 - s.dampening);
    d = s.nesterov ? d + s.momentum * b : b;
  }
  p = p - s.lr * d;
  buf = b;
}

// GradScale's factor: the gradients hold sums over `tokens` counted tokens,
// norm = ||grads|| / tokens from their sum of squares, and the factor is
// 1/tokens * min(1, maxNorm / (norm + 1e-6)) (no clipping when maxNorm <= 0),
// as clip_grad_norm_ after token normalization.
SD_HD double gradScaleFactor(double sumSquares, double tokens, double maxNorm, double &norm) {
  tokens = tokens > 1.0 ? tokens : 1.0;
  norm = std::sqrt(sumSquares) / tokens;
  double clip = maxNorm / (norm + 1e-6);
  double coef = maxNorm > 0 && clip < 1.0 ? clip : 1.0;
  return coef / tokens;
}

} // namespace sd::math
