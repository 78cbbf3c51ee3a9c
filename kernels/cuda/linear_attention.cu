// CUDA kernel of ONNX LinearAttention (opset 27; see
// kernels/cpu/linear_attention.cc): per (batch, kv head) a d_k x d_v state,
// decayed by exp(decay) (gated rules), corrected by the delta rule
// v <- beta (v - S^T k) (delta rules), updated by k v^T and read by every
// query head of the group, o = scale q^T S.
// One block per (batch, kv head), one thread per state column m: every
// operation of a step touches column m alone (its decay, its retrieval
// S^T k, its update, its reads), so the threads walk the sequence with no
// barrier, each summing over d_k in the CPU's order. The state lives in the
// `present` result (f32/f64) or, for halves, in an f32 scratch allocated when
// the session is created, as the CPU keeps an f32 state for them.
#include "cuda_util.cuh"
#include <cmath>
#include <memory>

namespace sd::cuda {
namespace {

struct LinearAttentionGeometry {
  int64_t batch, steps, hq, hkv, dk, dv, decayLast, betaLast;
  float scale;
};

template <typename T, typename Acc>
__global__ void linearAttentionKernel(LinearAttentionGeometry g, const T *q, const T *k, const T *v, const T *past,
                                      const T *decay, const T *beta, T *out, T *present, Acc *state) {
  const int64_t bh = blockIdx.x, b = bh / g.hkv, h = bh % g.hkv, group = g.hq / g.hkv;
  Acc *s = state + bh * g.dk * g.dv;
  for (int64_t m = threadIdx.x; m < g.dv; m += blockDim.x) {
    for (int64_t d = 0; d < g.dk; ++d) s[d * g.dv + m] = past ? Acc(load(past[bh * g.dk * g.dv + d * g.dv + m])) : Acc(0);
    for (int64_t t = 0; t < g.steps; ++t) {
      const int64_t row = b * g.steps + t;
      const T *kt = k + row * g.hkv * g.dk + h * g.dk;
      if (decay) {
        const T *gt = decay + row * g.decayLast;
        for (int64_t d = 0; d < g.dk; ++d)
          s[d * g.dv + m] *= exp(Acc(load(g.decayLast == g.hkv ? gt[h] : gt[h * g.dk + d])));
      }
      Acc vt = Acc(load(v[row * g.hkv * g.dv + h * g.dv + m]));
      if (beta) {
        const Acc bt = Acc(load(beta[row * g.betaLast + (g.betaLast == 1 ? 0 : h)]));
        Acc retrieved = 0;
        for (int64_t d = 0; d < g.dk; ++d) retrieved += s[d * g.dv + m] * Acc(load(kt[d]));
        vt = bt * (vt - retrieved);
      }
      for (int64_t d = 0; d < g.dk; ++d) s[d * g.dv + m] += Acc(load(kt[d])) * vt;
      for (int64_t j = 0; j < group; ++j) {
        const int64_t head = h * group + j;
        const T *qt = q + row * g.hq * g.dk + head * g.dk;
        Acc acc = 0;
        for (int64_t d = 0; d < g.dk; ++d) acc += Acc(load(qt[d])) * s[d * g.dv + m];
        out[row * g.hq * g.dv + head * g.dv + m] = store<T>(Compute<T>(Acc(g.scale) * acc));
      }
    }
    if (static_cast<void *>(s) != static_cast<void *>(present + bh * g.dk * g.dv))
      for (int64_t d = 0; d < g.dk; ++d)
        present[bh * g.dk * g.dv + d * g.dv + m] = store<T>(Compute<T>(s[d * g.dv + m]));
  }
}

StatusOr<LinearAttentionGeometry> geometryOf(const KernelContext &c) {
  const TensorView &q = c.inputs[0], &v = c.inputs[2];
  const int64_t hq = c.attrs.getInt("q_num_heads", 0), hkv = c.attrs.getInt("kv_num_heads", 0);
  if (q.rank() != 3 || v.rank() != 3 || hq <= 0 || hkv <= 0 || hq % hkv)
    return sdError("LinearAttention on CUDA takes 3-D q, k, v and q_num_heads a multiple of kv_num_heads");
  const int64_t dk = q.dims[2] / hq;
  const double scaleAttr = c.attrs.getFloat("scale", 0.0);
  LinearAttentionGeometry g{q.dims[0], q.dims[1], hq, hkv, dk, v.dims[2] / hkv,
                            c.hasInput(4) ? c.inputs[4].dims[2] : 0, c.hasInput(5) ? c.inputs[5].dims[2] : 0,
                            scaleAttr == 0.0 ? float(1.0 / std::sqrt(double(dk))) : float(scaleAttr)};
  return g;
}

// The f32 state of a half-precision LinearAttention, one per step.
struct HalfState {
  float *state = nullptr;
  ~HalfState() { cudaFree(state); }
};

std::shared_ptr<const void> prepareLinearAttention(const PrepareContext &p) {
  const DType t = p.kernel.inputs[0].dtype;
  if (t != DType::F16 && t != DType::BF16) return nullptr;
  auto s = std::make_shared<HalfState>();
  if (cudaMalloc(&s->state, size_t(std::max<int64_t>(1, p.kernel.outputs[1].numElements())) * sizeof(float)) !=
      cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return s;
}

Status LinearAttentionKernel(const KernelContext &c) {
  if (c.outputs[1].dtype != c.inputs[0].dtype) return sdError("LinearAttention's state must have the query's type");
  StatusOr<LinearAttentionGeometry> g = geometryOf(c);
  if (!g.isOk()) return g.status();
  const int64_t blocks = g.value().batch * g.value().hkv;
  if (blocks == 0 || g.value().dv == 0) return Status::ok();
  const unsigned threads = unsigned(std::min<int64_t>(256, (g.value().dv + 31) / 32 * 32));
  auto operand = [&](size_t i) { return c.hasInput(i) ? c.inputs[i].data : nullptr; };
  return dispatchFloatStorage(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = Compute<T>; // f32 for f32 and the halves, f64 for f64
    Acc *state = reinterpret_cast<Acc *>(c.outputs[1].data);
    if constexpr (sizeof(T) < sizeof(float)) {
      auto *half = static_cast<const HalfState *>(c.prepared);
      if (!half) return sdError("LinearAttention on CUDA: cannot allocate its f32 state");
      state = half->state;
    }
    linearAttentionKernel<T, Acc><<<unsigned(blocks), threads, 0, streamOf(c)>>>(
        *g, c.inputs[0].as<T>(), c.inputs[1].as<T>(), c.inputs[2].as<T>(), static_cast<const T *>(operand(3)),
        static_cast<const T *>(operand(4)), static_cast<const T *>(operand(5)), c.outputs[0].as<T>(),
        c.outputs[1].as<T>(), state);
    return launchStatus("LinearAttention");
  });
}

} // namespace

void registerLinearAttentionKernels() {
  registerKernel("LinearAttention", LinearAttentionKernel, floatStorage(), prepareLinearAttention);
}

} // namespace sd::cuda
