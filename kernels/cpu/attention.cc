// CPU kernels of fused scaled-dot-product attention and its gradient.
// Attention(q [..., T, d], kt [..., d, S], v [..., S, dv], mask) computes
// P = softmax(q kt * scale, with mask_value where mask is true) and y = P v
// one (batch, head) item at a time, P in a per-thread T x S scratch that
// never reaches memory as a tensor. The gradient recomputes P from q and kt
// (one extra T x S x d product) instead of keeping [..., T, S] alive from
// the forward, then
//   dv = P^T dy,  dP = dy v^T,  dS = P * (dP - rowsum(dP * P)) (0 where masked),
//   dq = scale dS kt^T,  dkt = scale q^T dS.
// Packed sequences (optional positions [B, T]): query i of batch row b sees
// keys j >= i - positions[b, i] only, i.e. the keys of its own sequence; the
// excluded scores are -inf, so their probabilities and gradients are 0.
#include "cpu_util.h"
#include "gemm.h"
#include "vecmath.h"
#include <algorithm>
#include <cmath>

namespace sd::cpu {
namespace {

// Offset of each item (a flat index over `batch`) in an operand whose leading
// dims broadcast to `batch` and whose last two dims hold `matrix` elements.
std::vector<int64_t> itemOffsets(const Dims &operand, const Dims &batch, int64_t matrix) {
  Dims strides = broadcastStrides(Dims(operand.begin(), operand.end() - 2), batch);
  std::vector<int64_t> offsets(size_t(product(batch)));
  for (size_t item = 0; item < offsets.size(); ++item) {
    int64_t rem = int64_t(item), off = 0;
    for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {
      off += (rem % batch[size_t(d)]) * strides[size_t(d)];
      rem /= batch[size_t(d)];
    }
    offsets[item] = off * matrix;
  }
  return offsets;
}

struct Geometry {
  Dims batch;
  int64_t T = 0, S = 0, d = 0, dv = 0;
  std::vector<int64_t> q, kt, v, mask;      // per-item offsets
  int64_t maskRowStride = 0, maskColStride = 0; // 0 where the mask broadcasts
  const bool *maskData = nullptr;
  const int64_t *positions = nullptr; // [B, T]; item / itemsPerRow = b
  int64_t itemsPerRow = 1;
  float scale = 1, maskValue = -INFINITY;
};

Status geometryOf(const KernelContext &c, size_t first, Geometry &g) {
  const TensorView &q = c.inputs[first], &kt = c.inputs[first + 1], &v = c.inputs[first + 2];
  SD_CHECK_ARG(q.dtype == DType::F32 && kt.dtype == DType::F32 && v.dtype == DType::F32, "Attention needs f32");
  size_t r = q.dims.size();
  g.T = q.dims[r - 2];
  g.d = q.dims[r - 1];
  g.S = kt.dims.back();
  g.dv = v.dims.back();
  SD_CHECK_ARG(kt.dims[kt.dims.size() - 2] == g.d && v.dims[v.dims.size() - 2] == g.S, "Attention shapes inconsistent");
  const TensorView &out = c.outputs[0];
  g.batch.assign(out.dims.begin(), out.dims.end() - 2);
  if (first == 1) g.batch.assign(q.dims.begin(), q.dims.end() - 2); // the gradient: outputs are dq, dkt, dv
  g.q = itemOffsets(q.dims, g.batch, g.T * g.d);
  g.kt = itemOffsets(kt.dims, g.batch, g.d * g.S);
  g.v = itemOffsets(v.dims, g.batch, g.S * g.dv);
  g.scale = float(c.attrs.getFloat("scale", 1.0));
  g.maskValue = float(c.attrs.getFloat("mask_value", -INFINITY));
  if (c.hasInput(first + 3) && c.inputs[first + 3].data) {
    const TensorView &m = c.inputs[first + 3];
    SD_CHECK_ARG(m.dtype == DType::Bool && m.rank() >= 2, "Attention mask must be bool of rank >= 2");
    int64_t mr = m.dims[m.dims.size() - 2], mc = m.dims.back();
    SD_CHECK_ARG((mr == g.T || mr == 1) && (mc == g.S || mc == 1), "Attention mask does not broadcast");
    g.maskColStride = mc == 1 ? 0 : 1;
    g.maskRowStride = mr == 1 ? 0 : mc;
    g.mask = itemOffsets(m.dims, g.batch, mr * mc);
    g.maskData = m.as<bool>();
  }
  if (c.hasInput(first + 4) && c.inputs[first + 4].data) {
    const TensorView &pos = c.inputs[first + 4];
    SD_CHECK_ARG(pos.dtype == DType::I64 && pos.rank() == 2 && !g.batch.empty() && pos.dims[0] == g.batch[0] &&
                     pos.dims[1] == g.T && g.S == g.T,
                 "Attention positions must be i64 [batch, seq] of a self-attention");
    g.positions = pos.as<int64_t>();
    g.itemsPerRow = g.batch[0] ? product(g.batch) / g.batch[0] : 1;
  }
  return Status::ok();
}

// First key query i of `item` may see: the start of its packed sequence.
int64_t keyStart(const Geometry &g, size_t item, int64_t i) {
  if (!g.positions) return 0;
  int64_t p = g.positions[(int64_t(item) / g.itemsPerRow) * g.T + i];
  return i - std::clamp<int64_t>(p, 0, i);
}

bool masked(const Geometry &g, size_t item, int64_t i, int64_t j) {
  return g.maskData && g.maskData[g.mask[item] + i * g.maskRowStride + j * g.maskColStride];
}

// P = softmax(q kt * scale, masked) for one item, T x S, into p.
void probabilities(const Geometry &g, size_t item, const float *q, const float *kt, float *p) {
  gemm<float>(false, false, g.T, g.S, g.d, g.scale, q + g.q[item], g.d, kt + g.kt[item], g.S, 0.0f, p, g.S);
  for (int64_t i = 0; i < g.T; ++i) {
    float *row = p + i * g.S;
    if (g.maskData)
      for (int64_t j = 0; j < g.S; ++j)
        if (masked(g, item, i, j)) row[j] = g.maskValue;
    for (int64_t j = 0, start = keyStart(g, item, i); j < start; ++j) row[j] = -INFINITY;
    vsoftmaxRow(row, row, g.S);
  }
}

Status AttentionKernel(const KernelContext &c) {
  Geometry g;
  SD_RETURN_IF_ERROR(geometryOf(c, 0, g));
  const float *q = c.inputs[0].as<float>(), *kt = c.inputs[1].as<float>(), *v = c.inputs[2].as<float>();
  float *y = c.outputs[0].as<float>();
  parallelFor(c.pool, int64_t(g.q.size()), 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> p(size_t(g.T * g.S));
    for (int64_t item = i0; item < i1; ++item) {
      probabilities(g, size_t(item), q, kt, p.data());
      gemm<float>(false, false, g.T, g.dv, g.S, 1.0f, p.data(), g.S, v + g.v[size_t(item)], g.dv, 0.0f,
                  y + item * g.T * g.dv, g.dv);
    }
  });
  return Status::ok();
}

// AttentionGrad(dy, q, kt, v, mask, positions) -> dq, dkt, dv (q, kt, v share batch dims).
Status AttentionGradKernel(const KernelContext &c) {
  Geometry g;
  SD_RETURN_IF_ERROR(geometryOf(c, 1, g));
  const float *dy = c.inputs[0].as<float>(), *q = c.inputs[1].as<float>(), *kt = c.inputs[2].as<float>(),
              *v = c.inputs[3].as<float>();
  float *dq = c.outputs[0].as<float>(), *dkt = c.outputs[1].as<float>(), *dv = c.outputs[2].as<float>();
  parallelFor(c.pool, int64_t(g.q.size()), 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> p(size_t(g.T * g.S)), ds(size_t(g.T * g.S));
    for (int64_t item = i0; item < i1; ++item) {
      size_t it = size_t(item);
      const float *dyi = dy + item * g.T * g.dv;
      probabilities(g, it, q, kt, p.data());
      gemm<float>(true, false, g.S, g.dv, g.T, 1.0f, p.data(), g.S, dyi, g.dv, 0.0f, dv + g.v[it], g.dv);
      gemm<float>(false, true, g.T, g.S, g.dv, 1.0f, dyi, g.dv, v + g.v[it], g.dv, 0.0f, ds.data(), g.S);
      for (int64_t i = 0; i < g.T; ++i) {
        float *dsr = ds.data() + i * g.S;
        const float *pr = p.data() + i * g.S;
        double dot = 0;
        for (int64_t j = 0; j < g.S; ++j) dot += double(dsr[j]) * double(pr[j]);
        for (int64_t j = 0; j < g.S; ++j) dsr[j] = masked(g, it, i, j) ? 0.0f : pr[j] * (dsr[j] - float(dot));
      }
      gemm<float>(false, true, g.T, g.d, g.S, g.scale, ds.data(), g.S, kt + g.kt[it], g.S, 0.0f, dq + g.q[it], g.d);
      gemm<float>(true, false, g.d, g.S, g.T, g.scale, q + g.q[it], g.d, ds.data(), g.S, 0.0f, dkt + g.kt[it], g.S);
    }
  });
  return Status::ok();
}

} // namespace

void registerAttentionKernels() {
  registerCpuKernel("Attention", AttentionKernel);
  registerCpuKernel("AttentionGrad", AttentionGradKernel);
}

} // namespace sd::cpu
