// CPU kernels for MaxPool (with indices), AveragePool, LpPool, the global
// pools, the max/average pool gradients and MaxUnpool, over any number of
// spatial dims.
#include "cpu_util.h"
#include "sd/ops/window_geometry.h"
#include <cmath>
#include <limits>
#include <type_traits>

namespace sd::cpu {
namespace {

enum class Mode { Max, Avg, Lp };

// Output position o (per spatial dim) of flat output index oo.
void unflatten(const WindowGeometry &g, int64_t oo, Dims &o) {
  for (int64_t d = int64_t(g.rank()) - 1; d >= 0; --d) {
    o[size_t(d)] = oo % g.out[size_t(d)];
    oo /= g.out[size_t(d)];
  }
}

// Taps of window o inside the padded input (what count_include_pad divides by).
int64_t padCountOf(const WindowGeometry &g, const Dims &o) {
  int64_t count = 1;
  for (size_t d = 0; d < g.rank(); ++d) {
    int64_t start = o[d] * g.strides[d] - g.padBegin[d];
    int64_t end = std::min(start + (g.kernel[d] - 1) * g.dilations[d] + 1, g.in[d] + g.padEnd[d]);
    count *= (end - start + g.dilations[d] - 1) / g.dilations[d];
  }
  return count;
}

// 2-D max pooling without dilation or indices: the CNN common case.
template <typename T>
void maxPool2d(ThreadPool *pool, const T *x, T *y, int64_t planes, const WindowGeometry &g) {
  int64_t H = g.in[0], W = g.in[1], OH = g.out[0], OW = g.out[1];
  parallelFor(pool, planes, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const T *src = x + p * H * W;
      T *dst = y + p * OH * OW;
      for (int64_t oh = 0; oh < OH; ++oh) {
        int64_t h0 = std::max<int64_t>(oh * g.strides[0] - g.padBegin[0], 0);
        int64_t h1 = std::min<int64_t>(oh * g.strides[0] - g.padBegin[0] + g.kernel[0], H);
        for (int64_t ow = 0; ow < OW; ++ow) {
          int64_t w0 = std::max<int64_t>(ow * g.strides[1] - g.padBegin[1], 0);
          int64_t w1 = std::min<int64_t>(ow * g.strides[1] - g.padBegin[1] + g.kernel[1], W);
          T m = std::numeric_limits<T>::lowest();
          if constexpr (std::is_floating_point_v<T>) m = -std::numeric_limits<T>::infinity();
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) m = src[h * W + w] > m ? src[h * W + w] : m;
          dst[oh * OW + ow] = m;
        }
      }
    }
  });
}

template <Mode M> Status poolKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &y = c.outputs[0];
  Dims in(x.dims.begin() + 2, x.dims.end());
  WindowGeometry g;
  SD_RETURN_IF_ERROR(resolveWindows(c.attrs, in, c.attrs.getInts("kernel_shape"), true, g));
  int64_t planes = x.dims[0] * x.dims[1], inTotal = product(g.in), outTotal = product(g.out);
  SD_CHECK_ARG(y.numElements() == planes * outTotal, "pool output size mismatch");
  bool includePad = c.attrs.getInt("count_include_pad", 0);
  double p = double(c.attrs.getInt("p", 2));
  const TensorView *idxOut = c.outputs.size() > 1 && c.outputs[1].data ? &c.outputs[1] : nullptr;
  bool colMajor = c.attrs.getInt("storage_order", 0) == 1 && g.rank() == 2;
  size_t n = g.rank();
  Dims inStr = stridesOf(g.in);
  auto dispatch = [&](auto &&fn) { return M == Mode::Max ? dispatchNumeric(x.dtype, fn) : dispatchFloat(x.dtype, fn); };
  bool plain2d = M == Mode::Max && n == 2 && !idxOut && g.dilations[0] == 1 && g.dilations[1] == 1;
  if (plain2d)
    return dispatchNumeric(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      maxPool2d<T>(c.pool, x.as<T>(), y.as<T>(), planes, g);
      return Status::ok();
    });
  return dispatch([&](auto tag) {
    using T = decltype(tag);
    parallelFor(c.pool, planes, 1, [&](int64_t p0, int64_t p1) {
      Dims o(n);
      for (int64_t pl = p0; pl < p1; ++pl) {
        const T *src = x.as<T>() + pl * inTotal;
        for (int64_t oo = 0; oo < outTotal; ++oo) {
          unflatten(g, oo, o);
          double acc = M == Mode::Max ? -std::numeric_limits<double>::infinity() : 0.0;
          int64_t count = 0, best = -1;
          int64_t kTotal = product(g.kernel);
          for (int64_t kk = 0; kk < kTotal; ++kk) {
            int64_t off = windowTapOffset(g, o, kk, inStr);
            if (off < 0) continue;
            double v = double(src[off]);
            if (M == Mode::Max) {
              if (v > acc || best < 0) { acc = v; best = off; }
            } else if (M == Mode::Avg) {
              acc += v;
            } else {
              acc += std::pow(std::abs(v), p);
            }
            ++count;
          }
          T result;
          if (M == Mode::Max) result = T(acc);
          else if (M == Mode::Avg) result = T(acc / double(std::max<int64_t>(1, includePad ? padCountOf(g, o) : count)));
          else result = T(std::pow(acc, 1.0 / p));
          y.as<T>()[pl * outTotal + oo] = result;
          if (M == Mode::Max && idxOut) {
            int64_t flat = best;
            if (colMajor && best >= 0) flat = (best % g.in[1]) * g.in[0] + best / g.in[1];
            idxOut->as<int64_t>()[pl * outTotal + oo] = pl * inTotal + flat;
          }
        }
      }
    });
    return Status::ok();
  });
}

template <Mode M> Status globalPoolKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  int64_t planes = x.dims[0] * x.dims[1], inner = x.numElements() / std::max<int64_t>(planes, 1);
  double p = double(c.attrs.getInt("p", 2));
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    // Planes in parallel (each one's sum does not depend on the threads).
    parallelFor(c.pool, planes, std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1)), [&](int64_t p0, int64_t p1) {
      for (int64_t pl = p0; pl < p1; ++pl) {
        const T *src = x.as<T>() + pl * inner;
        double acc = M == Mode::Max ? -std::numeric_limits<double>::infinity() : 0.0;
        if constexpr (M == Mode::Avg) { // in vector lanes: squeeze-and-excitation pools every block's map
#pragma omp simd reduction(+ : acc)
          for (int64_t i = 0; i < inner; ++i) acc += double(src[i]);
        } else {
          for (int64_t i = 0; i < inner; ++i) {
            if (M == Mode::Max) acc = std::max(acc, double(src[i]));
            else acc += std::pow(std::abs(double(src[i])), p);
          }
        }
        if (M == Mode::Avg) acc /= double(std::max<int64_t>(inner, 1));
        if (M == Mode::Lp) acc = std::pow(acc, 1.0 / p);
        c.outputs[0].as<T>()[pl] = T(acc);
      }
    });
    return Status::ok();
  });
}


// MaxPoolGrad(dy, x) / AveragePoolGrad(dy, x) -> dx: each output's gradient
// goes to the tap the forward picked (its first maximum) or is spread over
// the window with the forward's divisor. Planes are independent, so threads
// never add into the same element and the result is deterministic.
template <Mode M> Status poolGradKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &x = c.inputs[1], &dx = c.outputs[0];
  Dims in(x.dims.begin() + 2, x.dims.end());
  Dims kernel = c.attrs.getInts("kernel_shape");
  if (kernel.empty()) kernel = in; // the global pools
  WindowGeometry g;
  SD_RETURN_IF_ERROR(resolveWindows(c.attrs, in, kernel, true, g));
  int64_t planes = x.dims[0] * x.dims[1], inTotal = product(g.in), outTotal = product(g.out);
  SD_CHECK_ARG(dy.numElements() == planes * outTotal, "pool gradient size mismatch");
  bool includePad = c.attrs.getInt("count_include_pad", 0);
  Dims inStr = stridesOf(g.in);
  int64_t kTotal = product(g.kernel);
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    parallelFor(c.pool, planes, 1, [&](int64_t p0, int64_t p1) {
      Dims o(g.rank());
      std::vector<int64_t> taps(M == Mode::Max ? 0 : static_cast<size_t>(kTotal)); // Avg's window; Max keeps its best only
      for (int64_t pl = p0; pl < p1; ++pl) {
        const T *src = x.as<T>() + pl * inTotal, *gy = dy.as<T>() + pl * outTotal;
        T *gx = dx.as<T>() + pl * inTotal;
        std::fill(gx, gx + inTotal, T(0));
        for (int64_t oo = 0; oo < outTotal; ++oo) {
          unflatten(g, oo, o);
          int64_t count = 0, best = -1;
          T bestValue{};
          auto visit = [&](int64_t off) {
            if constexpr (M == Mode::Max) { // the first maximum (NaN never wins), as selects rather than branches
              const T v = src[off];
              const bool take = best < 0 || v > bestValue;
              best = take ? off : best;
              bestValue = take ? v : bestValue;
            } else {
              taps[size_t(count++)] = off;
            }
          };
          if (g.rank() == 2) { // the taps inside the image in windowTapOffset's order, without its divisions
            for (int64_t kh = 0; kh < g.kernel[0]; ++kh) {
              const int64_t ih = o[0] * g.strides[0] - g.padBegin[0] + kh * g.dilations[0];
              if (ih < 0 || ih >= g.in[0]) continue;
              for (int64_t kw = 0; kw < g.kernel[1]; ++kw) {
                const int64_t iw = o[1] * g.strides[1] - g.padBegin[1] + kw * g.dilations[1];
                if (iw >= 0 && iw < g.in[1]) visit(ih * g.in[1] + iw);
              }
            }
          } else {
            for (int64_t kk = 0; kk < kTotal; ++kk)
              if (int64_t off = windowTapOffset(g, o, kk, inStr); off >= 0) visit(off);
          }
          if (M == Mode::Max) {
            if (best >= 0) gx[best] += gy[oo];
            continue;
          }
          T share = gy[oo] / T(std::max<int64_t>(1, includePad ? padCountOf(g, o) : count));
          for (int64_t t = 0; t < count; ++t) gx[taps[size_t(t)]] += share;
        }
      }
    });
    return Status::ok();
  });
}

// MaxUnpool: each X value goes where MaxPool found it. Indices are flat over
// the unpooled shape the attributes imply, [N, C, (in-1)*stride - pads + k];
// output_shape may only pad that shape at the end of each dim.
Status MaxUnpoolKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  Dims kernel = c.attrs.getInts("kernel_shape"), strides = c.attrs.getInts("strides"), pads = c.attrs.getInts("pads");
  size_t k = kernel.size();
  Dims inferred = {x.dims[0], x.dims[1]};
  for (size_t d = 0; d < k; ++d)
    inferred.push_back((x.dims[d + 2] - 1) * (strides.empty() ? 1 : strides[d]) -
                       (pads.empty() ? 0 : pads[d] + pads[d + k]) + kernel[d]);
  for (size_t d = 0; d < inferred.size(); ++d)
    SD_CHECK_ARG(inferred[d] <= o.dims[d], "MaxUnpool output_shape ", formatDims(o.dims),
                 " is smaller than the unpooled shape ", formatDims(inferred));
  std::vector<int64_t> idx;
  SD_CHECK_ARG(readIntegers(c.inputs[1], idx) && int64_t(idx.size()) == x.numElements(),
               "MaxUnpool indices must be integers shaped like X");
  int64_t total = product(inferred);
  Dims outStr = stridesOf(o.dims);
  return dispatchBytes(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    T *po = o.as<T>();
    std::fill(po, po + o.numElements(), T{});
    for (size_t e = 0; e < idx.size(); ++e) {
      int64_t flat = idx[e], off = 0;
      SD_CHECK_ARG(flat >= 0 && flat < total, "MaxUnpool index ", flat, " out of range [0, ", total, ")");
      for (int64_t d = int64_t(inferred.size()) - 1; d >= 0; --d) {
        off += (flat % inferred[size_t(d)]) * outStr[size_t(d)];
        flat /= inferred[size_t(d)];
      }
      po[off] = x.as<T>()[e];
    }
    return Status::ok();
  });
}

} // namespace

void registerPoolKernels() {
  registerCpuKernel("MaxUnpool", MaxUnpoolKernel, TypeSet::all());
  registerCpuKernel("MaxPool", poolKernel<Mode::Max>, TypeSet::numeric());
  registerCpuKernel("AveragePool", poolKernel<Mode::Avg>, TypeSet::floats());
  registerCpuKernel("LpPool", poolKernel<Mode::Lp>, TypeSet::floats());
  registerCpuKernel("GlobalMaxPool", globalPoolKernel<Mode::Max>, TypeSet::floats());
  registerCpuKernel("GlobalAveragePool", globalPoolKernel<Mode::Avg>, TypeSet::floats());
  registerCpuKernel("GlobalLpPool", globalPoolKernel<Mode::Lp>, TypeSet::floats());
  registerCpuKernel("MaxPoolGrad", poolGradKernel<Mode::Max>, TypeSet::floats());
  registerCpuKernel("AveragePoolGrad", poolGradKernel<Mode::Avg>, TypeSet::floats());
}

} // namespace sd::cpu
