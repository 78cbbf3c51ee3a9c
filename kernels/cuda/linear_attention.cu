// CUDA kernel of ONNX LinearAttention (opset 27; see
// kernels/cpu/linear_attention.cc): the recurrence of
// sd/ops/math/linear_attention.h, the CPU's own math. One block per (batch,
// kv head), one thread per state column: a column's steps touch that column
// alone, so the threads walk the sequence with no barrier, each summing over
// d_k in the CPU's order. The state lives in the `present` result (f32/f64)
// or, for halves, in an f32 scratch allocated when the session is created, as
// the CPU keeps an f32 state for them.
#include "cuda_util.cuh"
#include "sd/ops/math/linear_attention.h"
#include <cmath>
#include <memory>

namespace sd::cuda {
namespace {

using LinearAttentionGeometry = math::LinearAttentionShape;

template <typename T, typename Acc>
__global__ void linearAttentionKernel(LinearAttentionGeometry g, math::LinearAttentionOperands<T> x, const T *past,
                                      T *present, Acc *state) {
  const int64_t bh = blockIdx.x, b = bh / g.hkv, h = bh % g.hkv, size = g.dk * g.dv;
  const math::ExpDecay<T> expDecay{x.decay, g.decayLast, g.hkv, g.dk};
  Acc *s = state + bh * size;
  for (int64_t m = threadIdx.x; m < g.dv; m += blockDim.x) {
    for (int64_t d = 0; d < g.dk; ++d) s[d * g.dv + m] = past ? Acc(past[bh * size + d * g.dv + m]) : Acc(0);
    for (int64_t t = 0; t < g.steps; ++t) math::linearAttentionStep(g, x, b, h, t, m, s + m, g.dv, expDecay);
    if (static_cast<void *>(s) != static_cast<void *>(present + bh * size))
      for (int64_t d = 0; d < g.dk; ++d) present[bh * size + d * g.dv + m] = T(s[d * g.dv + m]);
  }
}

StatusOr<LinearAttentionGeometry> geometryOf(const KernelContext &c) {
  const TensorView &q = c.inputs[0], &v = c.inputs[2];
  const int64_t hq = c.attrs.getInt("q_num_heads", 0), hkv = c.attrs.getInt("kv_num_heads", 0);
  if (q.rank() != 3 || v.rank() != 3 || hq <= 0 || hkv <= 0 || hq % hkv)
    return sdError("LinearAttention on CUDA takes 3-D q, k, v and q_num_heads a multiple of kv_num_heads");
  return math::linearAttentionShapeOf(c.attrs, q.dims, v.dims, c.hasInput(4) ? c.inputs[4].dims[2] : 0,
                                      c.hasInput(5) ? c.inputs[5].dims[2] : 0);
}

// The f32 state of a half-precision LinearAttention, one per step.
std::shared_ptr<const void> prepareLinearAttention(const PrepareContext &p) {
  const DType t = p.kernel.inputs[0].dtype;
  if (t != DType::F16 && t != DType::BF16) return nullptr;
  return deviceScratch(size_t(p.kernel.outputs[1].numElements()) * sizeof(float));
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
      const DeviceScratch *half = scratchOf(c);
      if (!half) return sdError("LinearAttention on CUDA: cannot allocate its f32 state");
      state = half->as<float>();
    }
    const math::LinearAttentionOperands<T> x{c.inputs[0].as<T>(),
                                             c.inputs[1].as<T>(),
                                             c.inputs[2].as<T>(),
                                             static_cast<const T *>(operand(4)),
                                             static_cast<const T *>(operand(5)),
                                             c.outputs[0].as<T>()};
    linearAttentionKernel<T, Acc><<<unsigned(blocks), threads, 0, streamOf(c)>>>(
        *g, x, static_cast<const T *>(operand(3)), c.outputs[1].as<T>(), state);
    return launchStatus("LinearAttention");
  });
}

} // namespace

void registerLinearAttentionKernels() {
  registerKernel("LinearAttention", LinearAttentionKernel, floatStorage(), prepareLinearAttention);
}

} // namespace sd::cuda
