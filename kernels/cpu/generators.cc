// CPU kernels that generate or scan values: Shape, Size, ConstantOfShape,
// EyeLike, Range, Trilu, CumSum, CumProd.
#include "cpu_util.h"
#include <algorithm>

namespace sd::cpu {
namespace {

Status ShapeKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  int64_t r = x.rank(), s = c.attrs.getInt("start", 0), e = c.attrs.getInt("end", r);
  if (s < 0) s += r;
  if (e < 0) e += r;
  s = std::clamp<int64_t>(s, 0, r);
  e = std::clamp<int64_t>(e, 0, r);
  SD_CHECK_ARG(c.outputs[0].numElements() == std::max<int64_t>(0, e - s), "Shape output size mismatch");
  for (int64_t i = s; i < e; ++i) c.outputs[0].as<int64_t>()[i - s] = x.dims[size_t(i)];
  return Status::ok();
}

Status SizeKernel(const KernelContext &c) {
  c.outputs[0].as<int64_t>()[0] = c.inputs[0].numElements();
  return Status::ok();
}

Status ConstantOfShapeKernel(const KernelContext &c) {
  const TensorView &o = c.outputs[0];
  double v = c.attrs.getFloat("value", 0.0);
  if (o.dtype == DType::Bool) {
    std::memset(o.data, v != 0, o.byteSize());
    return Status::ok();
  }
  if (dtypeIsHalf(o.dtype)) {
    uint16_t h = o.dtype == DType::F16 ? floatToHalf(float(v)) : floatToBf16(float(v));
    std::fill(o.as<uint16_t>(), o.as<uint16_t>() + o.numElements(), h);
    return Status::ok();
  }
  return dispatchNumeric(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    std::fill(o.as<T>(), o.as<T>() + o.numElements(), T(v));
    return Status::ok();
  });
}

Status EyeLikeKernel(const KernelContext &c) {
  const TensorView &o = c.outputs[0];
  int64_t k = c.attrs.getInt("k", 0), rows = o.dims[0], cols = o.dims[1];
  std::memset(o.data, 0, o.byteSize());
  DType t = o.dtype == DType::Bool ? DType::U8 : o.dtype;
  return dispatchNumeric(t, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < rows; ++i)
      if (i + k >= 0 && i + k < cols) o.as<T>()[i * cols + i + k] = T(1);
    return Status::ok();
  });
}

Status RangeKernel(const KernelContext &c) {
  const TensorView &o = c.outputs[0];
  return dispatchNumeric(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    T start = c.inputs[0].as<T>()[0], delta = c.inputs[2].as<T>()[0];
    for (int64_t i = 0, n = o.numElements(); i < n; ++i) o.as<T>()[i] = T(start + T(i) * delta);
    return Status::ok();
  });
}

Status TriluKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  int64_t k = 0;
  if (c.hasInput(1) && c.inputs[1].data) {
    std::vector<int64_t> kv;
    readIntegers(c.inputs[1], kv);
    SD_CHECK_ARG(kv.size() == 1, "Trilu k must be a scalar");
    k = kv[0];
  }
  bool upper = c.attrs.getInt("upper", 1);
  int64_t rows = x.dims[size_t(x.rank() - 2)], cols = x.dims.back();
  int64_t mats = rows * cols != 0 ? x.numElements() / (rows * cols) : 0;
  return dispatchBytes(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>();
    T *po = o.as<T>();
    for (int64_t m = 0; m < mats; ++m)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          int64_t off = (m * rows + i) * cols + j;
          bool keep = upper ? (j - i >= k) : (j - i <= k);
          po[off] = keep ? px[off] : T(0);
        }
    return Status::ok();
  });
}

// CumSum and CumProd: the running sum or product along `axis` (exclusive:
// of the elements before; reverse: from the end).
template <bool Product> Status cumulative(const KernelContext &c, const char *op) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  std::vector<int64_t> av;
  SD_CHECK_ARG(readIntegers(c.inputs[1], av) && av.size() == 1, op, " axis must be a scalar");
  int64_t axis = av[0];
  if (axis < 0) axis += x.rank();
  SD_CHECK_ARG(axis >= 0 && axis < x.rank(), op, " axis out of range");
  bool excl = c.attrs.getInt("exclusive", 0), rev = c.attrs.getInt("reverse", 0);
  AxisExtent ext = extentAround(x.dims, axis);
  int64_t outer = ext.outer, n = ext.len, inner = ext.inner;
  return dispatchNumeric(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t a = 0; a < outer; ++a)
      for (int64_t i = 0; i < inner; ++i) {
        T acc = T(Product ? 1 : 0);
        for (int64_t jj = 0; jj < n; ++jj) {
          int64_t j = rev ? n - 1 - jj : jj, off = (a * n + j) * inner + i;
          T v = x.as<T>()[off];
          if (excl) o.as<T>()[off] = acc;
          acc = Product ? T(acc * v) : T(acc + v);
          if (!excl) o.as<T>()[off] = acc;
        }
      }
    return Status::ok();
  });
}

Status CumSumKernel(const KernelContext &c) { return cumulative<false>(c, "CumSum"); }
Status CumProdKernel(const KernelContext &c) { return cumulative<true>(c, "CumProd"); }

} // namespace

void registerGeneratorKernels() {
  registerCpuKernel("Shape", ShapeKernel, TypeSet::all());
  registerCpuKernel("Size", SizeKernel, TypeSet::all());
  registerCpuKernel("ConstantOfShape", ConstantOfShapeKernel, TypeSet::all(), nullptr, -1);
  registerCpuKernel("EyeLike", EyeLikeKernel, TypeSet::numeric() | TypeSet{DType::Bool}, nullptr, -1);
  registerCpuKernel("Range", RangeKernel, TypeSet::numeric());
  registerCpuKernel("Trilu", TriluKernel, TypeSet::all());
  registerCpuKernel("CumSum", CumSumKernel, TypeSet::numeric());
  registerCpuKernel("CumProd", CumProdKernel, TypeSet::numeric());
}

} // namespace sd::cpu
