// FusedConv's epilogue: y = activation(y + residual), applied to each piece
// of a convolution's output right after it is computed, while in cache.
#pragma once
#include "sd/ops/attrs.h"
#include "sd/ops/math/activations.h"
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace sd::cpu {

// The f32 epilogue, built per instruction set (conv_epilogue.cc): the rest of
// the library is baseline x86-64, where these loops ran at a third of the
// speed of the convolution they follow (MobileNet's expand and depthwise
// layers, perf).
void applyConvEpilogueF32(int kind, float alpha, float beta, float bias, const float *residual, float *y, int64_t n);

template <typename T> struct ConvEpilogue {
  enum Kind { None, Relu, Clip, HardSwish, HardSigmoid, LeakyRelu } kind = None;
  T alpha = 0, beta = 0;
  const T *residual = nullptr; // laid out like the output

  // Plain Conv has neither attribute and gets an inactive epilogue.
  static ConvEpilogue parse(const AttrMap &attrs, const T *residual) {
    ConvEpilogue e;
    e.residual = residual;
    std::string a = attrs.getString("activation", "");
    auto f = [&](const char *name, double def) { return T(attrs.getFloat(name, def)); };
    if (a == "Relu") e.kind = Relu;
    else if (a == "Clip") {
      e.kind = Clip;
      e.alpha = f("activation_alpha", double(std::numeric_limits<T>::lowest()));
      e.beta = f("activation_beta", double(std::numeric_limits<T>::max()));
    } else if (a == "HardSwish") e.kind = HardSwish;
    else if (a == "HardSigmoid") {
      e.kind = HardSigmoid;
      e.alpha = f("activation_alpha", 0.2);
      e.beta = f("activation_beta", 0.5);
    } else if (a == "LeakyRelu") {
      e.kind = LeakyRelu;
      e.alpha = f("activation_alpha", 0.01);
    }
    return e;
  }

  bool active() const { return kind != None || residual; }

  // Elements [offset, offset + n) of the output at y (= output + offset),
  // after adding `bias` to each (one output channel's run).
  void apply(T *y, int64_t offset, int64_t n, T bias = T(0)) const {
    if constexpr (std::is_same_v<T, float>) {
      applyConvEpilogueF32(kind, alpha, beta, bias, residual ? residual + offset : nullptr, y, n);
      return;
    }
    if (bias != T(0))
      for (int64_t i = 0; i < n; ++i) y[i] += bias;
    if (residual) {
      const T *r = residual + offset;
      for (int64_t i = 0; i < n; ++i) y[i] += r[i];
    }
    // NaN passes through max/min in this operand order, as in the plain ops.
    switch (kind) {
    case None: break;
    case Relu:
      for (int64_t i = 0; i < n; ++i) y[i] = std::max(y[i], T(0));
      break;
    case Clip:
      for (int64_t i = 0; i < n; ++i) y[i] = std::min(std::max(y[i], alpha), beta);
      break;
    // The activations' own math (shared with their ops and the CUDA epilogue):
    // a fused step gives the bits, NaN included, of the step it replaced.
    case HardSwish:
      for (int64_t i = 0; i < n; ++i) y[i] = math::hardSwish(y[i]);
      break;
    case HardSigmoid:
      for (int64_t i = 0; i < n; ++i) y[i] = math::hardSigmoid(y[i], alpha, beta);
      break;
    case LeakyRelu:
      for (int64_t i = 0; i < n; ++i) y[i] = math::leakyRelu(y[i], alpha);
      break;
    }
  }
};

} // namespace sd::cpu
