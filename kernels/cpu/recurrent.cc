// CPU kernels of Recurrence and RecurrenceGrad: one direction of an ONNX
// RNN/GRU/LSTM after its input projection. Each step is one GEMM of the batch's
// hidden states with Rᵀ (two for a GRU's candidate) and the gate arithmetic;
// the backward walks the steps in reverse with the same GEMMs transposed and
// accumulates dR over the whole sequence. Clip applies to the gates' inputs
// (not to the cell output's activation), as in ONNX Runtime.
#include "cpu_util.h"
#include "gemm.h"
#include "sgemm.h"
#include "vecmath.h"
#include "sd/ops/math/recurrent_cell.h"
#include "sd/ops/recurrent_layout.h"
#include <cmath>
#include <cstring>
#include <vector>

namespace sd::cpu {
namespace {

using namespace recurrent;

using Activation = math::GateActivation;
using math::GateFn;

// Attributes and sizes shared by both directions of the computation.
struct Setup {
  Cell cell = Cell::Unknown;
  int64_t seq = 0, batch = 0, hidden = 0, gh = 0, width = 0;
  bool reverse = false, inputForget = false, linearBeforeReset = false;
  float clip = 0;
  std::vector<Activation> fns;
  std::vector<int64_t> lens; // empty: every row runs the whole sequence

  bool live(int64_t t, int64_t b) const { return lens.empty() || t < lens[size_t(b)]; }
  int64_t timeAt(int64_t k) const { return reverse ? seq - 1 - k : k; }
};

// y = f(x) over n values, and when `slope` is given f'(x) too, with the clip
// on the input when `clip` > 0. Sigmoid and Tanh (most gates) use the
// vectorized sigmoid: tanh(x) = 2 sigmoid(2x) - 1.
void activate(const Activation &f, const float *x, float *y, float *slope, int64_t n, float clip) {
  float *in = y;
  if (clip > 0) {
    for (int64_t j = 0; j < n; ++j) y[j] = std::fmin(clip, std::fmax(-clip, x[j]));
  } else if (y != x) {
    std::memcpy(y, x, size_t(n) * sizeof(float));
  }
  if (f.fn == GateFn::Sigmoid || f.fn == GateFn::Tanh) {
    bool tanh = f.fn == GateFn::Tanh;
    if (tanh)
      for (int64_t j = 0; j < n; ++j) in[j] *= 2.0f;
    vsigmoid(in, y, n);
    for (int64_t j = 0; j < n; ++j) {
      float v = tanh ? 2.0f * y[j] - 1.0f : y[j];
      y[j] = v;
      if (slope) slope[j] = tanh ? 1.0f - v * v : v * (1.0f - v);
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      float v = in[j];
      y[j] = f(v);
      if (slope) slope[j] = f.slope(v);
    }
  }
  if (slope && clip > 0)
    for (int64_t j = 0; j < n; ++j)
      if (std::fabs(x[j]) > clip) slope[j] = 0.0f;
}

// R packed once per call for the per-step products h·Rᵀ (forward) and dg·R (backward).
PackedB packRows(const float *r, int64_t rows, int64_t h, bool transposed) {
  return transposed ? packB(true, h, rows, r, h) : packB(false, rows, h, r, h);
}

void mmPacked(const KernelContext &c, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
              const PackedB &b, float beta, float *out, int64_t ldc) {
  if (m == 0 || n == 0 || k == 0) return;
  sgemm(c.pool, false, false, m, n, k, 1.0f, a, lda, nullptr, 0, beta, out, ldc, &b);
}

Status setup(const KernelContext &c, int64_t seq, int64_t batch, size_t lensInput, Setup &s) {
  s.cell = cellOf(c.attrs.getString("cell", ""));
  s.seq = seq, s.batch = batch;
  s.reverse = c.attrs.getInt("reverse", 0) != 0;
  s.inputForget = c.attrs.getInt("input_forget", 0) != 0;
  s.linearBeforeReset = c.attrs.getInt("linear_before_reset", 0) != 0;
  s.clip = float(c.attrs.getFloat("clip", 0.0));
  std::string bad;
  if (!math::gateActivationsOf(c.attrs.getString("activations", ""), c.attrs.getFloats("activation_alpha"),
                               c.attrs.getFloats("activation_beta"), s.fns, bad))
    return sdError("Recurrence: unknown activation '", bad, "'");
  if (c.hasInput(lensInput) && c.inputs[lensInput].data) {
    if (!readIntegers(c.inputs[lensInput], s.lens)) return sdError("Recurrence: sequence_lens must be integers");
    for (int64_t v : s.lens)
      if (v < 0 || v > seq) return sdError("Recurrence: sequence_lens holds ", v, ", outside [0, ", seq, "]");
  }
  return Status::ok();
}

void mm(const KernelContext &c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
        const float *b, int64_t ldb, float beta, float *out, int64_t ldc) {
  sgemmOnPool(c.pool, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, out, ldc);
}

const float *optional(const KernelContext &c, size_t i) {
  return c.hasInput(i) && c.inputs[i].data ? c.inputs[i].as<float>() : nullptr;
}

Status RecurrenceKernel(const KernelContext &c) {
  const TensorView &xwv = c.inputs[0];
  Setup s;
  SD_RETURN_IF_ERROR(setup(c, xwv.dims[0], xwv.dims[1], 6, s));
  const int64_t S = s.seq, B = s.batch, H = c.inputs[1].dims[1], G = gates(s.cell), GH = G * H;
  const int64_t K = savedWidth(s.cell, H);
  const float *xw = xwv.as<float>(), *r = c.inputs[1].as<float>();
  const float *h0 = optional(c, 2), *c0 = optional(c, 3), *peep = optional(c, 4), *rbh = optional(c, 5);
  float *y = c.outputs[0].as<float>(), *yh = c.outputs[1].as<float>(), *yc = c.outputs[2].as<float>();
  float *saved = c.outputs[3].as<float>();
  size_t bh = size_t(B * H), hs = size_t(H);
  std::vector<float> h(bh, 0.0f), cell(bh, 0.0f), rh(bh), v0(hs), v1(hs), v2(hs), hn(hs);
  if (h0) std::copy(h0, h0 + B * H, h.begin());
  if (c0 && s.cell == Cell::LSTM) std::copy(c0, c0 + B * H, cell.begin());
  // A GRU's h·Rᵀ covers the z and r rows; its candidate rows get their own product.
  int64_t recurrentRows = s.cell == Cell::GRU ? 2 * H : GH;
  PackedB rT = packRows(r, recurrentRows, H, true);
  PackedB rhT = s.cell == Cell::GRU ? packRows(r + 2 * H * H, H, H, true) : PackedB{};
  for (int64_t k = 0; k < S; ++k) {
    int64_t t = s.timeAt(k);
    float *st = saved + t * B * K;
    for (int64_t b = 0; b < B; ++b) {
      std::memcpy(st + b * K, xw + (t * B + b) * GH, size_t(GH) * sizeof(float));
      std::memcpy(st + b * K + GH, h.data() + b * H, size_t(H) * sizeof(float));
    }
    mmPacked(c, B, recurrentRows, H, h.data(), H, rT, 1.0f, st, K);
    if (s.cell == Cell::GRU) {
      float *hh = st + GH + H; // ld K
      if (s.linearBeforeReset) {
        mmPacked(c, B, H, H, h.data(), H, rhT, 0.0f, hh, K);
      } else {
        for (int64_t b = 0; b < B; ++b) {
          activate(s.fns[0], st + b * K + H, v0.data(), nullptr, H, s.clip);
          for (int64_t j = 0; j < H; ++j) rh[size_t(b * H + j)] = v0[size_t(j)] * h[size_t(b * H + j)];
        }
        mmPacked(c, B, H, H, rh.data(), H, rhT, 0.0f, hh, K);
      }
    }
    for (int64_t b = 0; b < B; ++b) {
      float *a = st + b * K, *hb = h.data() + b * H, *cb = cell.data() + b * H, *yb = y + (t * B + b) * H;
      if (s.cell == Cell::LSTM) {
        float *cp = a + GH + H, *cn = a + GH + 2 * H;
        std::memcpy(cp, cb, size_t(H) * sizeof(float));
        if (peep)
          for (int64_t j = 0; j < H; ++j) a[j] += peep[j] * cp[j], a[2 * H + j] += peep[2 * H + j] * cp[j];
        activate(s.fns[0], a, v0.data(), nullptr, H, s.clip);              // i
        activate(s.fns[1], a + 3 * H, v1.data(), nullptr, H, s.clip);      // candidate
        if (s.inputForget)
          for (int64_t j = 0; j < H; ++j) v2[size_t(j)] = 1.0f - v0[size_t(j)];
        else
          activate(s.fns[0], a + 2 * H, v2.data(), nullptr, H, s.clip);    // f
        for (int64_t j = 0; j < H; ++j) cn[j] = v2[size_t(j)] * cp[j] + v0[size_t(j)] * v1[size_t(j)];
        if (peep)
          for (int64_t j = 0; j < H; ++j) a[H + j] += peep[H + j] * cn[j];
        activate(s.fns[0], a + H, v0.data(), nullptr, H, s.clip);          // o
        activate(s.fns[2], cn, v1.data(), nullptr, H, 0.0f);               // h(c): no clip
        for (int64_t j = 0; j < H; ++j) hn[size_t(j)] = v0[size_t(j)] * v1[size_t(j)];
      } else if (s.cell == Cell::GRU) {
        float *hh = a + GH + H;
        activate(s.fns[0], a, v0.data(), nullptr, H, s.clip);              // z
        if (s.linearBeforeReset) {
          activate(s.fns[0], a + H, v1.data(), nullptr, H, s.clip);        // r
          for (int64_t j = 0; j < H; ++j) {
            if (rbh) hh[j] += rbh[j];
            a[2 * H + j] += v1[size_t(j)] * hh[j];
          }
        } else {
          for (int64_t j = 0; j < H; ++j) a[2 * H + j] += hh[j];
        }
        activate(s.fns[1], a + 2 * H, v2.data(), nullptr, H, s.clip);      // candidate
        for (int64_t j = 0; j < H; ++j) hn[size_t(j)] = (1.0f - v0[size_t(j)]) * v2[size_t(j)] + v0[size_t(j)] * hb[j];
      } else {
        activate(s.fns[0], a, hn.data(), nullptr, H, s.clip);
      }
      if (s.live(t, b)) {
        std::memcpy(yb, hn.data(), size_t(H) * sizeof(float));
        std::memcpy(hb, hn.data(), size_t(H) * sizeof(float));
        if (s.cell == Cell::LSTM) std::memcpy(cb, a + GH + 2 * H, size_t(H) * sizeof(float));
      } else {
        std::memset(yb, 0, size_t(H) * sizeof(float));
      }
    }
  }
  std::copy(h.begin(), h.end(), yh);
  std::copy(cell.begin(), cell.end(), yc);
  return Status::ok();
}

Status RecurrenceGradKernel(const KernelContext &c) {
  const TensorView &dyv = c.inputs[0];
  Setup s;
  SD_RETURN_IF_ERROR(setup(c, dyv.dims[0], dyv.dims[1], 6, s));
  const int64_t S = s.seq, B = s.batch, H = c.inputs[2].dims[1], G = gates(s.cell), GH = G * H;
  const int64_t K = savedWidth(s.cell, H);
  const float *dy = dyv.as<float>(), *saved = c.inputs[1].as<float>(), *r = c.inputs[2].as<float>();
  const float *dyh = optional(c, 3), *dyc = optional(c, 4), *peep = optional(c, 5);
  float *dxw = c.outputs[0].as<float>(), *dr = c.outputs[1].as<float>();
  float *dh0 = c.outputs[2].as<float>(), *dc0 = c.outputs[3].as<float>();
  float *dp = c.outputs[4].as<float>(), *drbh = c.outputs[5].as<float>();
  std::memset(dr, 0, size_t(GH * H) * sizeof(float));
  std::memset(dp, 0, size_t(3 * H) * sizeof(float));
  std::memset(drbh, 0, size_t(H) * sizeof(float));
  size_t bh = size_t(B * H), hs = size_t(H);
  std::vector<float> dh(bh, 0.0f), dc(bh, 0.0f), dhn(bh), dcn(bh, 0.0f), dhh(bh), rh(bh), drh(bh);
  // Gate values and slopes of one row.
  std::vector<float> v0(hs), s0(hs), v1(hs), s1(hs), v2(hs), s2(hs), v3(hs), s3(hs), v4(hs), s4(hs);
  if (dyh) std::copy(dyh, dyh + B * H, dh.begin());
  if (dyc && s.cell == Cell::LSTM) std::copy(dyc, dyc + B * H, dc.begin());
  int64_t recurrentRows = s.cell == Cell::GRU ? 2 * H : GH;
  PackedB rPacked = packRows(r, recurrentRows, H, false);
  PackedB rhPacked = s.cell == Cell::GRU ? packRows(r + 2 * H * H, H, H, false) : PackedB{};
  for (int64_t k = S - 1; k >= 0; --k) {
    int64_t t = s.timeAt(k);
    const float *st = saved + t * B * K;
    float *dg = dxw + t * B * GH;
    for (int64_t b = 0; b < B; ++b) {
      const float *a = st + b * K, *hp = a + GH, *ex = a + GH + H;
      float *g = dg + b * GH, *dhnb = dhn.data() + b * H;
      const float *dhb = dh.data() + b * H, *dyb = dy + (t * B + b) * H;
      if (!s.live(t, b)) { // the state passed through unchanged; y was 0
        std::memset(g, 0, size_t(GH) * sizeof(float));
        std::memcpy(dhnb, dhb, hs * sizeof(float));
        std::memcpy(dcn.data() + b * H, dc.data() + b * H, hs * sizeof(float));
        std::fill_n(dhh.data() + b * H, H, 0.0f);
        std::fill_n(rh.data() + b * H, H, 0.0f);
        continue;
      }
      if (s.cell == Cell::LSTM) {
        const float *cp = ex, *cn = ex + H;
        activate(s.fns[0], a, v0.data(), s0.data(), H, s.clip);           // i
        activate(s.fns[0], a + H, v1.data(), s1.data(), H, s.clip);       // o
        if (!s.inputForget) activate(s.fns[0], a + 2 * H, v2.data(), s2.data(), H, s.clip); // f
        activate(s.fns[1], a + 3 * H, v3.data(), s3.data(), H, s.clip);   // candidate
        activate(s.fns[2], cn, v4.data(), s4.data(), H, 0.0f);            // h(c)
        float *dcb = dc.data() + b * H, *dcnb = dcn.data() + b * H;
        for (int64_t j = 0; j < H; ++j) {
          const float i = v0[size_t(j)], f = s.inputForget ? 1.0f - i : v2[size_t(j)];
          const math::LstmUnitGrad u = math::lstmUnitGrad(
              dhb[j] + dyb[j], dcb[j], i, s0[size_t(j)], v1[size_t(j)], s1[size_t(j)], f,
              s.inputForget ? 0.0f : s2[size_t(j)], v3[size_t(j)], s3[size_t(j)], v4[size_t(j)], s4[size_t(j)], cp[j],
              cn[j], s.inputForget, peep != nullptr, peep ? peep[j] : 0.0f, peep ? peep[H + j] : 0.0f,
              peep ? peep[2 * H + j] : 0.0f);
          if (peep) dp[j] += u.dpi, dp[H + j] += u.dpo, dp[2 * H + j] += u.dpf;
          g[j] = u.di, g[H + j] = u.dout, g[2 * H + j] = u.df, g[3 * H + j] = u.dcand;
          dcnb[j] = u.dcPrev;
          dhnb[j] = 0.0f;
        }
      } else if (s.cell == Cell::GRU) {
        activate(s.fns[0], a, v0.data(), s0.data(), H, s.clip);           // z
        activate(s.fns[0], a + H, v1.data(), s1.data(), H, s.clip);       // r
        activate(s.fns[1], a + 2 * H, v2.data(), s2.data(), H, s.clip);   // candidate
        for (int64_t j = 0; j < H; ++j) {
          const math::GruUnitGrad u = math::gruUnitGrad(dhb[j] + dyb[j], v0[size_t(j)], s0[size_t(j)], v1[size_t(j)],
                                                        s1[size_t(j)], v2[size_t(j)], s2[size_t(j)], hp[j], ex[j],
                                                        s.linearBeforeReset);
          g[j] = u.dz, g[2 * H + j] = u.dcand;
          dhnb[j] = u.dhPrev;
          dhh[size_t(b * H + j)] = u.dhh;
          if (s.linearBeforeReset) { // dr is known; the candidate's bias gets dhh
            g[H + j] = u.dr;
            drbh[j] += u.dhh;
          } else { // dr needs dhh·Rh, after this loop
            rh[size_t(b * H + j)] = v1[size_t(j)] * hp[j];
          }
        }
      } else {
        activate(s.fns[0], a, v0.data(), s0.data(), H, s.clip);
        for (int64_t j = 0; j < H; ++j) {
          g[j] = (dhb[j] + dyb[j]) * s0[size_t(j)];
          dhnb[j] = 0.0f;
        }
      }
    }
    const float *hp = st + GH; // previous hidden states, ld K
    if (s.cell == Cell::GRU) {
      float *drH = dr + 2 * H * H;
      if (s.linearBeforeReset) {
        mm(c, true, false, H, H, B, dhh.data(), H, hp, K, 1.0f, drH, H);
        mmPacked(c, B, H, H, dhh.data(), H, rhPacked, 1.0f, dhn.data(), H);
      } else {
        mmPacked(c, B, H, H, dhh.data(), H, rhPacked, 0.0f, drh.data(), H);
        for (int64_t b = 0; b < B; ++b) {
          if (!s.live(t, b)) continue;
          const float *a = st + b * K;
          activate(s.fns[0], a + H, v1.data(), s1.data(), H, s.clip);
          for (int64_t j = 0; j < H; ++j) {
            float d = drh[size_t(b * H + j)];
            dg[b * GH + H + j] = d * hp[b * K + j] * s1[size_t(j)];
            dhn[size_t(b * H + j)] += d * v1[size_t(j)];
          }
        }
        mm(c, true, false, H, H, B, dhh.data(), H, rh.data(), H, 1.0f, drH, H);
      }
    }
    mmPacked(c, B, H, recurrentRows, dg, GH, rPacked, 1.0f, dhn.data(), H);
    dh.swap(dhn);
    if (s.cell == Cell::LSTM) dc.swap(dcn);
  }
  // dR over the whole sequence as one GEMM: every step's gate gradients (kept
  // in dxw) times the previous hidden states the forward saved, k = S * B. Per
  // step it was a rank-B update reading and writing all of dR (the LSTM LM's
  // backward: 64 passes over a 1 MiB dR).
  mm(c, true, false, recurrentRows, H, S * B, dxw, GH, saved + GH, K, 1.0f, dr, H);
  std::copy(dh.begin(), dh.end(), dh0);
  std::copy(dc.begin(), dc.end(), dc0);
  return Status::ok();
}

} // namespace

void registerRecurrentKernels() {
  registerCpuKernel("Recurrence", RecurrenceKernel, {DType::F32});
  registerCpuKernel("RecurrenceGrad", RecurrenceGradKernel, {DType::F32});
}

} // namespace sd::cpu
