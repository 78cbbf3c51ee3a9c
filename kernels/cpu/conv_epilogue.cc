// The f32 convolution epilogue (conv_epilogue.h), one build per instruction
// set picked by cpuid on first call (GCC target_clones).
#include "conv_epilogue.h"

namespace sd::cpu {
namespace {

using Epilogue = ConvEpilogue<float>;

// One loop per activation, so each vectorizes without a switch inside.
// NaN passes through max/min in this operand order, as in the plain ops.
// A zero bias is not added (-0 + 0 would turn -0 into +0).
template <int Kind, bool Bias, bool Residual>
[[gnu::always_inline]] inline void loop(float alpha, float beta, float bias, const float *r, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float v = y[i];
    if constexpr (Bias) v += bias;
    if constexpr (Residual) v += r[i];
    // Ternaries in std::max/std::min's operand order (GCC 12 left the
    // std::max(0, std::min(1, t)) form of HardSwish scalar).
    if constexpr (Kind == Epilogue::Relu) v = v < 0.0f ? 0.0f : v;
    if constexpr (Kind == Epilogue::Clip) {
      v = v < alpha ? alpha : v;
      v = beta < v ? beta : v;
    }
    if constexpr (Kind == Epilogue::HardSwish) {
      float t = v / 6.0f + 0.5f;
      t = 1.0f < t ? 1.0f : t;
      t = 0.0f < t ? t : 0.0f;
      v = v * t;
    }
    // math::hardSigmoid's order, max(min(t, 1), 0): a NaN stays NaN.
    if constexpr (Kind == Epilogue::HardSigmoid) {
      float t = alpha * v + beta;
      t = 1.0f < t ? 1.0f : t;
      v = t < 0.0f ? 0.0f : t;
    }
    if constexpr (Kind == Epilogue::LeakyRelu) v = v >= 0.0f ? v : alpha * v;
    y[i] = v;
  }
}

template <int Kind>
[[gnu::always_inline]] inline void run(float alpha, float beta, float bias, const float *r, float *y, int64_t n) {
  if (bias != 0.0f) {
    if (r) loop<Kind, true, true>(alpha, beta, bias, r, y, n);
    else loop<Kind, true, false>(alpha, beta, bias, r, y, n);
  } else {
    if (r) loop<Kind, false, true>(alpha, beta, bias, r, y, n);
    else loop<Kind, false, false>(alpha, beta, bias, r, y, n);
  }
}

} // namespace

__attribute__((target_clones("avx512f", "avx2", "default"))) void
applyConvEpilogueF32(int kind, float alpha, float beta, float bias, const float *residual, float *y, int64_t n) {
  switch (kind) {
  case Epilogue::None: return run<Epilogue::None>(alpha, beta, bias, residual, y, n);
  case Epilogue::Relu: return run<Epilogue::Relu>(alpha, beta, bias, residual, y, n);
  case Epilogue::Clip: return run<Epilogue::Clip>(alpha, beta, bias, residual, y, n);
  case Epilogue::HardSwish: return run<Epilogue::HardSwish>(alpha, beta, bias, residual, y, n);
  case Epilogue::HardSigmoid: return run<Epilogue::HardSigmoid>(alpha, beta, bias, residual, y, n);
  case Epilogue::LeakyRelu: return run<Epilogue::LeakyRelu>(alpha, beta, bias, residual, y, n);
  }
}

} // namespace sd::cpu
