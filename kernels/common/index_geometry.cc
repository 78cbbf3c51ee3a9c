// Shape-operand geometry shared by the CPU and CUDA kernels (index_geometry.h).
#include "sd/ops/index_geometry.h"
#include <algorithm>

namespace sd {

AxisSplit softmaxSplit(const Dims &x, const AttrMap &attrs) {
  int64_t rank = int64_t(x.size());
  bool coerce = attrs.getInt("coerce2d", 0);
  int64_t axis = attrs.getInt("axis", coerce ? 1 : -1);
  if (axis < 0) axis += rank;
  AxisSplit s;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t v = x[size_t(d)];
    if (d < axis) s.outer *= v;
    else if (d == axis || coerce) s.n *= v;
    else s.inner *= v;
  }
  return s;
}

NormRows normRows(const Dims &x, const AttrMap &attrs) {
  NormRows r;
  r.axis = attrs.getInt("axis", -1);
  r.eps = attrs.getFloat("epsilon", 1e-5);
  if (r.axis < 0) r.axis += int64_t(x.size());
  for (int64_t d = 0; d < int64_t(x.size()); ++d) (d < r.axis ? r.outer : r.n) *= x[size_t(d)];
  return r;
}

Status checkNormAccumulateType(DType x, DType acc, const char *op) {
  if (acc == DType::Undefined || (acc == x && (acc == DType::F32 || acc == DType::F64))) return Status::ok();
  return sdError(op, " accumulates into f32 or f64 of x's type, got ", dtypeName(acc), " for x of ", dtypeName(x));
}

Status checkNormGradTermType(DType dy, DType term, size_t operand, const char *op) {
  if (term == dy) return Status::ok();
  return sdError(op, ": dy's summand (operand ", operand, ") is ", dtypeName(term), ", dy ", dtypeName(dy));
}

Status checkNormGradSums(const std::vector<TensorView> &inputs, const char *op) {
  if (inputs.size() > 3 + kMaxNormGradTerms) return sdError(op, " takes at most ", kMaxNormGradTerms, " summands of dy");
  const TensorView &dy = inputs[0], &x = inputs[1];
  if (inputs.size() > 3 && inputs[3].dtype != DType::Undefined) {
    SD_RETURN_IF_ERROR(checkNormAccumulateType(x.dtype, inputs[3].dtype, op));
    if (inputs[3].numElements() != x.numElements())
      return sdError(op, ": accumulate has ", inputs[3].numElements(), " elements, x ", x.numElements());
  }
  for (size_t i = 4; i < inputs.size(); ++i) {
    SD_RETURN_IF_ERROR(checkNormGradTermType(dy.dtype, inputs[i].dtype, i, op));
    if (inputs[i].numElements() != dy.numElements())
      return sdError(op, ": dy's summand (operand ", i, ") has ", inputs[i].numElements(), " elements, dy ",
                     dy.numElements());
  }
  return Status::ok();
}

bool writesNormParamGrad(const AttrMap &attrs, const std::vector<TensorView> &outputs, size_t output) {
  return attrs.getInt("param_grads", 1) != 0 && output < outputs.size() && outputs[output].data;
}

Dims rowMajorStrides(const Dims &d) {
  Dims s(d.size(), 1);
  for (size_t i = d.size(); i-- > 1;) s[i - 1] = s[i] * d[i];
  return s;
}

Status sliceView(const Dims &x, const std::vector<int64_t> &starts, const std::vector<int64_t> &ends,
                 std::vector<int64_t> axes, std::vector<int64_t> steps, const Dims &out, SliceView &view) {
  int64_t rank = int64_t(x.size());
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return sdError("Slice parameter lengths differ");
  Dims xs = rowMajorStrides(x), expect = x;
  view.base = 0;
  view.strides = xs;
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (a < 0 || a >= rank || steps[i] == 0) return sdError("Slice axis or step invalid");
    int64_t dim = x[size_t(a)], s = starts[i], e = ends[i], step = steps[i];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    int64_t n;
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      n = e > s ? (e - s + step - 1) / step : 0;
    } else {
      s = std::clamp<int64_t>(s, -1, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      n = s > e ? (s - e - step - 1) / -step : 0;
    }
    expect[size_t(a)] = n;
    if (n > 0) view.base += s * xs[size_t(a)];
    view.strides[size_t(a)] = xs[size_t(a)] * step;
  }
  if (expect != out) return sdError("Slice result ", formatDims(expect), " differs from planned ", formatDims(out));
  return Status::ok();
}

Status padBefore(const Dims &x, const std::vector<int64_t> &pads, std::vector<int64_t> axes, const Dims &out,
                 Dims &before) {
  int64_t rank = int64_t(x.size());
  if (axes.empty())
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  if (pads.size() != 2 * axes.size()) return sdError("Pad pads length mismatch");
  before.assign(x.size(), 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (a < 0 || a >= rank) return sdError("Pad axis out of range");
    before[size_t(a)] = pads[i];
    if (out[size_t(a)] != x[size_t(a)] + pads[i] + pads[i + axes.size()]) return sdError("Pad output dims inconsistent");
  }
  return Status::ok();
}

std::vector<bool> reducedAxes(int64_t rank, const std::vector<int64_t> &axes, bool noopWithEmptyAxes) {
  std::vector<bool> r(size_t(rank), false);
  if (axes.empty()) {
    if (!noopWithEmptyAxes) r.assign(size_t(rank), true);
    return r;
  }
  for (int64_t a : axes) {
    if (a < 0) a += rank;
    if (a >= 0 && a < rank) r[size_t(a)] = true;
  }
  return r;
}

StatusOr<StridedRead> blockRearrangeRead(const Dims &x, int64_t b, bool crd, bool toSpace) {
  if (x.size() != 4 || b < 1) return sdError("block rearrangement needs an NCHW tensor and a positive blocksize");
  const int64_t n = x[0], ch = x[1], h = x[2], w = x[3];
  Dims src, perm;
  if (toSpace) {
    if (ch % (b * b)) return sdError("DepthToSpace: channels ", ch, " are not a multiple of blocksize^2");
    const int64_t oc = ch / (b * b);
    if (crd) src = {n, oc, b, b, h, w}, perm = {0, 1, 4, 2, 5, 3};
    else src = {n, b, b, oc, h, w}, perm = {0, 3, 4, 1, 5, 2};
  } else {
    if (h % b || w % b) return sdError("SpaceToDepth: height and width must be multiples of blocksize");
    src = {n, ch, h / b, b, w / b, b};
    perm = crd ? Dims{0, 1, 3, 5, 2, 4} : Dims{0, 3, 5, 1, 2, 4};
  }
  const Dims ss = rowMajorStrides(src);
  StridedRead r{Dims(6), Dims(6)};
  for (size_t i = 0; i < 6; ++i) {
    r.dims[i] = src[size_t(perm[i])];
    r.strides[i] = ss[size_t(perm[i])];
  }
  return r;
}

StatusOr<StridedRead> tileRead(const Dims &x, const Dims &out) {
  if (x.size() != out.size()) return sdError("Tile rank mismatch");
  const Dims xs = rowMajorStrides(x);
  StridedRead r;
  for (size_t d = 0; d < x.size(); ++d) {
    if (x[d] > 0 ? out[d] % x[d] != 0 : out[d] != 0) return sdError("Tile output dims inconsistent");
    const int64_t repeats = x[d] > 0 ? out[d] / x[d] : 0;
    if (repeats != 1) r.dims.push_back(repeats), r.strides.push_back(0);
    r.dims.push_back(x[d]);
    r.strides.push_back(xs[d]);
  }
  return r;
}

} // namespace sd
