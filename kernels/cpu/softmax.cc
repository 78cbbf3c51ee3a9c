// CPU kernels for Softmax, LogSoftmax and Hardmax along one axis.
#include "cpu_util.h"
#include "sd/ops/index_geometry.h"
#include "vecmath.h"
#include <cmath>

namespace sd::cpu {
namespace {

// Splits x around `axis` into [outer, n, inner] (index_geometry.h).
void splitAxis(const KernelContext &c, int64_t &outer, int64_t &n, int64_t &inner) {
  AxisSplit s = softmaxSplit(c.inputs[0].dims, c.attrs);
  outer = s.outer;
  n = s.n;
  inner = s.inner;
}

// The common case, float rows along the last axis, through the vector loops.
template <int Mode> Status softmaxRowsF32(const KernelContext &c, int64_t rows, int64_t n) {
  const float *px = c.inputs[0].as<float>();
  float *py = c.outputs[0].as<float>();
  parallelFor(c.pool, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float *x = px + r * n;
      float *y = py + r * n;
      if (Mode == 0) {
        vsoftmaxRow(x, y, n);
        continue;
      }
      float mx = vmax(x, n);
      if (!std::isfinite(mx)) mx = 0; // all -inf rows: exp gives 0s, sum 0, as libm would
      float ls = std::log(vexpShiftSum(x, y, n, mx)) + mx;
      for (int64_t j = 0; j < n; ++j) y[j] = x[j] - ls;
    }
  });
  return Status::ok();
}

template <int Mode> Status softmaxKernel(const KernelContext &c) {
  int64_t outer, n, inner;
  splitAxis(c, outer, n, inner);
  if (Mode != 2 && inner == 1 && c.inputs[0].dtype == DType::F32) return softmaxRowsF32<Mode>(c, outer, n);
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = c.inputs[0].as<T>();
    T *py = c.outputs[0].as<T>();
    parallelFor(c.pool, outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)),
                [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        int64_t o = r / inner, i = r % inner;
        const T *x = px + o * n * inner + i;
        T *y = py + o * n * inner + i;
        T mx = -INFINITY;
        int64_t arg = 0;
        for (int64_t j = 0; j < n; ++j)
          if (x[j * inner] > mx) { mx = x[j * inner]; arg = j; }
        if (Mode == 2) {
          for (int64_t j = 0; j < n; ++j) y[j * inner] = T(j == arg);
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          T ev = std::exp(x[j * inner] - mx);
          if (Mode == 0) y[j * inner] = ev;
          sum += double(ev);
        }
        if (Mode == 0) {
          T inv = T(1.0 / sum);
          for (int64_t j = 0; j < n; ++j) y[j * inner] *= inv;
        } else {
          T ls = T(std::log(sum));
          for (int64_t j = 0; j < n; ++j) y[j * inner] = x[j * inner] - mx - ls;
        }
      }
    });
    return Status::ok();
  });
}


// Backward of Softmax (Mode 0, from its output y: dx = y * (dy - sum(dy * y)))
// and LogSoftmax (Mode 1, from its output y: dx = dy - exp(y) * sum(dy)).
template <int Mode> Status softmaxGradKernel(const KernelContext &c) {
  int64_t outer, n, inner;
  splitAxis(c, outer, n, inner);
  return dispatchFloat(c.inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *pdy = c.inputs[0].as<T>(), *py = c.inputs[1].as<T>();
    T *pdx = c.outputs[0].as<T>();
    parallelFor(c.pool, outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)),
                [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        int64_t base = (r / inner) * n * inner + r % inner;
        const T *dy = pdy + base, *y = py + base;
        T *dx = pdx + base;
        double s = 0;
        for (int64_t j = 0; j < n; ++j) s += Mode == 0 ? double(dy[j * inner]) * double(y[j * inner]) : double(dy[j * inner]);
        for (int64_t j = 0; j < n; ++j) {
          T g = dy[j * inner];
          dx[j * inner] = Mode == 0 ? T(y[j * inner] * (g - T(s))) : T(g - std::exp(y[j * inner]) * T(s));
        }
      }
    });
    return Status::ok();
  });
}

} // namespace

void registerSoftmaxKernels() {
  registerCpuKernel("Softmax", softmaxKernel<0>, TypeSet::floats());
  registerCpuKernel("LogSoftmax", softmaxKernel<1>, TypeSet::floats());
  registerCpuKernel("Hardmax", softmaxKernel<2>, TypeSet::floats());
  registerCpuKernel("SoftmaxGrad", softmaxGradKernel<0>, TypeSet::floats());
  registerCpuKernel("LogSoftmaxGrad", softmaxGradKernel<1>, TypeSet::floats());
}

} // namespace sd::cpu
