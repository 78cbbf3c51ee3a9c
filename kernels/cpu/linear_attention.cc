// ONNX LinearAttention (opset 27) on CPU, as onnx/reference computes it: the
// recurrence of sd/ops/math/linear_attention.h (shared with the CUDA kernel),
// every column of the state in turn at each step, the step's decay factors
// computed once for all columns. Halves run through f32 (register.cc), as the
// reference accumulates in f32.
#include "cpu_util.h"
#include "sd/ops/math/linear_attention.h"
#include <cmath>
#include <type_traits>
#include <vector>

namespace sd::cpu {
namespace {

// exp(decay) of the step being walked, one per key dim, filled before its columns.
template <typename Acc> struct DecayTable {
  const Acc *factors;
  template <typename A> A at(int64_t, int64_t, int64_t d) const { return factors[d]; }
};

template <typename T> Status linearAttention(const KernelContext &c) {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>; // f32 state, as the reference; f64 kept
  const TensorView &q = c.inputs[0], &v = c.inputs[2];
  const TensorView *past = c.hasInput(3) ? &c.inputs[3] : nullptr;
  const T *decay = c.hasInput(4) ? c.inputs[4].as<T>() : nullptr, *beta = c.hasInput(5) ? c.inputs[5].as<T>() : nullptr;
  const math::LinearAttentionShape g = math::linearAttentionShapeOf(
      c.attrs, q.dims, v.dims, decay ? c.inputs[4].dims[2] : 0, beta ? c.inputs[5].dims[2] : 0);
  const int64_t hkv = g.hkv, dk = g.dk;
  const math::LinearAttentionOperands<T> x{q.as<T>(), c.inputs[1].as<T>(), v.as<T>(), decay, beta,
                                           c.outputs[0].as<T>()};
  const math::ExpDecay<T> expDecay{decay, g.decayLast, hkv, dk};
  T *present = c.outputs[1].as<T>();
  const int64_t size = dk * g.dv;
  parallelFor(c.pool, g.batch * hkv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<Acc> state(static_cast<size_t>(size)), factors(static_cast<size_t>(dk));
    const DecayTable<Acc> table{factors.data()};
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / hkv, h = bh % hkv;
      for (int64_t i = 0; i < size; ++i) state[size_t(i)] = past ? Acc(past->as<T>()[bh * size + i]) : Acc(0);
      for (int64_t t = 0; t < g.steps; ++t) {
        if (decay)
          for (int64_t d = 0; d < dk; ++d) factors[size_t(d)] = expDecay.template at<Acc>(b * g.steps + t, h, d);
        for (int64_t m = 0; m < g.dv; ++m) math::linearAttentionStep(g, x, b, h, t, m, state.data() + m, g.dv, table);
      }
      for (int64_t i = 0; i < size; ++i) present[bh * size + i] = T(state[size_t(i)]);
    }
  });
  return Status::ok();
}

Status LinearAttentionKernel(const KernelContext &c) {
  SD_CHECK_ARG(c.outputs[1].dtype == c.inputs[0].dtype, "LinearAttention's state must have the query's type");
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) { return linearAttention<decltype(tag)>(c); });
}

} // namespace

void registerLinearAttentionKernels() {
  registerCpuKernel("LinearAttention", LinearAttentionKernel, TypeSet::floats());
}

} // namespace sd::cpu
