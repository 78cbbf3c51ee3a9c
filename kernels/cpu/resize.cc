// CPU kernels for Resize: nearest, (multi)linear and cubic interpolation (also
// antialiased) with every ONNX coordinate transformation mode. Each axis is
// resolved to taps (input index, weight) once (sd/ops/resize_taps.h, shared
// with the CUDA kernel); the output is a separable weighted sum. Its
// gradient, ResizeGrad, applies the taps' adjoint axis by axis.
#include "cpu_util.h"
#include "sd/ops/resize_taps.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace sd::cpu {
namespace {

// Every axis's taps from `in` to `out`, with the step's roi (input 1) and
// scales (input 2): Resize's, and its gradient's the other way.
Status tapsOf(const KernelContext &c, const Dims &in, const Dims &out, std::vector<ResizeAxisTaps> &taps) {
  std::vector<double> scales, roi;
  if (c.hasInput(2) && c.inputs[2].data && c.inputs[2].numElements() > 0) readDoubles(c.inputs[2], scales);
  if (c.hasInput(1) && c.inputs[1].data) readDoubles(c.inputs[1], roi);
  return resizeTaps(c.attrs, in, out, roi, scales, taps);
}

Status ResizeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  const int64_t r = x.rank();
  std::vector<ResizeAxisTaps> taps;
  SD_RETURN_IF_ERROR(tapsOf(c, x.dims, y.dims, taps));
  double extrapolation = c.attrs.getFloat("extrapolation_value", 0.0);
  Dims xs = stridesOf(x.dims);
  if (r == 0) { // a scalar resizes to itself
    std::memcpy(c.outputs[0].data, x.data, x.byteSize());
    return Status::ok();
  }
  // Row by row over the last axis, rows in parallel: each row's leading-axis
  // tap combinations are resolved once, and the last axis is a contiguous
  // loop. Sums run in the order of the per-element definition (leading taps
  // outer, last-axis taps inner), so the result does not depend on the threads.
  const int64_t last = r - 1, width = y.dims[size_t(last)], n = y.numElements();
  const int64_t rows = width ? n / width : 0;
  const ResizeAxisTaps &tl = taps[size_t(last)];
  bool nearest = true; // every tap one input at weight 1: a gather
  for (const ResizeAxisTaps &t : taps) nearest = nearest && t.taps == 1;
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>();
    T *py = y.as<T>();
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width * tl.taps));
    parallelFor(c.pool, rows, grain, [&](int64_t r0, int64_t r1) {
      Dims o(static_cast<size_t>(last));
      std::vector<int> k(static_cast<size_t>(last));
      std::vector<double> acc(static_cast<size_t>(width));
      for (int64_t row = r0; row < r1; ++row) {
        T *out = py + row * width;
        bool outside = false;
        for (int64_t d = last - 1, rem = row; d >= 0; --d) {
          o[size_t(d)] = rem % y.dims[size_t(d)];
          rem /= y.dims[size_t(d)];
          outside = outside || taps[size_t(d)].outside[size_t(o[size_t(d)])];
        }
        if (outside) {
          std::fill(out, out + width, T(extrapolation));
          continue;
        }
        std::fill(k.begin(), k.end(), 0);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (;;) {
          double wl = 1;
          int64_t off = 0;
          for (int64_t d = 0; d < last; ++d) {
            const ResizeAxisTaps &t = taps[size_t(d)];
            size_t at = size_t(o[size_t(d)] * t.taps + k[size_t(d)]);
            wl *= t.weight[at];
            off += t.index[at] * xs[size_t(d)];
          }
          const T *in = px + off;
          const int64_t step = xs[size_t(last)];
          if (nearest) {
            for (int64_t j = 0; j < width; ++j)
              out[j] = tl.outside[size_t(j)] ? T(extrapolation) : in[tl.index[size_t(j)] * step];
            break;
          }
          for (int64_t j = 0; j < width; ++j)
            for (int kk = 0; kk < tl.taps; ++kk) {
              size_t at = size_t(j * tl.taps + kk);
              double w = wl * tl.weight[at];
              if (w != 0) acc[size_t(j)] += w * double(in[tl.index[at] * step]);
            }
          int64_t d = last - 1;
          for (; d >= 0; --d) {
            if (++k[size_t(d)] < taps[size_t(d)].taps) break;
            k[size_t(d)] = 0;
          }
          if (d < 0) break;
        }
        if (!nearest)
          for (int64_t j = 0; j < width; ++j)
            out[j] = tl.outside[size_t(j)] ? T(extrapolation) : T(acc[size_t(j)]);
      }
    });
    return Status::ok();
  });
}

// dx = the interpolation's adjoint applied to dy, one resized axis at a time
// (the weights are a product over the axes): each pass maps the axis from
// dy's size to x's, every element the sum of its adjoint entries in output
// order, in f64, so the result does not depend on the threads.
Status ResizeGradKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &dx = c.outputs[0];
  std::vector<ResizeAxisTaps> taps;
  SD_RETURN_IF_ERROR(tapsOf(c, dx.dims, dy.dims, taps));
  return dispatchFloat(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    Dims shape = dy.dims;
    std::vector<double> cur(size_t(dy.numElements())), next;
    for (size_t i = 0; i < cur.size(); ++i) cur[i] = double(dy.as<T>()[i]);
    for (int64_t d = dx.rank() - 1; d >= 0; --d) {
      const int64_t in = dx.dims[size_t(d)], out = shape[size_t(d)];
      ResizeAxisAdjoint adj = resizeAdjoint(taps[size_t(d)], in, out);
      if (adj.identity) continue;
      int64_t inner = 1, outer = 1;
      for (size_t k = size_t(d) + 1; k < shape.size(); ++k) inner *= shape[k];
      for (int64_t k = 0; k < d; ++k) outer *= shape[size_t(k)];
      next.assign(size_t(outer * in * inner), 0.0);
      parallelFor(c.pool, outer * in, std::max<int64_t>(1, 4096 / std::max<int64_t>(inner, 1)),
                  [&](int64_t r0, int64_t r1) {
                    for (int64_t r = r0; r < r1; ++r) {
                      const int64_t o = r / in, i = r % in;
                      double *dst = &next[size_t(r * inner)];
                      for (int64_t e = adj.start[size_t(i)]; e < adj.start[size_t(i) + 1]; ++e) {
                        const double *src = &cur[size_t((o * out + adj.from[size_t(e)]) * inner)];
                        const double w = adj.weight[size_t(e)];
                        for (int64_t j = 0; j < inner; ++j) dst[j] += w * src[j];
                      }
                    }
                  });
      cur.swap(next);
      shape[size_t(d)] = in;
    }
    T *out = dx.as<T>();
    for (size_t i = 0; i < cur.size(); ++i) out[i] = T(cur[i]);
    return Status::ok();
  });
}

} // namespace

void registerResizeKernels() {
  registerCpuKernel("Resize", ResizeKernel, TypeSet::floats());
  registerCpuKernel("ResizeGrad", ResizeGradKernel, TypeSet::floats());
}

} // namespace sd::cpu
