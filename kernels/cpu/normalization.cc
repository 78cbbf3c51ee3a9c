// CPU kernels for LayerNormalization, RMSNormalization, BatchNormalization (inference),
// InstanceNormalization, LpNormalization, MeanVarianceNormalization and LRN.
#include "cpu_util.h"
#include "sd/ops/math/classic_norms.h"
#include "sd/ops/index_geometry.h"
#include "vecmath.h"
#include <cmath>

namespace sd::cpu {
namespace {


Status LayerNormKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  const NormRows rows = normRows(x.dims, c.attrs);
  const int64_t axis = rows.axis, outer = rows.outer, n = rows.n;
  const double eps = rows.eps;
  const TensorView &scale = c.inputs[1];
  bool hasBias = c.hasInput(2) && c.inputs[2].data;
  Dims normDims(x.dims.begin() + axis, x.dims.end());
  Dims ss = broadcastStrides(scale.dims, normDims);
  Dims bs = hasBias ? broadcastStrides(c.inputs[2].dims, normDims) : Dims{};
  bool flatScale = scale.numElements() == n;
  bool flatBias = !hasBias || c.inputs[2].numElements() == n;
  // The transformer case: f32 rows with per-feature scale and bias.
  bool statsF32 = true;
  for (size_t k = 1; k < c.outputs.size(); ++k) statsF32 = statsF32 && (!c.outputs[k].data || c.outputs[k].dtype == DType::F32);
  if (x.dtype == DType::F32 && flatScale && flatBias && statsF32) {
    const float *px = x.as<float>(), *g = scale.as<float>(), *bb = hasBias ? c.inputs[2].as<float>() : nullptr;
    float *py = c.outputs[0].as<float>();
    float *meanOut = c.outputs.size() > 1 && c.outputs[1].data ? c.outputs[1].as<float>() : nullptr;
    float *rstdOut = c.outputs.size() > 2 && c.outputs[2].data ? c.outputs[2].as<float>() : nullptr;
    parallelFor(c.pool, outer, std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)), [&](int64_t b0, int64_t b1) {
      for (int64_t r = b0; r < b1; ++r) {
        float mean, rstd;
        vlayerNormRow(px + r * n, g, bb, py + r * n, n, float(eps), mean, rstd);
        if (meanOut) meanOut[r] = mean;
        if (rstdOut) rstdOut[r] = rstd;
      }
    });
    return Status::ok();
  }
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>(), *g = scale.as<T>(), *bb = hasBias ? c.inputs[2].as<T>() : nullptr;
    T *py = c.outputs[0].as<T>();
    auto *meanOut = c.outputs.size() > 1 && c.outputs[1].data ? &c.outputs[1] : nullptr;
    auto *rstdOut = c.outputs.size() > 2 && c.outputs[2].data ? &c.outputs[2] : nullptr;
    parallelFor(c.pool, outer, std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)),
                [&](int64_t b, int64_t e) {
      Dims idx(normDims.size());
      for (int64_t r = b; r < e; ++r) {
        const T *xr = px + r * n;
        T *yr = py + r * n;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < n; ++j) mean += double(xr[j]);
        mean /= double(n);
        for (int64_t j = 0; j < n; ++j) {
          double d = double(xr[j]) - mean;
          var += d * d;
        }
        var /= double(n);
        double rstd = 1.0 / std::sqrt(var + eps);
        if (flatScale && flatBias) {
          for (int64_t j = 0; j < n; ++j)
            yr[j] = T((double(xr[j]) - mean) * rstd * double(g[j]) + (bb ? double(bb[j]) : 0.0));
        } else {
          std::fill(idx.begin(), idx.end(), 0);
          for (int64_t j = 0; j < n; ++j) {
            int64_t so = 0, bo = 0;
            for (size_t d = 0; d < idx.size(); ++d) {
              so += idx[d] * ss[d];
              if (bb) bo += idx[d] * bs[d];
            }
            yr[j] = T((double(xr[j]) - mean) * rstd * double(g[so]) + (bb ? double(bb[bo]) : 0.0));
            for (int64_t d = int64_t(idx.size()) - 1; d >= 0; --d) {
              if (++idx[size_t(d)] < normDims[size_t(d)]) break;
              idx[size_t(d)] = 0;
            }
          }
        }
        auto store = [&](const TensorView *t, double v) {
          if (!t) return;
          if (t->dtype == DType::F32) t->as<float>()[r] = float(v);
          else if (t->dtype == DType::F64) t->as<double>()[r] = v;
        };
        store(meanOut, mean);
        store(rstdOut, rstd);
      }
    });
    return Status::ok();
  });
}

Status BatchNormKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  double eps = c.attrs.getFloat("epsilon", 1e-5);
  int64_t n = x.dims[0], ch = x.dims[1], spatial = x.numElements() / std::max<int64_t>(n * ch, 1);
  for (int i = 1; i <= 4; ++i)
    SD_CHECK_ARG(c.inputs[size_t(i)].numElements() == ch, "BatchNormalization parameter ", i,
                 " must have ", ch, " elements");
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *sc = c.inputs[1].as<T>(), *bi = c.inputs[2].as<T>(), *mu = c.inputs[3].as<T>(),
            *va = c.inputs[4].as<T>();
    const T *px = x.as<T>();
    T *py = c.outputs[0].as<T>();
    for (int64_t b = 0; b < n; ++b)
      for (int64_t k = 0; k < ch; ++k) {
        double a = double(sc[k]) / std::sqrt(double(va[k]) + eps);
        double s = double(bi[k]) - double(mu[k]) * a;
        const T *xr = px + (b * ch + k) * spatial;
        T *yr = py + (b * ch + k) * spatial;
        for (int64_t j = 0; j < spatial; ++j) yr[j] = T(double(xr[j]) * a + s);
      }
    return Status::ok();
  });
}

Status InstanceNormKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  double eps = c.attrs.getFloat("epsilon", 1e-5);
  int64_t n = x.dims[0], ch = x.dims[1], spatial = x.numElements() / std::max<int64_t>(n * ch, 1);
  SD_CHECK_ARG(c.inputs[1].numElements() == ch && c.inputs[2].numElements() == ch,
               "InstanceNormalization scale and bias must have ", ch, " elements");
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *sc = c.inputs[1].as<T>(), *bi = c.inputs[2].as<T>(), *px = x.as<T>();
    T *py = c.outputs[0].as<T>();
    for (int64_t r = 0; r < n * ch; ++r) {
      const T *xr = px + r * spatial;
      T *yr = py + r * spatial;
      double mean = 0, var = 0;
      for (int64_t j = 0; j < spatial; ++j) mean += double(xr[j]);
      mean /= double(spatial);
      for (int64_t j = 0; j < spatial; ++j) var += (double(xr[j]) - mean) * (double(xr[j]) - mean);
      var /= double(spatial);
      double a = double(sc[r % ch]) / std::sqrt(var + eps);
      for (int64_t j = 0; j < spatial; ++j) yr[j] = T((double(xr[j]) - mean) * a + double(bi[r % ch]));
    }
    return Status::ok();
  });
}

// LRN, LpNormalization and MeanVarianceNormalization: sd/ops/math/classic_norms.h.
Status LrnKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  double alpha = c.attrs.getFloat("alpha", 1e-4), beta = c.attrs.getFloat("beta", 0.75),
         bias = c.attrs.getFloat("bias", 1.0);
  int64_t size = c.attrs.getInt("size", 0);
  int64_t n = x.dims[0], ch = x.dims[1], spatial = x.numElements() / std::max<int64_t>(n * ch, 1);
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>();
    T *py = c.outputs[0].as<T>();
    parallelFor(c.pool, n * ch, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t b = r / ch, k = r % ch;
        for (int64_t j = 0; j < spatial; ++j)
          py[r * spatial + j] = T(math::lrnAt(k, ch, size, alpha, beta, bias,
                                              [&](int64_t q) { return double(px[(b * ch + q) * spatial + j]); }));
      }
    });
    return Status::ok();
  });
}

Status LpNormKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  int64_t axis = c.attrs.getInt("axis", -1), p = c.attrs.getInt("p", 2);
  if (axis < 0) axis += x.rank();
  SD_CHECK_ARG(p == 1 || p == 2, "LpNormalization p must be 1 or 2");
  AxisExtent ext = extentAround(x.dims, axis);
  int64_t outer = ext.outer, n = ext.len, inner = ext.inner;
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>();
    T *py = c.outputs[0].as<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const T *line = px + o * n * inner + i;
        T *out = py + o * n * inner + i;
        math::lpNormalizeLine(n, p, [&](int64_t j) { return double(line[j * inner]); },
                              [&](int64_t j, double v) { out[j * inner] = T(v); });
      }
    return Status::ok();
  });
}

Status MvnKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  std::vector<int64_t> axes = c.attrs.getInts("axes");
  if (axes.empty()) axes = {0, 2, 3};
  std::vector<bool> red(size_t(x.rank()), false);
  for (int64_t a : axes) red[size_t(a < 0 ? a + x.rank() : a)] = true;
  Dims xs = stridesOf(x.dims);
  Dims outD, outS, redD, redS;
  for (int64_t d = 0; d < x.rank(); ++d) {
    (red[size_t(d)] ? redD : outD).push_back(x.dims[size_t(d)]);
    (red[size_t(d)] ? redS : outS).push_back(xs[size_t(d)]);
  }
  int64_t nOut = product(outD), nRed = product(redD);
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>();
    T *py = c.outputs[0].as<T>();
    std::vector<int64_t> offs(static_cast<size_t>(nRed));
    for (int64_t i = 0; i < nOut; ++i) {
      int64_t base = 0, rem = i;
      for (int64_t d = int64_t(outD.size()) - 1; d >= 0; --d) {
        base += (rem % outD[size_t(d)]) * outS[size_t(d)];
        rem /= outD[size_t(d)];
      }
      for (int64_t j = 0; j < nRed; ++j) {
        int64_t off = base, r2 = j;
        for (int64_t d = int64_t(redD.size()) - 1; d >= 0; --d) {
          off += (r2 % redD[size_t(d)]) * redS[size_t(d)];
          r2 /= redD[size_t(d)];
        }
        offs[size_t(j)] = off;
      }
      math::meanVarianceNormalize(nRed, [&](int64_t j) { return double(px[offs[size_t(j)]]); },
                                  [&](int64_t j, double v) { py[offs[size_t(j)]] = T(v); });
    }
    return Status::ok();
  });
}

// dx = accumulate + dx, one rounded addition per element as the Add kernel
// computes it (dx already rounded to its type; the output is never the
// accumulate operand's buffer: the step is not elementwise, so it gets its own).
template <typename T> void accumulateRow(const T *acc, T *dx, int64_t n) {
  if constexpr (std::is_floating_point_v<T>)
    for (int64_t j = 0; j < n; ++j) dx[j] = acc[j] + dx[j];
}

// The narrowed copy of dx (narrow_type, sd-norm-grad-sum): output `index`,
// f32 x only. On the CPU it arrives as an f32 stand-in that runKernel rounds
// afterwards as the Cast kernel rounds; null when the step has none.
Status narrowedOutput(const KernelContext &c, size_t index, const char *op, float *&out) {
  out = nullptr;
  if (c.outputs.size() <= index || !c.outputs[index].data) return Status::ok();
  if (c.inputs[1].dtype != DType::F32 || c.outputs[index].dtype != DType::F32)
    return sdError(op, ": a narrowed dx needs an f32 x");
  out = c.outputs[index].as<float>();
  return Status::ok();
}

template <typename T> void copyRow(const T *dx, float *narrow, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    if (narrow) std::copy(dx, dx + n, narrow);
}

// dy's rows: the grad operand's, or with further summands (operands 4..,
// sd-norm-grad-sum) their sum, added left to right as the Adds it replaces
// added, one rounded addition of T each (half summands arrive widened to f32).
template <typename T> class DyRows {
public:
  DyRows(const KernelContext &c, int64_t n) : n_(n) {
    terms_.push_back(c.inputs[0].as<T>());
    for (size_t i = 4; i < c.inputs.size(); ++i) terms_.push_back(c.inputs[i].as<T>());
  }
  // Row r, summed into `scratch` (the calling thread's) when there are several summands.
  const T *row(int64_t r, std::vector<T> &scratch) const {
    if (terms_.size() == 1) return terms_[0] + r * n_;
    scratch.resize(size_t(n_));
    for (int64_t j = 0; j < n_; ++j) {
      T sum = terms_[0][r * n_ + j];
      for (size_t i = 1; i < terms_.size(); ++i) sum = sum + terms_[i][r * n_ + j];
      scratch[size_t(j)] = sum;
    }
    return scratch.data();
  }

private:
  std::vector<const T *> terms_;
  int64_t n_;
};

// Backward of LayerNormalization over rows of n normalized elements, with
// mean and rstd recomputed from x (a pass over x the gradient reads anyway,
// instead of keeping two statistics per row alive from the forward):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * scale
//   dscale = sum_rows dy * xhat, dbias = sum_rows dy
// Row blocks of fixed size keep partial sums, added in block order, so the
// result does not depend on the thread count. With an accumulate operand
// (sd-norm-grad-sum) dx is rounded first and then added to it, as the Add
// it replaces did; dy may come as several summands (DyRows).
Status LayerNormGradKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[1], &scale = c.inputs[2];
  const NormRows rows = normRows(x.dims, c.attrs);
  const int64_t outer = rows.outer, n = rows.n;
  const double eps = rows.eps;
  SD_CHECK_ARG(scale.numElements() == n, "LayerNormalizationGrad needs a scale covering the normalized axes");
  SD_RETURN_IF_ERROR(checkNormGradSums(c.inputs, "LayerNormalizationGrad"));
  constexpr int64_t kBlock = 32;
  int64_t blocks = (outer + kBlock - 1) / kBlock;
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>(), *g = scale.as<T>();
    const DyRows<T> dyRows(c, n);
    T *pdx = c.outputs[0].as<T>();
    const T *pacc = c.hasInput(3) ? c.inputs[3].as<T>() : nullptr;
    float *pnarrow = nullptr;
    SD_RETURN_IF_ERROR(narrowedOutput(c, 3, "LayerNormalizationGrad", pnarrow));
    std::vector<double> partial(size_t(blocks * n * 2), 0.0);
    parallelFor(c.pool, blocks, 1, [&](int64_t b0, int64_t b1) {
      std::vector<double> xhat(static_cast<size_t>(n));
      std::vector<T> dySum;
      for (int64_t blk = b0; blk < b1; ++blk) {
        double *ds = partial.data() + blk * n * 2, *db = ds + n;
        for (int64_t r = blk * kBlock; r < std::min(outer, (blk + 1) * kBlock); ++r) {
          const T *xr = px + r * n, *dyr = dyRows.row(r, dySum);
          double mean = 0, var = 0;
          for (int64_t j = 0; j < n; ++j) mean += double(xr[j]);
          mean /= double(n);
          for (int64_t j = 0; j < n; ++j) var += (double(xr[j]) - mean) * (double(xr[j]) - mean);
          double rstd = 1.0 / std::sqrt(var / double(n) + eps);
          double mg = 0, mgx = 0;
          for (int64_t j = 0; j < n; ++j) {
            xhat[size_t(j)] = (double(xr[j]) - mean) * rstd;
            double gj = double(dyr[j]) * double(g[j]);
            mg += gj;
            mgx += gj * xhat[size_t(j)];
            ds[j] += double(dyr[j]) * xhat[size_t(j)];
            db[j] += double(dyr[j]);
          }
          mg /= double(n);
          mgx /= double(n);
          T *dxr = pdx + r * n;
          for (int64_t j = 0; j < n; ++j)
            dxr[j] = T(rstd * (double(dyr[j]) * double(g[j]) - mg - xhat[size_t(j)] * mgx));
          if (pacc) accumulateRow(pacc + r * n, dxr, n);
          copyRow(dxr, pnarrow ? pnarrow + r * n : nullptr, n);
        }
      }
    });
    // With param_grads = 0 they are left unwritten. On the CPU their sums ride
    // along in the row loop; only the GPU saves a pass.
    T *dscale = writesNormParamGrad(c.attrs, c.outputs, 1) ? c.outputs[1].as<T>() : nullptr;
    T *dbias = writesNormParamGrad(c.attrs, c.outputs, 2) ? c.outputs[2].as<T>() : nullptr;
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, b = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        s += partial[size_t(blk * n * 2 + j)];
        b += partial[size_t(blk * n * 2 + n + j)];
      }
      if (dscale) dscale[j] = T(s);
      if (dbias) dbias[j] = T(b);
    }
    return Status::ok();
  });
}

// RMSNormalization over rows of n elements (axis..end): y = x * rstd * scale,
// rstd = 1/sqrt(mean(x^2) + eps), the statistic in f64 as LayerNorm's.
Status RmsNormKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &scale = c.inputs[1];
  const NormRows rows = normRows(x.dims, c.attrs);
  const int64_t axis = rows.axis, outer = rows.outer, n = rows.n;
  const double eps = rows.eps;
  Dims normDims(x.dims.begin() + axis, x.dims.end());
  Dims ss = broadcastStrides(scale.dims, normDims);
  if (x.dtype == DType::F32 && scale.dtype == DType::F32 && scale.numElements() == n) { // the transformer case
    const float *px = x.as<float>(), *g = scale.as<float>();
    float *py = c.outputs[0].as<float>();
    parallelFor(c.pool, outer, std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) vrmsNormRow(px + r * n, g, py + r * n, n, float(eps));
    });
    return Status::ok();
  }
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>(), *g = scale.as<T>();
    T *py = c.outputs[0].as<T>();
    parallelFor(c.pool, outer, std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
      Dims idx(normDims.size());
      for (int64_t r = b; r < e; ++r) {
        const T *xr = px + r * n;
        T *yr = py + r * n;
        double ms = 0;
        for (int64_t j = 0; j < n; ++j) ms += double(xr[j]) * double(xr[j]);
        double rstd = 1.0 / std::sqrt(ms / double(std::max<int64_t>(n, 1)) + eps);
        std::fill(idx.begin(), idx.end(), 0);
        for (int64_t j = 0; j < n; ++j) {
          int64_t so = 0;
          for (size_t d = 0; d < idx.size(); ++d) so += idx[d] * ss[d];
          yr[j] = T(double(xr[j]) * rstd * double(g[so]));
          for (int64_t d = int64_t(idx.size()) - 1; d >= 0; --d) {
            if (++idx[size_t(d)] < normDims[size_t(d)]) break;
            idx[size_t(d)] = 0;
          }
        }
      }
    });
    return Status::ok();
  });
}

// Backward of RMSNormalization, rstd recomputed from x:
//   dx = rstd * (g - xhat * mean(g * xhat)), g = dy * scale, xhat = x * rstd;
//   dscale = sum over rows of dy * xhat, in fixed row blocks added in order.
Status RmsNormGradKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[1], &scale = c.inputs[2];
  const NormRows rows = normRows(x.dims, c.attrs);
  const int64_t outer = rows.outer, n = rows.n;
  const double eps = rows.eps;
  SD_CHECK_ARG(scale.numElements() == n, "RMSNormalizationGrad needs a scale covering the normalized axes");
  SD_RETURN_IF_ERROR(checkNormGradSums(c.inputs, "RMSNormalizationGrad"));
  constexpr int64_t kBlock = 32;
  int64_t blocks = (outer + kBlock - 1) / kBlock;
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>(), *g = scale.as<T>();
    const DyRows<T> dyRows(c, n);
    T *pdx = c.outputs[0].as<T>();
    const T *pacc = c.hasInput(3) ? c.inputs[3].as<T>() : nullptr;
    float *pnarrow = nullptr;
    SD_RETURN_IF_ERROR(narrowedOutput(c, 2, "RMSNormalizationGrad", pnarrow));
    std::vector<double> partial(size_t(blocks * n), 0.0);
    parallelFor(c.pool, blocks, 1, [&](int64_t b0, int64_t b1) {
      std::vector<T> dySum;
      for (int64_t blk = b0; blk < b1; ++blk) {
        double *ds = partial.data() + blk * n;
        if constexpr (std::is_same_v<T, float>) { // f32 rows with the row loops vectorized
          if (scale.dtype == DType::F32) {
            for (int64_t r = blk * kBlock; r < std::min(outer, (blk + 1) * kBlock); ++r) {
              vrmsNormGradRow(px + r * n, dyRows.row(r, dySum), g, pdx + r * n, ds, n, float(eps));
              if (pacc) accumulateRow(pacc + r * n, pdx + r * n, n);
              copyRow(pdx + r * n, pnarrow ? pnarrow + r * n : nullptr, n);
            }
            continue;
          }
        }
        for (int64_t r = blk * kBlock; r < std::min(outer, (blk + 1) * kBlock); ++r) {
          const T *xr = px + r * n, *dyr = dyRows.row(r, dySum);
          double ms = 0;
          for (int64_t j = 0; j < n; ++j) ms += double(xr[j]) * double(xr[j]);
          double rstd = 1.0 / std::sqrt(ms / double(std::max<int64_t>(n, 1)) + eps), mgx = 0;
          for (int64_t j = 0; j < n; ++j) {
            double xhat = double(xr[j]) * rstd;
            mgx += double(dyr[j]) * double(g[j]) * xhat;
            ds[j] += double(dyr[j]) * xhat;
          }
          mgx /= double(std::max<int64_t>(n, 1));
          T *dxr = pdx + r * n;
          for (int64_t j = 0; j < n; ++j)
            dxr[j] = T(rstd * (double(dyr[j]) * double(g[j]) - double(xr[j]) * rstd * mgx));
          if (pacc) accumulateRow(pacc + r * n, dxr, n);
          copyRow(dxr, pnarrow ? pnarrow + r * n : nullptr, n);
        }
      }
    });
    T *dscale = writesNormParamGrad(c.attrs, c.outputs, 1) ? c.outputs[1].as<T>() : nullptr;
    for (int64_t j = 0; dscale && j < n; ++j) {
      double s = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) s += partial[size_t(blk * n + j)];
      dscale[j] = T(s);
    }
    return Status::ok();
  });
}

} // namespace

void registerNormalizationKernels() {
  registerCpuKernel("LayerNormalization", LayerNormKernel, TypeSet::floats());
  registerCpuKernel("LayerNormalizationGrad", LayerNormGradKernel, TypeSet::floats());
  registerCpuKernel("RMSNormalization", RmsNormKernel, TypeSet::floats());
  registerCpuKernel("RMSNormalizationGrad", RmsNormGradKernel, TypeSet::floats());
  registerCpuKernel("BatchNormalization", BatchNormKernel, TypeSet::floats());
  registerCpuKernel("InstanceNormalization", InstanceNormKernel, TypeSet::floats());
  registerCpuKernel("LpNormalization", LpNormKernel, TypeSet::floats());
  registerCpuKernel("LRN", LrnKernel, TypeSet::floats());
  registerCpuKernel("MeanVarianceNormalization", MvnKernel, TypeSet::floats());
}

} // namespace sd::cpu
