// Data-dependent selections (NonZero, Compress, Unique): how many elements they
// keep depends on operand values. Where those are known at compile time
// (constants, --bind) the shape rules count with the same functions the
// kernels select with; otherwise the results are sized for the most the op can
// select and a count result says how much of them is real.
#pragma once
#include "sd/format/status.h"
#include "sd/ops/attrs.h"
#include "../cpu/cpu_util.h"
#include "sd/format/tensor.h"
#include <vector>

namespace sd::selection {

// The optional `axis` attribute of Compress and Unique, made non-negative;
// hasAxis false: they work on the flattened elements.
Status optionalAxis(const AttrMap &attrs, int64_t rank, bool &hasAxis, int64_t &axis);

// x as [outer, slices, inner] around `axis`, or its flattened elements as
// [1, elements, 1] when !hasAxis: the slices Compress and Unique select.
inline AxisExtent slicesOf(const Dims &dims, bool hasAxis, int64_t axis) {
  return hasAxis ? extentAround(dims, axis) : AxisExtent{1, product(dims), 1};
}

// Flat indices of the nonzero elements of `x`, in row-major order.
Status nonzero(const TensorView &x, std::vector<int64_t> &flat);

// Positions along the selected axis that Compress keeps: i < min(len(cond), extent) with cond[i].
Status compressed(const TensorView &condition, int64_t extent, std::vector<int64_t> &kept);

// Unique slices of `x` along `axis` (flattened elements when !hasAxis), as np.unique
// with return_index/inverse/counts: `first` holds the first occurrence of each
// output slice (sorted ascending when `sorted`, else in order of first
// occurrence), `inverse` maps every input slice to its output slice.
struct Unique {
  std::vector<int64_t> first, inverse, counts;
};
Status unique(const TensorView &x, bool hasAxis, int64_t axis, bool sorted, Unique &out);

} // namespace sd::selection
