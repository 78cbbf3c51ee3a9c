// One hidden unit of an ONNX RNN/GRU/LSTM step: the gate activations (with
// their slopes) and the backward of each cell, written once for the CPU and
// CUDA Recurrence kernels. The CPU kernel's op-harness cases and its PyTorch
// comparisons therefore test the math the GPU runs.
#pragma once
#include "sd/ops/math/host_device.h"
#include <cmath>
#include <string>
#include <vector>

namespace sd::math {

enum class GateFn : int {
  Sigmoid, Tanh, Relu, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus
};

struct GateActivation {
  GateFn fn = GateFn::Tanh;
  float alpha = 0, beta = 0;

  SD_HD float operator()(float x) const {
    switch (fn) {
    case GateFn::Sigmoid: return 1.0f / (1.0f + std::exp(-x));
    case GateFn::Tanh: return std::tanh(x);
    case GateFn::Relu: return x > 0 ? x : 0.0f;
    case GateFn::Affine: return alpha * x + beta;
    case GateFn::LeakyRelu: return x >= 0 ? x : alpha * x;
    case GateFn::ThresholdedRelu: return x > alpha ? x : 0.0f;
    case GateFn::ScaledTanh: return alpha * std::tanh(beta * x);
    case GateFn::HardSigmoid: return std::fmax(0.0f, std::fmin(1.0f, alpha * x + beta));
    case GateFn::Elu: return x >= 0 ? x : alpha * (std::exp(x) - 1.0f);
    case GateFn::Softsign: return x / (1.0f + std::fabs(x));
    case GateFn::Softplus: return x > 20.0f ? x : std::log1p(std::exp(x));
    }
    return x;
  }
  // d/dx at the input x.
  SD_HD float slope(float x) const {
    switch (fn) {
    case GateFn::Sigmoid: { float s = (*this)(x); return s * (1.0f - s); }
    case GateFn::Tanh: { float t = std::tanh(x); return 1.0f - t * t; }
    case GateFn::Relu: return x > 0 ? 1.0f : 0.0f;
    case GateFn::Affine: return alpha;
    case GateFn::LeakyRelu: return x >= 0 ? 1.0f : alpha;
    case GateFn::ThresholdedRelu: return x > alpha ? 1.0f : 0.0f;
    case GateFn::ScaledTanh: { float t = std::tanh(beta * x); return alpha * beta * (1.0f - t * t); }
    case GateFn::HardSigmoid: { float v = alpha * x + beta; return v > 0 && v < 1 ? alpha : 0.0f; }
    case GateFn::Elu: return x >= 0 ? 1.0f : alpha * std::exp(x);
    case GateFn::Softsign: { float d = 1.0f + std::fabs(x); return 1.0f / (d * d); }
    case GateFn::Softplus: return 1.0f / (1.0f + std::exp(-x));
    }
    return 1.0f;
  }
};

inline bool parseGateFn(const std::string &name, GateFn &fn) {
  static const std::pair<const char *, GateFn> names[] = {
      {"Sigmoid", GateFn::Sigmoid},         {"Tanh", GateFn::Tanh},
      {"Relu", GateFn::Relu},               {"Affine", GateFn::Affine},
      {"LeakyRelu", GateFn::LeakyRelu},     {"ThresholdedRelu", GateFn::ThresholdedRelu},
      {"ScaledTanh", GateFn::ScaledTanh},   {"HardSigmoid", GateFn::HardSigmoid},
      {"Elu", GateFn::Elu},                 {"Softsign", GateFn::Softsign},
      {"Softplus", GateFn::Softplus}};
  for (auto &[n, f] : names)
    if (name == n) return fn = f, true;
  return false;
}

// The cell's activations from the op's attributes: `names` comma-separated,
// each with its activation_alpha and activation_beta entry. False with `bad`
// naming the first unknown function.
inline bool gateActivationsOf(const std::string &names, const std::vector<double> &alpha,
                              const std::vector<double> &beta, std::vector<GateActivation> &out, std::string &bad) {
  out.clear();
  size_t at = 0;
  for (size_t k = 0; k < alpha.size(); ++k) {
    size_t end = names.find(',', at);
    GateActivation a{GateFn::Tanh, float(alpha[k]), float(k < beta.size() ? beta[k] : 0.0)};
    std::string name = names.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (!parseGateFn(name, a.fn)) return bad = name, false;
    out.push_back(a);
    at = end == std::string::npos ? names.size() : end + 1;
  }
  return true;
}

// A gate's input clipped to [-clip, clip] (clip > 0), as ONNX Runtime clips.
SD_HD float clipGate(float x, float clip) { return clip > 0 ? std::fmin(clip, std::fmax(-clip, x)) : x; }
// Its slope with the clip: 0 where the input was clipped.
SD_HD float clippedSlope(float slope, float x, float clip) { return clip > 0 && std::fabs(x) > clip ? 0.0f : slope; }

// An LSTM unit's backward. In: the gradient reaching the new hidden state
// (dht) and the new cell state (dc), each gate's activated value and slope
// (i, o, f, the candidate cc, and h(c) at the new cell state), the previous
// and new cell states, and the peepholes (p*, when `peep`). Out: the gates'
// pre-activation gradients (ONNX order i, o, f, c), the previous cell
// state's gradient, and the peepholes' shares.
struct LstmUnitGrad {
  float di = 0, dout = 0, df = 0, dcand = 0, dcPrev = 0;
  float dpi = 0, dpo = 0, dpf = 0;
};
SD_HD LstmUnitGrad lstmUnitGrad(float dht, float dc, float i, float si, float o, float so, float f, float sf, float cc,
                                float scc, float hc, float shc, float cp, float cn, bool inputForget, bool peep,
                                float pi, float po, float pf) {
  LstmUnitGrad g;
  float dct = dc + dht * o * shc;
  g.dout = dht * hc * so;
  if (peep) dct += g.dout * po, g.dpo = g.dout * cn;
  float di = dct * cc, df = dct * cp;
  g.dcPrev = dct * f;
  if (inputForget) di -= df;
  else g.df = df * sf;
  g.di = di * si;
  g.dcand = dct * i * scc;
  if (peep) {
    g.dcPrev += g.di * pi + g.df * pf;
    g.dpi = g.di * cp, g.dpf = g.df * cp;
  }
  return g;
}

// A GRU unit's backward. In: dht, the gates' values and slopes (z, r, the
// candidate c), the previous hidden state hp and ex (the saved recurrent
// term of the candidate: (r*h)·Rhᵀ, or h·Rhᵀ + Rbh with linear_before_reset).
// Out: dz, dc (pre-activation), dr when linear_before_reset (else it needs
// dhh·Rh first), hp's direct share, and dhh: the gradient of the candidate's
// recurrent term's input (r*h, or h·Rhᵀ + Rbh).
struct GruUnitGrad {
  float dz = 0, dr = 0, dcand = 0, dhPrev = 0, dhh = 0;
};
SD_HD GruUnitGrad gruUnitGrad(float dht, float z, float sz, float r, float sr, float c, float sc, float hp, float ex,
                              bool linearBeforeReset) {
  GruUnitGrad g;
  float dhPre = dht * (1.0f - z) * sc;
  g.dz = dht * (hp - c) * sz;
  g.dcand = dhPre;
  g.dhPrev = dht * z;
  if (linearBeforeReset) {
    g.dr = dhPre * ex * sr;
    g.dhh = dhPre * r;
  } else {
    g.dhh = dhPre;
  }
  return g;
}

} // namespace sd::math
