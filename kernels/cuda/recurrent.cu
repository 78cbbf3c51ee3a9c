// CUDA kernels of Recurrence and RecurrenceGrad: one direction of an ONNX
// RNN/GRU/LSTM after its input projection (see kernels/cpu/recurrent.cc,
// whose step order and saved layout these follow). Each time step is a
// cuBLASLt GEMM of the batch's hidden states with Rᵀ (two for a GRU's
// candidate) and one launch of the gate arithmetic, one thread per (row,
// unit), with the activations and each cell's backward from
// sd/ops/math/recurrent_cell.h, the CPU kernel's own. The backward walks the
// steps in reverse; dR is one GEMM over the whole sequence and the peephole
// and recurrent-bias gradients one column sum per unit in the CPU's order,
// so nothing is summed with atomics and two runs give the same bits. The
// whole step sequence is enqueued without a host sync: it is captured into
// the entry's CUDA graph like any other step.
#include "gemm_lt.h"
#include "sd/ops/math/recurrent_cell.h"
#include "sd/ops/recurrent_layout.h"

namespace sd::cuda {
namespace {

using namespace recurrent;
using math::GateActivation;

// The attributes and sizes every launch needs, by value.
struct Cfg {
  Cell cell = Cell::Unknown;
  int64_t S = 0, B = 0, H = 0, GH = 0, K = 0, recRows = 0;
  bool reverse = false, inputForget = false, linearBeforeReset = false;
  float clip = 0;
  GateActivation f0, f1, f2;
  const void *lens = nullptr; // sequence_lens (i32 or i64), or null: every row runs the whole sequence
  bool lens64 = false;

  __host__ __device__ int64_t timeAt(int64_t k) const { return reverse ? S - 1 - k : k; }
  __device__ bool live(int64_t t, int64_t b) const {
    if (!lens) return true;
    return t < (lens64 ? static_cast<const int64_t *>(lens)[b] : int64_t(static_cast<const int32_t *>(lens)[b]));
  }
};

Status readCfg(const KernelContext &c, int64_t seq, int64_t batch, int64_t hidden, Cfg &g) {
  g.cell = cellOf(c.attrs.getString("cell", ""));
  if (g.cell == Cell::Unknown) return sdError("Recurrence: unknown cell '", c.attrs.getString("cell", ""), "'");
  g.S = seq, g.B = batch, g.H = hidden;
  g.GH = gates(g.cell) * hidden;
  g.K = savedWidth(g.cell, hidden);
  g.recRows = g.cell == Cell::GRU ? 2 * hidden : g.GH;
  g.reverse = c.attrs.getInt("reverse", 0) != 0;
  g.inputForget = c.attrs.getInt("input_forget", 0) != 0;
  g.linearBeforeReset = c.attrs.getInt("linear_before_reset", 0) != 0;
  g.clip = float(c.attrs.getFloat("clip", 0.0));
  std::vector<GateActivation> fns;
  std::string bad;
  if (!math::gateActivationsOf(c.attrs.getString("activations", ""), c.attrs.getFloats("activation_alpha"),
                               c.attrs.getFloats("activation_beta"), fns, bad))
    return sdError("Recurrence: unknown activation '", bad, "'");
  if (fns.size() < size_t(activationCount(g.cell)))
    return sdError("Recurrence: ", activationCount(g.cell), " activations needed, ", fns.size(), " given");
  GateActivation *slots[3] = {&g.f0, &g.f1, &g.f2};
  for (size_t k = 0; k < fns.size() && k < 3; ++k) *slots[k] = fns[k];
  return Status::ok();
}

// sequence_lens (operand `i`) as the launches read it.
Status readLens(const KernelContext &c, size_t i, Cfg &g) {
  if (!c.hasInput(i) || !c.inputs[i].data) return Status::ok();
  const DType t = c.inputs[i].dtype;
  if (t != DType::I32 && t != DType::I64) return sdError("Recurrence: sequence_lens must be i32 or i64 on CUDA");
  g.lens = c.inputs[i].data;
  g.lens64 = t == DType::I64;
  return Status::ok();
}

__device__ inline float act(const GateActivation &f, float x, float clip) { return f(math::clipGate(x, clip)); }
// The value and the slope (0 where the input was clipped).
__device__ inline float actSlope(const GateActivation &f, float x, float clip, float &slope) {
  const float v = math::clipGate(x, clip);
  slope = math::clippedSlope(f.slope(v), x, clip);
  return f(v);
}

// ---- forward -------------------------------------------------------------

// Step t's saved row: its gate inputs (the projection xw) and the previous
// hidden state (and an LSTM's previous cell state), before the GEMM adds h·Rᵀ.
__global__ void stepIn(Cfg g, int64_t t, const float *xw, const float *h, const float *cell, float *saved) {
  const int64_t n = g.B * g.K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / g.K, j = i % g.K;
    float *st = saved + t * g.B * g.K;
    if (j < g.GH) st[i] = xw[(t * g.B + b) * g.GH + j];
    else if (j < g.GH + g.H) st[i] = h[b * g.H + j - g.GH];
    else if (g.cell == Cell::LSTM && j < g.GH + 2 * g.H) st[i] = cell[b * g.H + j - g.GH - g.H];
  }
}

// A GRU without linear_before_reset: r * h, the candidate GEMM's left side.
__global__ void gruResetHidden(Cfg g, const float *st, const float *h, float *rh) {
  const int64_t n = g.B * g.H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / g.H, j = i % g.H;
    rh[i] = act(g.f0, st[b * g.K + g.H + j], g.clip) * h[i];
  }
}

// The gate arithmetic of step t, in the CPU kernel's order.
__global__ void stepGates(Cfg g, int64_t t, float *saved, const float *peep, const float *rbh, float *h, float *cell,
                          float *y) {
  const int64_t n = g.B * g.H, H = g.H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / H, j = i % H;
    float *a = saved + (t * g.B + b) * g.K;
    float hn = 0, cn = 0;
    if (g.cell == Cell::LSTM) {
      const float cp = a[g.GH + H + j];
      if (peep) a[j] += peep[j] * cp, a[2 * H + j] += peep[2 * H + j] * cp;
      const float in = act(g.f0, a[j], g.clip), cc = act(g.f1, a[3 * H + j], g.clip);
      const float f = g.inputForget ? 1.0f - in : act(g.f0, a[2 * H + j], g.clip);
      cn = f * cp + in * cc;
      a[g.GH + 2 * H + j] = cn;
      if (peep) a[H + j] += peep[H + j] * cn;
      hn = act(g.f0, a[H + j], g.clip) * g.f2(cn); // h(c): no clip
    } else if (g.cell == Cell::GRU) {
      float *hh = a + g.GH + H;
      const float z = act(g.f0, a[j], g.clip);
      if (g.linearBeforeReset) {
        const float r = act(g.f0, a[H + j], g.clip);
        if (rbh) hh[j] += rbh[j];
        a[2 * H + j] += r * hh[j];
      } else {
        a[2 * H + j] += hh[j];
      }
      const float c = act(g.f1, a[2 * H + j], g.clip);
      hn = (1.0f - z) * c + z * h[i];
    } else {
      hn = act(g.f0, a[j], g.clip);
    }
    float *yt = y + (t * g.B + b) * H;
    if (g.live(t, b)) {
      yt[j] = hn;
      h[i] = hn;
      if (g.cell == Cell::LSTM) cell[i] = cn;
    } else {
      yt[j] = 0.0f;
    }
  }
}

// Every GEMM of both directions is planned when the session is created.
struct RecurrencePlan : PreparedError {
  Cfg cfg;
  float *scratch = nullptr; // B x H floats each: forward h, cell, rh; backward dh, dc, dhn, dcn, dhh, rh, drh
  std::shared_ptr<LtGemm> hR, hRh;                         // forward
  std::shared_ptr<LtGemm> dgR, dhhRh, dhhT_h, dhhT_rh, dR; // backward
  ~RecurrencePlan() { cudaFree(scratch); }
  float *buffer(int k) const { return scratch + int64_t(k) * cfg.B * cfg.H; }
};

GemmShape gemm(const Cfg &g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
               int64_t ldc) {
  GemmShape s;
  s.transA = ta, s.transB = tb;
  s.m = m, s.n = n, s.k = k, s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  s.dtype = DType::F32;
  // Every operand starts at a multiple of H floats from a 64-byte-aligned base.
  s.alignBytes = alignmentOf(g.H, DType::F32);
  return s;
}

// The step's configuration (R is operand `rOperand`) and `buffers` B x H
// scratch buffers, or (error) why either cannot be had.
std::shared_ptr<RecurrencePlan> allocatePlan(const KernelContext &c, size_t rOperand, int buffers) {
  auto p = std::make_shared<RecurrencePlan>();
  Cfg &g = p->cfg;
  if (Status st = readCfg(c, c.inputs[0].dims[0], c.inputs[0].dims[1], c.inputs[rOperand].dims[1], g); !st.isOk())
    return p->error = st.message(), p;
  const size_t bytes = size_t(std::max<int64_t>(1, buffers * g.B * g.H)) * sizeof(float);
  if (cudaMalloc(&p->scratch, bytes) != cudaSuccess) {
    cudaGetLastError();
    p->error = "cannot allocate its " + std::to_string(bytes) + " bytes of device scratch";
  }
  return p;
}

// The plan a run uses and its configuration with this run's sequence_lens.
Status runPlan(const KernelContext &c, const char *op, const RecurrencePlan *&plan, Cfg &g) {
  plan = static_cast<const RecurrencePlan *>(c.prepared);
  if (!plan) return sdError(op, " was not prepared");
  if (!plan->error.empty()) return sdError(op, ": ", plan->error);
  g = plan->cfg;
  return readLens(c, 6, g);
}

std::shared_ptr<const void> prepareForward(const PrepareContext &pc) {
  auto p = allocatePlan(pc.kernel, 1, 3);
  if (!p->error.empty()) return p;
  const Cfg &g = p->cfg;
  const int64_t B = g.B, H = g.H;
  p->hR = planGemm(pc, gemm(g, false, true, B, g.recRows, H, H, H, g.K));
  if (g.cell == Cell::GRU) p->hRh = planGemm(pc, gemm(g, false, true, B, H, H, H, H, g.K));
  return p;
}

Status run(const std::shared_ptr<LtGemm> &gemm, const void *a, const void *b, void *c, double beta, cudaStream_t s) {
  return gemm->run(a, b, c, 1.0, beta, s);
}

Status copyOrZero(const KernelContext &c, size_t input, float *dst, int64_t n) {
  if (c.hasInput(input) && c.inputs[input].data)
    return cudaCheck(cudaMemcpyAsync(dst, c.inputs[input].data, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                     streamOf(c)),
                     "Recurrence");
  return cudaCheck(cudaMemsetAsync(dst, 0, size_t(n) * sizeof(float), streamOf(c)), "Recurrence");
}

const float *optionalInput(const KernelContext &c, size_t i) {
  return c.hasInput(i) && c.inputs[i].data ? c.inputs[i].as<float>() : nullptr;
}

// xw [S, B, G·H], R [G·H, H], h0?, c0?, peepholes?, Rbh?, sequence_lens? ->
// y [S, B, H], y_h [B, H], y_c [B, H], saved [S, B, K]
Status RecurrenceKernel(const KernelContext &c) {
  const RecurrencePlan *plan = nullptr;
  Cfg g;
  SD_RETURN_IF_ERROR(runPlan(c, "Recurrence", plan, g));
  const cudaStream_t s = streamOf(c);
  const int64_t B = g.B, H = g.H, n = B * H;
  float *h = plan->buffer(0), *cell = plan->buffer(1), *rh = plan->buffer(2);
  const float *xw = c.inputs[0].as<float>(), *r = c.inputs[1].as<float>();
  const float *peep = optionalInput(c, 4), *rbh = optionalInput(c, 5);
  float *y = c.outputs[0].as<float>(), *saved = c.outputs[3].as<float>();
  if (n == 0) return Status::ok();
  SD_RETURN_IF_ERROR(copyOrZero(c, 2, h, n));
  if (g.cell == Cell::LSTM) SD_RETURN_IF_ERROR(copyOrZero(c, 3, cell, n));
  else SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(cell, 0, size_t(n) * sizeof(float), s), "Recurrence"));
  for (int64_t k = 0; k < g.S; ++k) {
    const int64_t t = g.timeAt(k);
    float *st = saved + t * B * g.K;
    stepIn<<<blocksFor(B * g.K), kThreads, 0, s>>>(g, t, xw, h, cell, saved);
    SD_RETURN_IF_ERROR(run(plan->hR, h, r, st, 1.0, s));
    if (g.cell == Cell::GRU) {
      const float *left = h;
      if (!g.linearBeforeReset) {
        gruResetHidden<<<blocksFor(n), kThreads, 0, s>>>(g, st, h, rh);
        left = rh;
      }
      SD_RETURN_IF_ERROR(run(plan->hRh, left, r + 2 * H * H, st + g.GH + H, 0.0, s));
    }
    stepGates<<<blocksFor(n), kThreads, 0, s>>>(g, t, saved, peep, rbh, h, cell, y);
  }
  const size_t bytes = size_t(n) * sizeof(float);
  SD_RETURN_IF_ERROR(cudaCheck(cudaMemcpyAsync(c.outputs[1].data, h, bytes, cudaMemcpyDeviceToDevice, s), "Recurrence"));
  SD_RETURN_IF_ERROR(cudaCheck(cudaMemcpyAsync(c.outputs[2].data, cell, bytes, cudaMemcpyDeviceToDevice, s), "Recurrence"));
  return launchStatus("Recurrence");
}

// ---- backward ------------------------------------------------------------

// Step t's gate gradients into dg (= dxw[t]) and the recurrent state's direct
// shares (dhn, dcn), plus what a GRU's candidate GEMMs need (dhh, rh).
__global__ void gradGates(Cfg g, int64_t t, const float *dy, const float *saved, const float *peep, const float *dh,
                          const float *dc, float *dxw, float *dhn, float *dcn, float *dhh, float *rh) {
  const int64_t n = g.B * g.H, H = g.H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / H, j = i % H;
    const float *a = saved + (t * g.B + b) * g.K, *hp = a + g.GH, *ex = a + g.GH + H;
    float *dg = dxw + (t * g.B + b) * g.GH;
    if (!g.live(t, b)) { // the state passed through unchanged; y was 0
      for (int64_t q = 0; q < g.GH / H; ++q) dg[q * H + j] = 0.0f;
      dhn[i] = dh[i];
      if (dcn) dcn[i] = dc[i];
      if (dhh) dhh[i] = 0.0f, rh[i] = 0.0f;
      continue;
    }
    const float dht = dh[i] + dy[(t * g.B + b) * H + j];
    if (g.cell == Cell::LSTM) {
      float si, so, sf = 0, sc, shc;
      const float in = actSlope(g.f0, a[j], g.clip, si), o = actSlope(g.f0, a[H + j], g.clip, so);
      const float fv = g.inputForget ? 1.0f - in : actSlope(g.f0, a[2 * H + j], g.clip, sf);
      const float cc = actSlope(g.f1, a[3 * H + j], g.clip, sc);
      const float cn = ex[H + j], hc = g.f2(cn);
      shc = g.f2.slope(cn);
      const math::LstmUnitGrad u =
          math::lstmUnitGrad(dht, dc[i], in, si, o, so, fv, sf, cc, sc, hc, shc, ex[j], cn, g.inputForget,
                             peep != nullptr, peep ? peep[j] : 0.0f, peep ? peep[H + j] : 0.0f,
                             peep ? peep[2 * H + j] : 0.0f);
      dg[j] = u.di, dg[H + j] = u.dout, dg[2 * H + j] = u.df, dg[3 * H + j] = u.dcand;
      dcn[i] = u.dcPrev;
      dhn[i] = 0.0f;
    } else if (g.cell == Cell::GRU) {
      float sz, sr, sc;
      const float z = actSlope(g.f0, a[j], g.clip, sz), r = actSlope(g.f0, a[H + j], g.clip, sr);
      const float cv = actSlope(g.f1, a[2 * H + j], g.clip, sc);
      const math::GruUnitGrad u = math::gruUnitGrad(dht, z, sz, r, sr, cv, sc, hp[j], ex[j], g.linearBeforeReset);
      dg[j] = u.dz, dg[2 * H + j] = u.dcand;
      dhn[i] = u.dhPrev;
      dhh[i] = u.dhh;
      if (g.linearBeforeReset) dg[H + j] = u.dr;
      else rh[i] = r * hp[j];
    } else {
      float s0;
      actSlope(g.f0, a[j], g.clip, s0);
      dg[j] = dht * s0;
      dhn[i] = 0.0f;
    }
  }
}

// A GRU without linear_before_reset: dr from drh = dhh·Rh, and drh's share of dh.
__global__ void gruResetGrad(Cfg g, int64_t t, const float *saved, const float *drh, float *dxw, float *dhn) {
  const int64_t n = g.B * g.H, H = g.H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / H, j = i % H;
    if (!g.live(t, b)) continue;
    const float *a = saved + (t * g.B + b) * g.K;
    float sr;
    const float r = actSlope(g.f0, a[H + j], g.clip, sr);
    dxw[(t * g.B + b) * g.GH + H + j] = drh[i] * a[g.GH + j] * sr;
    dhn[i] += drh[i] * r;
  }
}

// The peepholes' and a linear-before-reset GRU's Rbh gradients: one thread
// per unit sums over the steps in the backward's order (reverse time) and
// the rows, as the CPU kernel accumulates them.
__global__ void columnSums(Cfg g, const float *dxw, const float *saved, float *dp, float *drbh) {
  const int64_t H = g.H;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < H; j += int64_t(gridDim.x) * blockDim.x) {
    float pi = 0, po = 0, pf = 0, rb = 0;
    for (int64_t k = g.S - 1; k >= 0; --k) {
      const int64_t t = g.timeAt(k);
      for (int64_t b = 0; b < g.B; ++b) {
        if (!g.live(t, b)) continue;
        const float *dg = dxw + (t * g.B + b) * g.GH, *a = saved + (t * g.B + b) * g.K;
        if (g.cell == Cell::LSTM) {
          const float cp = a[g.GH + H + j], cn = a[g.GH + 2 * H + j];
          po += dg[H + j] * cn;
          pi += dg[j] * cp;
          pf += dg[2 * H + j] * cp;
        } else if (g.cell == Cell::GRU) {
          rb += dg[2 * H + j] * act(g.f0, a[H + j], g.clip);
        }
      }
    }
    dp[j] = pi, dp[H + j] = po, dp[2 * H + j] = pf;
    drbh[j] = rb;
  }
}

std::shared_ptr<const void> prepareGrad(const PrepareContext &pc) {
  auto p = allocatePlan(pc.kernel, 2, 7);
  if (!p->error.empty()) return p;
  const Cfg &g = p->cfg;
  const int64_t B = g.B, H = g.H;
  p->dgR = planGemm(pc, gemm(g, false, false, B, H, g.recRows, g.GH, H, H));
  p->dR = planGemm(pc, gemm(g, true, false, g.recRows, H, g.S * B, g.GH, g.K, H));
  if (g.cell == Cell::GRU) {
    p->dhhRh = planGemm(pc, gemm(g, false, false, B, H, H, H, H, H));
    if (g.linearBeforeReset) p->dhhT_h = planGemm(pc, gemm(g, true, false, H, H, B, H, g.K, H));
    else p->dhhT_rh = planGemm(pc, gemm(g, true, false, H, H, B, H, H, H));
  }
  return p;
}

// dy [S, B, H], saved, R, dy_h?, dy_c?, peepholes?, sequence_lens? ->
// dxw [S, B, G·H], dR [G·H, H], dh0, dc0, dpeepholes [3H], dRbh [H]
Status RecurrenceGradKernel(const KernelContext &c) {
  const RecurrencePlan *plan = nullptr;
  Cfg g;
  SD_RETURN_IF_ERROR(runPlan(c, "RecurrenceGrad", plan, g));
  const cudaStream_t s = streamOf(c);
  const int64_t B = g.B, H = g.H, n = B * H;
  const float *dy = c.inputs[0].as<float>(), *saved = c.inputs[1].as<float>(), *r = c.inputs[2].as<float>();
  const float *peep = optionalInput(c, 5);
  float *dxw = c.outputs[0].as<float>(), *dr = c.outputs[1].as<float>();
  float *dh = plan->buffer(0), *dc = plan->buffer(1), *dhn = plan->buffer(2), *dcn = plan->buffer(3);
  float *dhh = plan->buffer(4), *rh = plan->buffer(5), *drh = plan->buffer(6);
  auto zero = [&](void *p, int64_t floats) {
    return cudaCheck(cudaMemsetAsync(p, 0, size_t(floats) * sizeof(float), s), "RecurrenceGrad");
  };
  SD_RETURN_IF_ERROR(zero(dr, g.GH * H));
  SD_RETURN_IF_ERROR(zero(c.outputs[4].data, 3 * H));
  SD_RETURN_IF_ERROR(zero(c.outputs[5].data, H));
  if (n == 0) return Status::ok();
  SD_RETURN_IF_ERROR(copyOrZero(c, 3, dh, n));
  if (g.cell == Cell::LSTM) SD_RETURN_IF_ERROR(copyOrZero(c, 4, dc, n));
  else SD_RETURN_IF_ERROR(zero(dc, n));
  const bool gru = g.cell == Cell::GRU;
  for (int64_t k = g.S - 1; k >= 0; --k) {
    const int64_t t = g.timeAt(k);
    const float *st = saved + t * B * g.K;
    float *dg = dxw + t * B * g.GH;
    gradGates<<<blocksFor(n), kThreads, 0, s>>>(g, t, dy, saved, peep, dh, dc, dxw, dhn,
                                                g.cell == Cell::LSTM ? dcn : nullptr, gru ? dhh : nullptr,
                                                gru ? rh : nullptr);
    if (gru) {
      float *drH = dr + 2 * H * H;
      const float *rH = r + 2 * H * H;
      if (g.linearBeforeReset) {
        SD_RETURN_IF_ERROR(run(plan->dhhT_h, dhh, st + g.GH, drH, 1.0, s));
        SD_RETURN_IF_ERROR(run(plan->dhhRh, dhh, rH, dhn, 1.0, s));
      } else {
        SD_RETURN_IF_ERROR(run(plan->dhhRh, dhh, rH, drh, 0.0, s));
        gruResetGrad<<<blocksFor(n), kThreads, 0, s>>>(g, t, saved, drh, dxw, dhn);
        SD_RETURN_IF_ERROR(run(plan->dhhT_rh, dhh, rh, drH, 1.0, s));
      }
    }
    SD_RETURN_IF_ERROR(run(plan->dgR, dg, r, dhn, 1.0, s));
    std::swap(dh, dhn);
    if (g.cell == Cell::LSTM) std::swap(dc, dcn);
  }
  // dR over the whole sequence as one GEMM: the gate gradients (in dxw) times
  // the previous hidden states the forward saved, k = S * B.
  if (g.S * B > 0) SD_RETURN_IF_ERROR(run(plan->dR, dxw, saved + g.GH, dr, 1.0, s));
  if (peep || g.linearBeforeReset)
    columnSums<<<blocksFor(H), kThreads, 0, s>>>(g, dxw, saved, c.outputs[4].as<float>(), c.outputs[5].as<float>());
  const size_t bytes = size_t(n) * sizeof(float);
  SD_RETURN_IF_ERROR(cudaCheck(cudaMemcpyAsync(c.outputs[2].data, dh, bytes, cudaMemcpyDeviceToDevice, s), "RecurrenceGrad"));
  SD_RETURN_IF_ERROR(cudaCheck(cudaMemcpyAsync(c.outputs[3].data, dc, bytes, cudaMemcpyDeviceToDevice, s), "RecurrenceGrad"));
  return launchStatus("RecurrenceGrad");
}

} // namespace

void registerRecurrentKernels() {
  registerKernel("Recurrence", RecurrenceKernel, {DType::F32}, prepareForward);
  registerKernel("RecurrenceGrad", RecurrenceGradKernel, {DType::F32}, prepareGrad);
}

} // namespace sd::cuda
