// CUDA kernels of the integer products (see kernels/cpu/quantized.cc):
// MatMulInteger and ConvInteger (to i32), QLinearMatMul and QLinearConv
// (requantized to 8 bits). One thread per output element sums
// (a - a_zero)(b - b_zero) exactly in i64, then stores it as the CPU does:
// saturated to i32, or scaled by the f32-rounded multiplier
// a_scale * b_scale / y_scale, rounded half to even, offset by y's zero
// point and saturated. Zero points: one per tensor, one per row of A and per
// column of B, one per output channel of W. Plain loops, not tensor cores:
// these run the quantized models ONNX Runtime's tools write, exactly.
#include "conv_shape.cuh"
#include "cuda_util.cuh"
#include "saturate.cuh"
#include "sd/ops/flat_window.h"
#include "sd/ops/window_geometry.h"

namespace sd::cuda {
namespace {

// A zero point on the device: `count` values of type Z (count 0: absent).
template <typename Z> struct ZeroPoint {
  const Z *values;
  int64_t count;
  __device__ int64_t at(int64_t i) const { return count == 0 ? 0 : int64_t(values[count == 1 ? 0 : i]); }
};

// The requantization of QLinearMatMul and QLinearConv: multiplier operands
// (f32 scales) and y's zero point, all on the device.
template <typename Y> struct Requant {
  const float *aScale, *bScale, *yScale;
  const Y *yZero;
  int64_t bScales; // 1, or one per output channel (QLinearConv's w_scale)
  __device__ Y apply(int64_t sum, int64_t channel) const {
    const float b = bScale[bScales == 1 ? 0 : channel];
    const double mult = double(float(*aScale * b) / *yScale); // f32 at each step, as the CPU's requantScale
    return saturate<Y>(nearbyint(double(sum) * mult) + double(*yZero));
  }
};

// MatMul's operands as [batch..., M, K] x [batch..., K, N] with the batch
// broadcast: per output batch dim the A and B strides (0 where broadcast).
struct ProductGeometry {
  int64_t m, k, n, batchRank;
  int64_t batchDims[kMaxRank], aBatchStrides[kMaxRank], bBatchStrides[kMaxRank];
};

StatusOr<ProductGeometry> productGeometry(const TensorView &a, const TensorView &b, const TensorView &y) {
  Dims ad = a.dims, bd = b.dims;
  if (ad.size() == 1) ad.insert(ad.begin(), 1);
  if (bd.size() == 1) bd.push_back(1);
  if (ad.size() < 2 || bd.size() < 2 || ad.back() != bd[bd.size() - 2])
    return sdError("integer MatMul of ", formatDims(a.dims), " by ", formatDims(b.dims), ": inner dims differ");
  ProductGeometry g{ad[ad.size() - 2], ad.back(), bd.back(), int64_t(std::max(ad.size(), bd.size()) - 2), {}, {}, {}};
  if (g.batchRank > kMaxRank) return sdError("integer MatMul on CUDA takes up to ", kMaxRank, " batch dims");
  int64_t aStride = g.m * g.k, bStride = g.k * g.n, batch = 1;
  for (int64_t d = g.batchRank - 1; d >= 0; --d) {
    const int64_t fromEnd = g.batchRank - 1 - d;
    const int64_t ai = int64_t(ad.size()) - 3 - fromEnd, bi = int64_t(bd.size()) - 3 - fromEnd;
    const int64_t adim = ai >= 0 ? ad[size_t(ai)] : 1, bdim = bi >= 0 ? bd[size_t(bi)] : 1;
    if (adim != bdim && adim != 1 && bdim != 1) return sdError("integer MatMul batch dims do not broadcast");
    g.batchDims[d] = std::max(adim, bdim);
    g.aBatchStrides[d] = adim == 1 ? 0 : aStride;
    g.bBatchStrides[d] = bdim == 1 ? 0 : bStride;
    aStride *= adim, bStride *= bdim, batch *= g.batchDims[d];
  }
  if (y.numElements() != batch * g.m * g.n) return sdError("integer MatMul result ", formatDims(y.dims), " does not fit");
  return g;
}

// The sum of output element i: row m of A's matrix times column n of B's.
template <typename A, typename B, typename ZA, typename ZB>
__device__ int64_t integerDot(const ProductGeometry &g, int64_t i, const A *a, ZeroPoint<ZA> az, const B *b,
                              ZeroPoint<ZB> bz, int64_t &col) {
  col = i % g.n;
  const int64_t row = (i / g.n) % g.m;
  int64_t batch = i / (g.n * g.m), aOff = row * g.k, bOff = col;
  for (int64_t d = g.batchRank - 1; d >= 0; --d) {
    const int64_t at = batch % g.batchDims[d];
    batch /= g.batchDims[d];
    aOff += at * g.aBatchStrides[d], bOff += at * g.bBatchStrides[d];
  }
  const int64_t za = az.at(row), zb = bz.at(col);
  int64_t sum = 0;
  for (int64_t kk = 0; kk < g.k; ++kk) sum += (int64_t(a[aOff + kk]) - za) * (int64_t(b[bOff + kk * g.n]) - zb);
  return sum;
}

template <typename A, typename B, typename Y>
__global__ void matMulIntegerKernel(ProductGeometry g, const A *a, ZeroPoint<A> az, const B *b, ZeroPoint<B> bz,
                                    Requant<Y> rq, bool requant, Y *y, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t col;
    const int64_t sum = integerDot(g, i, a, az, b, bz, col);
    y[i] = requant ? rq.apply(sum, 0) : saturate<Y>(double(sum));
  }
}

template <typename F> Status dispatch8(DType t, F &&f) {
  if (t == DType::U8) return f(uint8_t{});
  if (t == DType::I8) return f(int8_t{});
  return sdError("integer products on CUDA take u8 or i8, not ", dtypeName(t));
}

// Optional zero point operand i of `like`'s type: absent, one value, or `perAxis` values.
template <typename Z> StatusOr<ZeroPoint<Z>> zeroPointOf(const KernelContext &c, size_t i, int64_t perAxis, DType like) {
  if (!c.hasInput(i) || !c.inputs[i].data) return ZeroPoint<Z>{nullptr, 0};
  const TensorView &z = c.inputs[i];
  if (z.dtype != like || (z.numElements() != 1 && z.numElements() != perAxis))
    return sdError("zero point ", i, " must have its operand's type and 1 or ", perAxis, " values");
  return ZeroPoint<Z>{z.as<Z>(), z.numElements()};
}

// Scales must be f32, one each (b's: one or `perChannel`); y's zero point gives y's type.
template <typename Y>
StatusOr<Requant<Y>> requantOf(const KernelContext &c, size_t aScale, size_t bScale, size_t yScale, size_t yZero,
                               int64_t perChannel) {
  for (size_t i : {aScale, bScale, yScale, yZero})
    if (!c.hasInput(i) || !c.inputs[i].data) return sdError("operand ", i, " is missing");
  for (size_t i : {aScale, bScale, yScale})
    if (c.inputs[i].dtype != DType::F32) return sdError("scales must be f32 on CUDA");
  const int64_t bScales = c.inputs[bScale].numElements();
  if (c.inputs[aScale].numElements() != 1 || c.inputs[yScale].numElements() != 1 ||
      c.inputs[yZero].numElements() != 1 || (bScales != 1 && bScales != perChannel))
    return sdError("scales and y's zero point must be per tensor (w_scale: or per output channel)");
  if (c.inputs[yZero].dtype != c.outputs[0].dtype) return sdError("y's zero point must have y's type");
  return Requant<Y>{c.inputs[aScale].as<float>(), c.inputs[bScale].as<float>(), c.inputs[yScale].as<float>(),
                    c.inputs[yZero].as<Y>(), bScales};
}

// MatMulInteger (a, b, a_zero?, b_zero?) and QLinearMatMul (a, a_scale,
// a_zero, b, b_scale, b_zero, y_scale, y_zero).
template <bool QLinear> Status integerMatMul(const KernelContext &c) {
  const size_t ai = 0, bi = QLinear ? 3 : 1, azi = 2, bzi = QLinear ? 5 : 3;
  const TensorView &a = c.inputs[ai], &b = c.inputs[bi], &y = c.outputs[0];
  StatusOr<ProductGeometry> g = productGeometry(a, b, y);
  if (!g.isOk()) return g.status();
  const int64_t total = y.numElements();
  const char *op = QLinear ? "QLinearMatMul" : "MatMulInteger";
  return dispatch8(a.dtype, [&](auto atag) {
    using A = decltype(atag);
    return dispatch8(b.dtype, [&](auto btag) -> Status {
      using B = decltype(btag);
      StatusOr<ZeroPoint<A>> az = zeroPointOf<A>(c, azi, g.value().m, a.dtype);
      StatusOr<ZeroPoint<B>> bz = zeroPointOf<B>(c, bzi, g.value().n, b.dtype);
      if (!az.isOk()) return az.status().withContext(std::string(op) + ": ");
      if (!bz.isOk()) return bz.status().withContext(std::string(op) + ": ");
      if (total == 0) return Status::ok();
      if constexpr (QLinear) {
        return dispatch8(y.dtype, [&](auto ytag) -> Status {
          using Y = decltype(ytag);
          StatusOr<Requant<Y>> rq = requantOf<Y>(c, 1, 4, 6, 7, 1);
          if (!rq.isOk()) return rq.status().withContext("QLinearMatMul: ");
          matMulIntegerKernel<A, B, Y><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(*g, a.as<A>(), *az, b.as<B>(),
                                                                                       *bz, *rq, true, y.as<Y>(), total);
          return launchStatus(op);
        });
      } else {
        if (y.dtype != DType::I32) return sdError("MatMulInteger's result must be i32");
        matMulIntegerKernel<A, B, int32_t><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(
            *g, a.as<A>(), *az, b.as<B>(), *bz, Requant<int32_t>{}, false, y.as<int32_t>(), total);
        return launchStatus(op);
      }
    });
  });
}

// The integer convolutions: x [N, C, spatial...] by w [M, C/group, kernel...].
template <typename X, typename W, typename Y>
__global__ void convIntegerKernel(ConvShape s, FlatWindow w, const X *x, ZeroPoint<X> xz, const W *wt, ZeroPoint<W> wz,
                                  const int32_t *bias, Requant<Y> rq, bool requant, Y *y) {
  const int64_t total = s.n * s.m * w.outTotal;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t oo = i % w.outTotal, rest = i / w.outTotal, oc = rest % s.m, img = rest / s.m;
    const int64_t grp = oc / s.mg, zx = xz.at(0), zw = wz.at(oc);
    int64_t sum = 0;
    for (int64_t ic = 0; ic < s.cg; ++ic) {
      const X *plane = x + (img * s.cin + grp * s.cg + ic) * w.inTotal;
      const W *taps = wt + (oc * s.cg + ic) * w.kernelTotal;
      for (int64_t kk = 0; kk < w.kernelTotal; ++kk) {
        const int64_t off = w.tap(oo, kk);
        if (off >= 0) sum += (int64_t(plane[off]) - zx) * (int64_t(taps[kk]) - zw);
      }
    }
    if (bias) sum += bias[oc];
    y[i] = requant ? rq.apply(sum, oc) : saturate<Y>(double(sum));
  }
}

// ConvInteger (x, w, x_zero?, w_zero?) and QLinearConv (x, x_scale, x_zero,
// w, w_scale, w_zero, y_scale, y_zero, B?).
template <bool QLinear> Status integerConv(const KernelContext &c) {
  const size_t wi = QLinear ? 3 : 1, xzi = 2, wzi = QLinear ? 5 : 3;
  const TensorView &x = c.inputs[0], &wt = c.inputs[wi], &y = c.outputs[0];
  const char *op = QLinear ? "QLinearConv" : "ConvInteger";
  Dims kernel = c.attrs.getInts("kernel_shape");
  if (kernel.empty()) kernel.assign(wt.dims.begin() + 2, wt.dims.end());
  WindowGeometry geometry;
  SD_RETURN_IF_ERROR(resolveWindows(c.attrs, Dims(x.dims.begin() + 2, x.dims.end()), kernel, false, geometry));
  StatusOr<FlatWindow> w = flatWindowOf(geometry);
  if (!w.isOk()) return w.status();
  StatusOr<ConvShape> shape = convShapeOf(c, x, wt.dims[0], op);
  if (!shape.isOk()) return shape.status();
  if (wt.dims[1] != shape->cg || y.dims[1] != shape->m) return sdError(op, " shapes inconsistent");
  const int32_t *bias = nullptr;
  if (QLinear && c.hasInput(8) && c.inputs[8].data) {
    if (c.inputs[8].dtype != DType::I32 || c.inputs[8].numElements() != shape->m)
      return sdError("QLinearConv's bias must hold one i32 per output channel");
    bias = c.inputs[8].as<int32_t>();
  }
  const int64_t total = y.numElements();
  return dispatch8(x.dtype, [&](auto xtag) {
    using X = decltype(xtag);
    return dispatch8(wt.dtype, [&](auto wtag) -> Status {
      using W = decltype(wtag);
      StatusOr<ZeroPoint<X>> xz = zeroPointOf<X>(c, xzi, 1, x.dtype);
      StatusOr<ZeroPoint<W>> wz = zeroPointOf<W>(c, wzi, shape->m, wt.dtype);
      if (!xz.isOk()) return xz.status().withContext(std::string(op) + ": ");
      if (!wz.isOk()) return wz.status().withContext(std::string(op) + ": ");
      if (total == 0) return Status::ok();
      if constexpr (QLinear) {
        return dispatch8(y.dtype, [&](auto ytag) -> Status {
          using Y = decltype(ytag);
          StatusOr<Requant<Y>> rq = requantOf<Y>(c, 1, 4, 6, 7, shape->m);
          if (!rq.isOk()) return rq.status().withContext("QLinearConv: ");
          convIntegerKernel<X, W, Y><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(
              *shape, *w, x.as<X>(), *xz, wt.as<W>(), *wz, bias, *rq, true, y.as<Y>());
          return launchStatus(op);
        });
      } else {
        if (y.dtype != DType::I32) return sdError("ConvInteger's result must be i32");
        convIntegerKernel<X, W, int32_t><<<blocksFor(total), kThreads, 0, streamOf(c)>>>(
            *shape, *w, x.as<X>(), *xz, wt.as<W>(), *wz, nullptr, Requant<int32_t>{}, false, y.as<int32_t>());
        return launchStatus(op);
      }
    });
  });
}

} // namespace

void registerIntegerProductKernels() {
  const TypeSet bytes{DType::I8, DType::U8};
  registerKernel("MatMulInteger", integerMatMul<false>, bytes);
  registerKernel("QLinearMatMul", integerMatMul<true>, bytes);
  registerKernel("ConvInteger", integerConv<false>, bytes);
  registerKernel("QLinearConv", integerConv<true>, bytes);
}

} // namespace sd::cuda
