// Index geometry of the ops whose shape operands (Slice's starts, Pad's pads,
// a Reduce's axes) decide which elements move, computed once on the host and
// shared by the CPU and CUDA kernels.
#pragma once
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include "sd/ops/attrs.h"
#include <vector>

namespace sd {

// Softmax, LogSoftmax, Hardmax and their gradients: x split around `axis`
// into [outer, n, inner]; coerce2d (opsets < 13) flattens from `axis` on into n.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
AxisSplit softmaxSplit(const Dims &x, const AttrMap &attrs);

// LayerNorm and RMSNorm: rows are the dims before `axis` (outer) by those
// from it (n); epsilon as the op has it.
struct NormRows {
  int64_t axis = 0, outer = 1, n = 1;
  double eps = 1e-5;
};
NormRows normRows(const Dims &x, const AttrMap &attrs);
// A norm gradient's accumulate operand (sd-norm-grad-sum; absent: dtype
// Undefined): f32 or f64 of x's type (the shape rule's check), and in a
// kernel also x's element count; the residual stream's gradient that dx is
// added to.
Status checkNormAccumulateType(DType x, DType acc, const char *op);
// A norm gradient's further summands of dy (operands 4.., sd-norm-grad-sum):
// at most kMaxNormGradTerms in all with dy, each of dy's type (the shape
// rule's check; it also compares dims).
constexpr size_t kMaxNormGradTerms = 4;
Status checkNormGradTermType(DType dy, DType term, size_t operand, const char *op);
// A kernel's check of both: types, and element counts against x and dy.
Status checkNormGradSums(const std::vector<TensorView> &inputs, const char *op);
// Whether a norm gradient writes its parameter gradient `output` (1: dscale,
// 2: dbias): the step has that output, and not param_grads = 0 (sd-autodiff:
// nothing reads them; the kernels then leave them unwritten).
bool writesNormParamGrad(const AttrMap &attrs, const std::vector<TensorView> &outputs, size_t output);

// Element strides of a dense row-major tensor of shape `dims`.
Dims rowMajorStrides(const Dims &dims);

// Slice as a strided view of x: output element idx reads
// x[base + sum(idx[d] * strides[d])]. Checks the result against `out`.
struct SliceView {
  int64_t base = 0;
  Dims strides;
};
Status sliceView(const Dims &x, const std::vector<int64_t> &starts, const std::vector<int64_t> &ends,
                 std::vector<int64_t> axes, std::vector<int64_t> steps, const Dims &out, SliceView &view);

// Pad: the padding before each dim of x (pads as ONNX lists them, over
// `axes`, or every dim when axes is empty). Checks the result against `out`.
Status padBefore(const Dims &x, const std::vector<int64_t> &pads, std::vector<int64_t> axes, const Dims &out,
                 Dims &before);

// Which of `rank` dims a Reduce op reduces: `axes` (negative counts from the
// end), or all of them when axes is empty, unless noop_with_empty_axes.
std::vector<bool> reducedAxes(int64_t rank, const std::vector<int64_t> &axes, bool noopWithEmptyAxes);

// A tensor seen as [outer, len, inner] around `axis` (already non-negative).
struct AxisExtent {
  int64_t outer = 1, len = 1, inner = 1;
};
inline AxisExtent extentAround(const Dims &d, int64_t axis) {
  AxisExtent e;
  for (int64_t i = 0; i < int64_t(d.size()); ++i) {
    if (i < axis) e.outer *= d[size_t(i)];
    else if (i == axis) e.len = d[size_t(i)];
    else e.inner *= d[size_t(i)];
  }
  return e;
}

// A copy as a strided read: output element i (row-major over `dims`, which
// hold as many elements as the output) reads the input at the sum of its
// indices times `strides`. DepthToSpace/SpaceToDepth and Tile are such
// copies, on the CPU and on CUDA.
struct StridedRead {
  Dims dims, strides;
};
// DepthToSpace (toSpace) or SpaceToDepth of an NCHW tensor: a 6-D transpose.
StatusOr<StridedRead> blockRearrangeRead(const Dims &x, int64_t blocksize, bool crd, bool toSpace);
// Tile of x into out: an axis that repeats becomes [repeats, x_d] (strides 0
// and x's), one that does not stays one axis.
StatusOr<StridedRead> tileRead(const Dims &x, const Dims &out);

} // namespace sd
