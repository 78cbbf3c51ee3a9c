// CPU kernels for Conv, ConvTranspose and Conv's weight gradient. f32 2-D
// convolutions are implicit GEMMs (conv_implicit.cc) and depthwise ones direct
// (conv_depthwise.cc); the rest is im2col / col2im around a GEMM per batch
// item and group, with an unrolled 2-D im2col and a generic N-d walk.
#include "conv_depthwise.h"
#include "conv_implicit.h"
#include "conv_epilogue.h"
#include "cpu_util.h"
#include "gemm.h"
#include "sgemm.h"
#include <algorithm>
#include <memory>
#include "sd/ops/window_geometry.h"

namespace sd::cpu {
namespace {

Dims spatial(const Dims &d) { return Dims(d.begin() + 2, d.end()); }

// kernel_shape, or the weight's spatial dims when the attribute is absent.
Dims kernelShapeOf(const KernelContext &c, const TensorView &w) {
  Dims kernel = c.attrs.getInts("kernel_shape");
  return kernel.empty() ? spatial(w.dims) : kernel;
}

// Walks every (kernel offset, output position) pair and calls
// fn(row, outIndex, inputOffsetOrMinus1) for input channel-independent geometry.
template <typename F> void forEachWindowTap(const WindowGeometry &g, F &&fn) {
  size_t n = g.rank();
  int64_t kTotal = product(g.kernel), oTotal = product(g.out);
  Dims inStr = stridesOf(g.in);
  Dims o(n);
  for (int64_t kk = 0; kk < kTotal; ++kk) {
    for (int64_t oo = 0; oo < oTotal; ++oo) {
      int64_t r2 = oo;
      for (int64_t d = int64_t(n) - 1; d >= 0; --d) {
        o[size_t(d)] = r2 % g.out[size_t(d)];
        r2 /= g.out[size_t(d)];
      }
      fn(kk, oo, windowTapOffset(g, o, kk, inStr));
    }
  }
}

// 2-D im2col of output rows [oh0, oh1): col[c*K + kk, (oh - oh0)*OW + ow].
template <typename T>
void im2col2d(ThreadPool *pool, const T *x, int64_t channels, const WindowGeometry &g, int64_t oh0, int64_t oh1,
              T *col) {
  int64_t H = g.in[0], W = g.in[1], KH = g.kernel[0], KW = g.kernel[1], OW = g.out[1];
  int64_t cols = (oh1 - oh0) * OW;
  parallelFor(pool, channels, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw) {
          T *row = col + ((c * KH + kh) * KW + kw) * cols;
          for (int64_t oh = oh0; oh < oh1; ++oh) {
            int64_t ih = oh * g.strides[0] - g.padBegin[0] + kh * g.dilations[0];
            T *dst = row + (oh - oh0) * OW;
              if (ih < 0 || ih >= H) {
                std::fill(dst, dst + OW, T(0));
                continue;
              }
              const T *src = x + (c * H + ih) * W;
              int64_t off = kw * g.dilations[1] - g.padBegin[1];
              if (g.strides[1] == 1) {
                // Valid outputs: 0 <= ow + off < W; a zero border and one copy.
                int64_t lo = std::clamp<int64_t>(-off, 0, OW), hi = std::clamp<int64_t>(W - off, lo, OW);
                std::fill(dst, dst + lo, T(0));
                std::copy(src + lo + off, src + hi + off, dst + lo);
                std::fill(dst + hi, dst + OW, T(0));
              } else {
                for (int64_t ow = 0; ow < OW; ++ow) {
                  int64_t iw = ow * g.strides[1] + off;
                  dst[ow] = (iw >= 0 && iw < W) ? src[iw] : T(0);
                }
              }
          }
        }
  });
}

// col[c*K + kk, oo] = x[c, window(kk, oo)] (0 in padding).
template <typename T> void im2col(ThreadPool *pool, const T *x, int64_t channels, const WindowGeometry &g, T *col) {
  int64_t kTotal = product(g.kernel), oTotal = product(g.out), inTotal = product(g.in);
  if (g.rank() == 2) return im2col2d(pool, x, channels, g, 0, g.out[0], col);
  std::vector<int64_t> taps(size_t(kTotal * oTotal));
  forEachWindowTap(g, [&](int64_t kk, int64_t oo, int64_t off) { taps[size_t(kk * oTotal + oo)] = off; });
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t i = 0; i < kTotal * oTotal; ++i)
      col[c * kTotal * oTotal + i] = taps[size_t(i)] < 0 ? T(0) : x[c * inTotal + taps[size_t(i)]];
}

// Work items write disjoint outputs: spread them over the pool, each run
// single-threaded, or, with fewer items than threads, run them all here and
// hand fn the pool to parallelize inside each item.
template <typename F> void runWorkItems(ThreadPool *pool, int64_t items, F &&fn) {
  if (items < (pool ? pool->size() : 1)) fn(0, items, pool);
  else parallelFor(pool, items, 1, [&](int64_t i0, int64_t i1) { fn(i0, i1, nullptr); });
}

// A constant f32 weight, packed per group for the GEMM once per session
// (im2col convolutions only; depthwise ones read the weight directly).
struct PackedConvWeight {
  std::vector<PackedA> groups;
};

std::shared_ptr<const void> prepareConv(const PrepareContext &p) {
  const TensorView &x = p.kernel.inputs[0], &w = p.kernel.inputs[1];
  if (w.dtype != DType::F32 || !w.data || p.constantInputs.size() < 2 || !p.constantInputs[1]) return nullptr;
  int64_t group = p.kernel.attrs.getInt("group", 1);
  if (w.dims.size() < 3 || x.dims.size() != w.dims.size() || group < 1 || w.dims[0] % group) return nullptr;
  int64_t mg = w.dims[0] / group, cg = w.dims[1], kTotal = product(Dims(w.dims.begin() + 2, w.dims.end()));
  if (cg == 1 && w.dims.size() == 4) return nullptr; // the direct depthwise kernel
  auto packed = std::make_shared<PackedConvWeight>();
  for (int64_t gi = 0; gi < group; ++gi) {
    packed->groups.push_back(packA(false, mg, cg * kTotal, w.as<float>() + gi * mg * cg * kTotal, cg * kTotal));
    if (!packed->groups.back().data) return nullptr; // out of memory: the kernel packs per call
  }
  return packed;
}

// The conv GEMM W_g [mg x K] x cols [K x n]; f32 with the session's packed W_g.
template <typename T>
void convGemm(ThreadPool *pool, const KernelContext &c, int64_t gi, int64_t mg, int64_t n, int64_t k, const T *wg,
              const T *src, int64_t ldb, T beta, T *out, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    const auto *packed = static_cast<const PackedConvWeight *>(c.prepared);
    sgemm(pool, false, false, mg, n, k, 1.0f, wg, k, src, ldb, beta, out, ldc, nullptr,
          packed ? &packed->groups[size_t(gi)] : nullptr);
  } else {
    parallelGemm<T>(pool, false, false, mg, n, k, T(1), wg, k, src, ldb, beta, out, ldc);
  }
}

Status ConvKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &w = c.inputs[1], &y = c.outputs[0];
  int64_t group = c.attrs.getInt("group", 1);
  WindowGeometry g;
  SD_RETURN_IF_ERROR(resolveWindows(c.attrs, spatial(x.dims), kernelShapeOf(c, w), false, g));
  int64_t n = x.dims[0], cin = x.dims[1], m = w.dims[0], cg = cin / group, mg = m / group;
  int64_t kTotal = product(g.kernel), oTotal = product(g.out), inTotal = product(g.in);
  SD_CHECK_ARG(y.dims[1] == m && product(spatial(y.dims)) == oTotal && w.dims[1] == cg, "Conv shapes inconsistent");
  // FusedConv's residual (operand 3) and activation; none for Conv.
  auto epilogueOf = [&](auto tag) {
    using T = decltype(tag);
    const T *residual = c.hasInput(3) && c.inputs[3].data ? c.inputs[3].as<T>() : nullptr;
    return ConvEpilogue<T>::parse(c.attrs, residual);
  };
  if (cg == 1 && g.rank() == 2)
    return dispatchFloat(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T *bias = c.hasInput(2) && c.inputs[2].data ? c.inputs[2].as<T>() : nullptr;
      depthwiseConv2d<T>(c.pool, x.as<T>(), w.as<T>(), bias, y.as<T>(), n, cin, mg, g, epilogueOf(tag));
      return Status::ok();
    });
  if (x.dtype == DType::F32 && implicitConvApplies(g)) {
    const auto *packed = static_cast<const PackedConvWeight *>(c.prepared);
    const float *bias = c.hasInput(2) && c.inputs[2].data ? c.inputs[2].as<float>() : nullptr;
    implicitConv2d(c.pool, x.as<float>(), w.as<float>(), packed ? &packed->groups : nullptr, bias, y.as<float>(), n,
                   cin, m, group, g, epilogueOf(0.0f));
    return Status::ok();
  }
  bool direct = kTotal == 1;
  for (size_t i = 0; i < g.rank(); ++i)
    direct = direct && g.strides[i] == 1 && g.padBegin[i] == 0 && g.padEnd[i] == 0;
  int64_t units = n * group;
  // 2-D convs run in tiles of output rows whose im2col block stays in cache
  // (about 512 KiB) instead of materializing the whole column matrix. Work
  // items are (image x group x row tile); each thread takes whole items with
  // its own scratch and a single-threaded GEMM, so small images still spread
  // over the pool without nested hand-offs.
  bool tiled = !direct && g.rank() == 2;
  int64_t rows = tiled ? g.out[0] : 1;
  int64_t tileRows = tiled ? std::clamp<int64_t>((int64_t(1) << 17) / std::max<int64_t>(cg * kTotal * g.out[1], 1),
                                                 1, rows)
                           : 1;
  // Small images are cut into at least kMinItems items so they spread over a
  // pool; the cut never depends on the thread count, so neither do results.
  constexpr int64_t kMinItems = 16;
  if (tiled && units * ((rows + tileRows - 1) / tileRows) < kMinItems)
    tileRows = std::max<int64_t>(1, rows * units / kMinItems);
  int64_t tiles = tiled ? (rows + tileRows - 1) / tileRows : 1;
  int64_t items = units * tiles;
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *bias = c.hasInput(2) && c.inputs[2].data ? c.inputs[2].as<T>() : nullptr;
    ConvEpilogue<T> epilogue = epilogueOf(tag);
    auto runItems = [&](int64_t i0, int64_t i1, ThreadPool *inner) {
      std::vector<T> col(direct ? 0 : size_t(cg * kTotal * (tiled ? tileRows * g.out[1] : oTotal)));
      for (int64_t item = i0; item < i1; ++item) {
        int64_t u = item / tiles, t = item % tiles, b = u / group, gi = u % group;
        const T *xg = x.as<T>() + (b * cin + gi * cg) * inTotal;
        T *yg = y.as<T>() + (b * m + gi * mg) * oTotal;
        const T *wg = w.as<T>() + gi * mg * cg * kTotal;
        int64_t col0 = 0, cols = oTotal;
        const T *src = xg;
        if (tiled) {
          int64_t oh0 = t * tileRows, oh1 = std::min(rows, oh0 + tileRows);
          col0 = oh0 * g.out[1];
          cols = (oh1 - oh0) * g.out[1];
          im2col2d<T>(inner, xg, cg, g, oh0, oh1, col.data());
          src = col.data();
        } else if (!direct) {
          im2col<T>(inner, xg, cg, g, col.data());
          src = col.data();
        }
        if (bias)
          for (int64_t j = 0; j < mg; ++j)
            std::fill(yg + j * oTotal + col0, yg + j * oTotal + col0 + cols, bias[gi * mg + j]);
        convGemm<T>(inner, c, gi, mg, cols, cg * kTotal, wg, src, tiled ? cols : oTotal, bias ? T(1) : T(0),
                    yg + col0, oTotal);
        if (epilogue.active())
          for (int64_t j = 0; j < mg; ++j) {
            int64_t at = (b * m + gi * mg + j) * oTotal + col0;
            epilogue.apply(y.as<T>() + at, at, cols);
          }
      }
    };
    runWorkItems(c.pool, items, runItems);
    return Status::ok();
  });
}

// 2-D col2im in the forward geometry, adding into `dst` [H, W]: for each tap
// (kh, kw), then output row and column, dst[ih, iw] += col[tap, oh * OW + ow]
// where (ih, iw) is inside the image. The order of the generic tap table's
// loop, so the same sums; each row is one run of adds (strided by the
// conv's stride) over the columns that land inside, with no per-element test.
template <typename T> void col2im2dAdd(const WindowGeometry &fwd, const T *col, T *dst) {
  const int64_t H = fwd.in[0], W = fwd.in[1], KH = fwd.kernel[0], KW = fwd.kernel[1], OH = fwd.out[0],
                OW = fwd.out[1], sw = fwd.strides[1];
  auto firstReaching = [&](int64_t at) { return at <= 0 ? int64_t(0) : std::min(OW, (at + sw - 1) / sw); };
  for (int64_t kh = 0; kh < KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw) {
      const T *tap = col + (kh * KW + kw) * OH * OW;
      const int64_t off = kw * fwd.dilations[1] - fwd.padBegin[1];
      // Columns ow with 0 <= ow * sw + off < W.
      const int64_t lo = firstReaching(-off), hi = std::max(lo, firstReaching(W - off));
      for (int64_t oh = 0; oh < OH; ++oh) {
        const int64_t ih = oh * fwd.strides[0] - fwd.padBegin[0] + kh * fwd.dilations[0];
        if (ih < 0 || ih >= H) continue;
        T *row = dst + ih * W + off;
        const T *src = tap + oh * OW;
        if (sw == 1)
          for (int64_t ow = lo; ow < hi; ++ow) row[ow] += src[ow];
        else
          for (int64_t ow = lo; ow < hi; ++ow) row[ow * sw] += src[ow];
      }
    }
}

Status ConvTransposeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &w = c.inputs[1], &y = c.outputs[0];
  int64_t group = c.attrs.getInt("group", 1);
  WindowGeometry g;
  SD_RETURN_IF_ERROR(resolveTransposedWindows(c.attrs, spatial(x.dims), kernelShapeOf(c, w), g));
  int64_t n = x.dims[0], cin = x.dims[1], cg = cin / group, mg = w.dims[1], m = mg * group;
  int64_t kTotal = product(g.kernel), inTotal = product(g.in), outTotal = product(g.out);
  SD_CHECK_ARG(y.dims[1] == m && product(spatial(y.dims)) == outTotal, "ConvTranspose shapes inconsistent");
  // col2im uses the forward geometry: the transposed conv's output is the
  // forward conv's input.
  WindowGeometry fwd = g;
  fwd.in = g.out;
  fwd.out = g.in;
  // 2-D windows that tile the output exactly (stride = kernel, dilation 1, no
  // padding: the 2x2 stride-2 upsampling of segmentation and detection heads)
  // write each output once, row by row: no tap table, fill or accumulation.
  bool shuffle = g.rank() == 2;
  for (size_t d = 0; d < g.rank() && shuffle; ++d)
    shuffle = g.strides[d] == g.kernel[d] && g.dilations[d] == 1 && g.padBegin[d] == 0 && g.padEnd[d] == 0 &&
              g.out[d] == g.in[d] * g.kernel[d];
  const bool rows2d = !shuffle && g.rank() == 2;
  std::vector<int64_t> taps(shuffle || rows2d ? 0 : size_t(kTotal * inTotal));
  if (!shuffle && !rows2d)
    forEachWindowTap(fwd, [&](int64_t kk, int64_t oo, int64_t off) { taps[size_t(kk * inTotal + oo)] = off; });
  // (image x group) work items. (This kernel is also Conv's input gradient.)
  int64_t items = n * group;
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *bias = c.hasInput(2) && c.inputs[2].data ? c.inputs[2].as<T>() : nullptr;
    auto runItems = [&](int64_t i0, int64_t i1, ThreadPool *inner) {
      std::unique_ptr<T[]> col(new T[size_t(mg * kTotal * inTotal)]); // the GEMM writes all of it
      for (int64_t item = i0; item < i1; ++item) {
        int64_t b = item / group, gi = item % group;
        const T *xg = x.as<T>() + (b * cin + gi * cg) * inTotal;
        T *yg = y.as<T>() + (b * m + gi * mg) * outTotal;
        // col[mg*K, in] = W_g^T [mg*K, cg] x X_g [cg, in]
        parallelGemm<T>(inner, true, false, mg * kTotal, inTotal, cg, T(1), w.as<T>() + gi * cg * mg * kTotal,
                        mg * kTotal, xg, inTotal, T(0), col.get(), inTotal);
        // Output channels scatter independently.
        parallelFor(inner, mg, 1, [&](int64_t j0, int64_t j1) {
          for (int64_t j = j0; j < j1; ++j) {
            T *dst = yg + j * outTotal;
            const T bj = bias ? bias[gi * mg + j] : T(0);
            const T *cj = col.get() + j * kTotal * inTotal;
            if (shuffle) { // output (ih * KH + kh, iw * KW + kw) = tap (kh, kw) of input (ih, iw)
              const int64_t kh = g.kernel[0], kw = g.kernel[1], ih = g.in[0], iw = g.in[1];
              for (int64_t r = 0; r < ih; ++r)
                for (int64_t a = 0; a < kh; ++a) {
                  T *row = dst + (r * kh + a) * g.out[1];
                  for (int64_t e = 0; e < kw; ++e) {
                    const T *src = cj + (a * kw + e) * inTotal + r * iw;
                    for (int64_t q = 0; q < iw; ++q) row[q * kw + e] = src[q] + bj;
                  }
                }
              continue;
            }
            std::fill(dst, dst + outTotal, bj);
            if (rows2d) {
              col2im2dAdd(fwd, cj, dst);
              continue;
            }
            for (int64_t i = 0; i < kTotal * inTotal; ++i)
              if (taps[size_t(i)] >= 0) dst[taps[size_t(i)]] += cj[i];
          }
        });
      }
    };
    runWorkItems(c.pool, items, runItems);
    return Status::ok();
  });
}

// Conv's weight gradient: dW_g = sum_b dY_g[b] [mg, out] x im2col(X_g[b])^T
// [out, cg*K], accumulated over the batch in a fixed order (deterministic).
Status ConvGradWeightKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &x = c.inputs[1], &dw = c.outputs[0];
  int64_t group = c.attrs.getInt("group", 1);
  WindowGeometry g;
  SD_RETURN_IF_ERROR(resolveWindows(c.attrs, spatial(x.dims), c.attrs.getInts("kernel_shape"), false, g));
  int64_t n = x.dims[0], cin = x.dims[1], m = dy.dims[1], cg = cin / group, mg = m / group;
  int64_t kTotal = product(g.kernel), oTotal = product(g.out), inTotal = product(g.in);
  SD_CHECK_ARG(spatial(dy.dims) == g.out && dw.dims[0] == m && dw.dims[1] == cg, "ConvGradWeight shapes inconsistent");
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> col(size_t(cg * kTotal * oTotal));
    for (int64_t gi = 0; gi < group; ++gi) {
      T *dwg = dw.as<T>() + gi * mg * cg * kTotal;
      for (int64_t b = 0; b < n; ++b) {
        im2col<T>(c.pool, x.as<T>() + (b * cin + gi * cg) * inTotal, cg, g, col.data());
        parallelGemm<T>(c.pool, false, true, mg, cg * kTotal, oTotal, T(1), dy.as<T>() + (b * m + gi * mg) * oTotal,
                        oTotal, col.data(), oTotal, b ? T(1) : T(0), dwg, cg * kTotal);
      }
    }
    return Status::ok();
  });
}

} // namespace

void registerConvKernels() {
  registerCpuKernel("Conv", ConvKernel, TypeSet::floats(), prepareConv);
  registerCpuKernel("FusedConv", ConvKernel, TypeSet::floats(), prepareConv);
  registerCpuKernel("ConvTranspose", ConvTransposeKernel, TypeSet::floats());
  registerCpuKernel("ConvGradWeight", ConvGradWeightKernel, TypeSet::floats());
}

} // namespace sd::cpu
