// Shape rules for the shape and data-movement ops. Rules that depend on an
// operand's value (Reshape's shape, Slice's starts, ...) need it constant; when
// it is not yet known they leave dims unknown for specialization to resolve.
#include "shape_util.h"
#include <algorithm>
#include <cmath>

namespace sd {
namespace {

TensorInfo unknownDims(DType dt, int64_t rank) {
  if (rank < 0) return unknownRank(dt);
  TensorInfo t;
  t.dtype = dt;
  t.dims.assign(size_t(rank), kUnknownDim);
  return t;
}

// Length of a 1-D operand (its element count), or -1.
int64_t vectorLength(const TensorInfo &t) {
  if (t.rank() == 1) return t.dims[0];
  if (t.rank() == 0) return 1;
  return -1;
}

Status reshapeShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  std::vector<int64_t> shape;
  if (!c.constInts(1, shape)) {
    c.outputs = {unknownDims(x.dtype, vectorLength(c.inputs[1]))};
    return Status::ok();
  }
  bool allowZero = c.attrs.getInt("allowzero", 0);
  TensorInfo out;
  out.dtype = x.dtype;
  int64_t inferAt = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t d = shape[i];
    if (d == 0 && !allowZero) {
      SD_CHECK_ARG(x.rankKnown && i < x.dims.size(), "Reshape copies dim ", i, " the input lacks");
      d = x.dims[i];
    } else if (d == -1) {
      SD_CHECK_ARG(inferAt < 0, "Reshape has more than one -1");
      inferAt = int64_t(i);
    } else if (d < -1) {
      return sdError("Reshape dim ", d, " is invalid");
    }
    out.dims.push_back(d);
    if (int64_t(i) != inferAt) {
      if (d < 0) known = -1;
      else if (known >= 0) known *= d;
    }
  }
  int64_t total = x.numElements();
  if (inferAt >= 0) {
    if (total >= 0 && known > 0) {
      SD_CHECK_ARG(total % known == 0, "cannot reshape ", formatDims(x.dims), " to ",
                   formatDims(shape));
      out.dims[size_t(inferAt)] = total / known;
    } else if (total == 0 && known == 0) {
      out.dims[size_t(inferAt)] = 0;
    } else {
      out.dims[size_t(inferAt)] = kUnknownDim;
    }
  } else if (total >= 0 && out.isStatic() && product(out.dims) != total) {
    return sdError("cannot reshape ", formatDims(x.dims), " (", total, " elements) to ",
                   formatDims(out.dims));
  }
  c.outputs = {out};
  return Status::ok();
}

Status transposeShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  if (!x.rankKnown) {
    c.outputs = {x};
    return Status::ok();
  }
  std::vector<int64_t> perm = c.attrs.getInts("perm");
  if (perm.empty())
    for (int64_t i = x.rank() - 1; i >= 0; --i) perm.push_back(i);
  SD_CHECK_ARG(int64_t(perm.size()) == x.rank(), "Transpose perm has ", perm.size(),
               " entries for rank ", x.rank());
  std::vector<bool> seen(perm.size(), false);
  TensorInfo out;
  out.dtype = x.dtype;
  for (int64_t p : perm) {
    SD_CHECK_ARG(p >= 0 && p < x.rank() && !seen[size_t(p)], "Transpose perm is not a permutation");
    seen[size_t(p)] = true;
    out.dims.push_back(x.dims[size_t(p)]);
  }
  c.outputs = {out};
  return Status::ok();
}

Status concatShape(ShapeContext &c) {
  SD_CHECK_ARG(!c.inputs.empty(), "Concat needs operands");
  const TensorInfo &x = c.inputs[0];
  int64_t axis = c.attrs.getInt("axis", 0);
  SD_RETURN_IF_ERROR(normalizeAxis(axis, x.rank()));
  TensorInfo out = x;
  int64_t sum = 0;
  for (auto &t : c.inputs) {
    SD_CHECK_ARG(t.dtype == x.dtype, "Concat operands differ in type");
    SD_CHECK_ARG(t.rank() == x.rank(), "Concat operands differ in rank");
    for (int64_t d = 0; d < x.rank(); ++d) {
      if (d == axis) continue;
      int64_t a = out.dims[size_t(d)], b = t.dims[size_t(d)];
      if (a >= 0 && b >= 0 && a != b)
        return sdError("Concat operands differ in dim ", d, ": ", a, " vs ", b);
      if (a < 0) out.dims[size_t(d)] = b;
    }
    int64_t v = t.dims[size_t(axis)];
    sum = (sum < 0 || v < 0) ? -1 : sum + v;
  }
  out.dims[size_t(axis)] = sum;
  c.outputs = {out};
  return Status::ok();
}

Status splitShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  int64_t axis = c.attrs.getInt("axis", 0);
  SD_RETURN_IF_ERROR(normalizeAxis(axis, x.rank()));
  size_t n = c.numOutputs;
  std::vector<int64_t> sizes;
  int64_t dim = x.dims[size_t(axis)];
  if (c.hasInput(1)) {
    if (!c.constInts(1, sizes)) {
      c.outputs.assign(n, unknownDims(x.dtype, x.rank()));
      return Status::ok();
    }
    SD_CHECK_ARG(sizes.size() == n, "Split sizes have ", sizes.size(), " entries for ", n, " outputs");
    int64_t total = 0;
    for (int64_t s : sizes) {
      SD_CHECK_ARG(s >= 0, "Split size ", s, " is negative");
      total += s;
    }
    SD_CHECK_ARG(dim < 0 || total == dim, "Split sizes sum to ", total, ", dim is ", dim);
  } else if (dim >= 0) {
    int64_t parts = c.attrs.getInt("num_outputs", int64_t(n));
    SD_CHECK_ARG(parts == int64_t(n), "Split num_outputs ", parts, " but ", n, " outputs");
    int64_t chunk = (dim + parts - 1) / parts;
    for (int64_t i = 0; i < parts; ++i) sizes.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
  }
  for (size_t i = 0; i < n; ++i) {
    TensorInfo o = x;
    o.dims[size_t(axis)] = sizes.empty() ? kUnknownDim : sizes[i];
    c.outputs.push_back(o);
  }
  return Status::ok();
}

// Resolves Slice parameters to per-axis (start, step, count); shared with the kernel.
Status sliceShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  std::vector<int64_t> starts, ends, axes, steps;
  bool known = c.constInts(1, starts) && c.constInts(2, ends);
  if (c.hasInput(3)) known = known && c.constInts(3, axes);
  if (c.hasInput(4)) known = known && c.constInts(4, steps);
  if (!known || !x.rankKnown) {
    c.outputs = {unknownDims(x.dtype, x.rank())};
    return Status::ok();
  }
  SD_CHECK_ARG(starts.size() == ends.size(), "Slice starts and ends differ in length");
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  SD_CHECK_ARG(axes.size() == starts.size() && steps.size() == starts.size(),
               "Slice axes/steps length mismatch");
  TensorInfo out = x;
  std::vector<bool> seen(x.dims.size(), false);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i];
    SD_RETURN_IF_ERROR(normalizeAxis(a, x.rank(), "Slice axis"));
    SD_CHECK_ARG(!seen[size_t(a)], "Slice axis ", a, " repeats");
    seen[size_t(a)] = true;
    SD_CHECK_ARG(steps[i] != 0, "Slice step is 0");
    int64_t dim = x.dims[size_t(a)];
    if (dim < 0) {
      out.dims[size_t(a)] = kUnknownDim;
      continue;
    }
    int64_t s = starts[i], e = ends[i], st = steps[i];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      out.dims[size_t(a)] = e > s ? (e - s + st - 1) / st : 0;
    } else {
      s = std::clamp<int64_t>(s, -1, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      out.dims[size_t(a)] = s > e ? (s - e - st - 1) / -st : 0;
    }
  }
  c.outputs = {out};
  return Status::ok();
}

Status gatherShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &idx = c.inputs[1];
  SD_CHECK_ARG(dtypeIsInteger(idx.dtype), "Gather indices must be integers");
  int64_t axis = c.attrs.getInt("axis", 0);
  SD_RETURN_IF_ERROR(normalizeAxis(axis, x.rank()));
  if (!idx.rankKnown) {
    c.outputs = {unknownRank(x.dtype)};
    return Status::ok();
  }
  TensorInfo out;
  out.dtype = x.dtype;
  out.dims.assign(x.dims.begin(), x.dims.begin() + axis);
  out.dims.insert(out.dims.end(), idx.dims.begin(), idx.dims.end());
  out.dims.insert(out.dims.end(), x.dims.begin() + axis + 1, x.dims.end());
  c.outputs = {out};
  return Status::ok();
}

Status gatherElementsShape(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs[0].rank() == c.inputs[1].rank(), "GatherElements ranks differ");
  c.outputs = {sameAs(c.inputs[1], c.inputs[0].dtype)};
  return Status::ok();
}

Status gatherNDShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &idx = c.inputs[1];
  int64_t b = c.attrs.getInt("batch_dims", 0);
  int64_t last = idx.dims.empty() ? -1 : idx.dims.back();
  SD_CHECK_ARG(idx.rank() >= 1, "GatherND indices must have rank >= 1");
  if (last < 0) {
    c.outputs = {unknownRank(x.dtype)};
    return Status::ok();
  }
  SD_CHECK_ARG(b + last <= x.rank(), "GatherND index depth ", last, " exceeds data rank");
  TensorInfo out;
  out.dtype = x.dtype;
  out.dims.assign(idx.dims.begin(), idx.dims.end() - 1);
  out.dims.insert(out.dims.end(), x.dims.begin() + b + last, x.dims.end());
  c.outputs = {out};
  return Status::ok();
}

Status scatterShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "reduction", {"none", "add", "mul", "max", "min"}));
  SD_CHECK_ARG(c.inputs[0].dtype == c.inputs[2].dtype, "scatter updates differ in type from data");
  c.outputs = {c.inputs[0]};
  return Status::ok();
}

Status expandShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  std::vector<int64_t> shape;
  if (!c.constInts(1, shape)) {
    int64_t n = vectorLength(c.inputs[1]);
    c.outputs = {unknownDims(x.dtype, n < 0 || !x.rankKnown ? -1 : std::max(n, x.rank()))};
    return Status::ok();
  }
  TensorInfo s;
  s.dims = shape;
  TensorInfo out;
  SD_RETURN_IF_ERROR(broadcastDims({&x, &s}, out));
  out.dtype = x.dtype;
  c.outputs = {out};
  return Status::ok();
}

Status squeezeShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  std::vector<int64_t> axes;
  if (c.hasInput(1) && !c.constInts(1, axes)) {
    c.outputs = {unknownRank(x.dtype)};
    return Status::ok();
  }
  if (!x.rankKnown) {
    c.outputs = {x};
    return Status::ok();
  }
  std::vector<bool> drop(x.dims.size(), false);
  if (axes.empty()) {
    for (size_t i = 0; i < x.dims.size(); ++i) {
      SD_CHECK_ARG(x.dims[i] >= 0, "Squeeze without axes needs a static shape");
      drop[i] = x.dims[i] == 1;
    }
  }
  for (int64_t a : axes) {
    SD_RETURN_IF_ERROR(normalizeAxis(a, x.rank(), "Squeeze axis"));
    SD_CHECK_ARG(x.dims[size_t(a)] == 1 || x.dims[size_t(a)] < 0, "Squeeze axis ", a,
                 " has size ", x.dims[size_t(a)]);
    drop[size_t(a)] = true;
  }
  TensorInfo out;
  out.dtype = x.dtype;
  for (size_t i = 0; i < x.dims.size(); ++i)
    if (!drop[i]) out.dims.push_back(x.dims[i]);
  c.outputs = {out};
  return Status::ok();
}

Status unsqueezeShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  std::vector<int64_t> axes;
  if (!c.constInts(1, axes) || !x.rankKnown) {
    int64_t n = vectorLength(c.inputs[1]);
    c.outputs = {unknownDims(x.dtype, n < 0 || !x.rankKnown ? -1 : x.rank() + n)};
    return Status::ok();
  }
  int64_t rank = x.rank() + int64_t(axes.size());
  std::vector<bool> inserted(size_t(rank), false);
  for (int64_t a : axes) {
    SD_RETURN_IF_ERROR(normalizeAxis(a, rank, "Unsqueeze axis"));
    SD_CHECK_ARG(!inserted[size_t(a)], "Unsqueeze axis ", a, " repeats");
    inserted[size_t(a)] = true;
  }
  TensorInfo out;
  out.dtype = x.dtype;
  size_t j = 0;
  for (int64_t i = 0; i < rank; ++i) out.dims.push_back(inserted[size_t(i)] ? 1 : x.dims[j++]);
  c.outputs = {out};
  return Status::ok();
}

Status flattenShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  int64_t axis = c.attrs.getInt("axis", 1);
  if (axis < 0) axis += x.rank();
  SD_CHECK_ARG(axis >= 0 && axis <= x.rank(), "Flatten axis out of range");
  TensorInfo out;
  out.dtype = x.dtype;
  int64_t a = 1, b = 1;
  for (int64_t d = 0; d < x.rank(); ++d) {
    int64_t v = x.dims[size_t(d)];
    int64_t &p = d < axis ? a : b;
    p = (p < 0 || v < 0) ? -1 : p * v;
  }
  out.dims = {a, b};
  c.outputs = {out};
  return Status::ok();
}

Status shapeShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  TensorInfo out;
  out.dtype = DType::I64;
  if (!x.rankKnown) {
    out.dims = {kUnknownDim};
  } else {
    int64_t r = x.rank(), s = c.attrs.getInt("start", 0), e = c.attrs.getInt("end", r);
    if (s < 0) s += r;
    if (e < 0) e += r;
    s = std::clamp<int64_t>(s, 0, r);
    e = std::clamp<int64_t>(e, 0, r);
    out.dims = {std::max<int64_t>(0, e - s)};
  }
  c.outputs = {out};
  return Status::ok();
}

Status sizeShape(ShapeContext &c) {
  TensorInfo out;
  out.dtype = DType::I64;
  c.outputs = {out};
  return Status::ok();
}

Status constantOfShapeShape(ShapeContext &c) {
  DType dt = DType(c.attrs.getInt("dtype", int64_t(DType::F32)));
  SD_CHECK_ARG(dtypeSize(dt) != 0, "ConstantOfShape value type unsupported");
  std::vector<int64_t> shape;
  if (!c.constInts(0, shape)) {
    c.outputs = {unknownDims(dt, vectorLength(c.inputs[0]))};
    return Status::ok();
  }
  for (int64_t d : shape) SD_CHECK_ARG(d >= 0, "ConstantOfShape dim ", d, " is negative");
  TensorInfo out;
  out.dtype = dt;
  out.dims = shape;
  c.outputs = {out};
  return Status::ok();
}

Status eyeLikeShape(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs[0].rank() == 2, "EyeLike input must be 2-D");
  DType dt = DType(c.attrs.getInt("dtype", int64_t(c.inputs[0].dtype)));
  c.outputs = {sameAs(c.inputs[0], dt)};
  return Status::ok();
}

Status oneHotShape(ShapeContext &c) {
  const TensorInfo &idx = c.inputs[0];
  int64_t axis = c.attrs.getInt("axis", -1);
  std::vector<double> depthV;
  int64_t depth = kUnknownDim;
  if (c.constInput(1) && readDoubles(*c.constInput(1), depthV) && depthV.size() == 1) {
    depth = int64_t(depthV[0]);
    SD_CHECK_ARG(depth >= 1, "OneHot depth ", depth, " must be positive");
  }
  SD_CHECK_ARG(c.inputs[2].rank() == 1, "OneHot values must be 1-D");
  int64_t rank = idx.rank() + 1;
  SD_RETURN_IF_ERROR(normalizeAxis(axis, rank, "OneHot axis"));
  TensorInfo out;
  out.dtype = c.inputs[2].dtype;
  out.dims = idx.dims;
  out.dims.insert(out.dims.begin() + axis, depth);
  c.outputs = {out};
  return Status::ok();
}

Status rangeShape(ShapeContext &c) {
  TensorInfo out;
  out.dtype = c.inputs[0].dtype;
  std::vector<double> s, l, d;
  if (c.constInput(0) && c.constInput(1) && c.constInput(2) && readDoubles(*c.constInput(0), s) &&
      readDoubles(*c.constInput(1), l) && readDoubles(*c.constInput(2), d) && s.size() == 1 &&
      l.size() == 1 && d.size() == 1) {
    SD_CHECK_ARG(d[0] != 0, "Range delta is 0");
    double n = std::ceil((l[0] - s[0]) / d[0]);
    SD_CHECK_ARG(n < 1e10, "Range is too long");
    out.dims = {std::max<int64_t>(0, int64_t(n))};
  } else {
    out.dims = {kUnknownDim};
  }
  c.outputs = {out};
  return Status::ok();
}

Status tileShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  std::vector<int64_t> reps;
  if (!c.constInts(1, reps)) {
    c.outputs = {unknownDims(x.dtype, x.rank())};
    return Status::ok();
  }
  SD_CHECK_ARG(int64_t(reps.size()) == x.rank(), "Tile repeats length differs from rank");
  TensorInfo out = x;
  for (size_t i = 0; i < reps.size(); ++i) {
    SD_CHECK_ARG(reps[i] >= 0, "Tile repeat is negative");
    if (out.dims[i] >= 0) out.dims[i] *= reps[i];
  }
  c.outputs = {out};
  return Status::ok();
}

Status padShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "mode", {"constant", "reflect", "edge", "wrap"}));
  std::vector<int64_t> pads, axes;
  bool known = c.constInts(1, pads);
  if (c.hasInput(3)) known = known && c.constInts(3, axes);
  if (!known || !x.rankKnown) {
    c.outputs = {unknownDims(x.dtype, x.rank())};
    return Status::ok();
  }
  if (axes.empty())
    for (int64_t i = 0; i < x.rank(); ++i) axes.push_back(i);
  SD_CHECK_ARG(pads.size() == 2 * axes.size(), "Pad pads have ", pads.size(), " entries for ",
               axes.size(), " axes");
  TensorInfo out = x;
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i];
    SD_RETURN_IF_ERROR(normalizeAxis(a, x.rank(), "Pad axis"));
    if (out.dims[size_t(a)] < 0) continue;
    out.dims[size_t(a)] += pads[i] + pads[i + axes.size()];
    SD_CHECK_ARG(out.dims[size_t(a)] >= 0, "Pad removes more than the axis holds");
  }
  c.outputs = {out};
  return Status::ok();
}

Status depthToSpaceShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "mode", {"DCR", "CRD"}));
  SD_CHECK_ARG(x.rank() == 4, "DepthToSpace input must be 4-D");
  int64_t b = c.attrs.getInt("blocksize", 0);
  SD_CHECK_ARG(b > 0, "blocksize must be positive");
  TensorInfo out = x;
  SD_CHECK_ARG(x.dims[1] < 0 || x.dims[1] % (b * b) == 0, "channels not divisible by blocksize^2");
  if (x.dims[1] >= 0) out.dims[1] = x.dims[1] / (b * b);
  if (x.dims[2] >= 0) out.dims[2] = x.dims[2] * b;
  if (x.dims[3] >= 0) out.dims[3] = x.dims[3] * b;
  c.outputs = {out};
  return Status::ok();
}

Status spaceToDepthShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "mode", {"DCR", "CRD"}));
  SD_CHECK_ARG(x.rank() == 4, "SpaceToDepth input must be 4-D");
  int64_t b = c.attrs.getInt("blocksize", 0);
  SD_CHECK_ARG(b > 0, "blocksize must be positive");
  TensorInfo out = x;
  if (x.dims[1] >= 0) out.dims[1] = x.dims[1] * b * b;
  for (int d = 2; d < 4; ++d) {
    SD_CHECK_ARG(x.dims[size_t(d)] < 0 || x.dims[size_t(d)] % b == 0, "spatial dim not divisible by blocksize");
    if (x.dims[size_t(d)] >= 0) out.dims[size_t(d)] = x.dims[size_t(d)] / b;
  }
  c.outputs = {out};
  return Status::ok();
}

// CenterCropPad: the listed axes (all by default) take the constant shape operand.
Status centerCropPadShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  std::vector<int64_t> shape;
  if (!c.constInts(1, shape)) {
    c.outputs = {sameAs(x, x.dtype)};
    c.outputs[0].dims.assign(x.dims.size(), kUnknownDim);
    return Status::ok();
  }
  std::vector<int64_t> axes = c.attrs.getInts("axes");
  if (axes.empty())
    for (int64_t d = 0; d < x.rank(); ++d) axes.push_back(d);
  SD_CHECK_ARG(shape.size() == axes.size(), "CenterCropPad shape has ", shape.size(), " entries for ", axes.size(),
               " axes");
  TensorInfo out = x;
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i];
    SD_RETURN_IF_ERROR(normalizeAxis(a, x.rank()));
    SD_CHECK_ARG(shape[i] >= 0, "CenterCropPad shape must be nonnegative");
    out.dims[size_t(a)] = shape[i];
  }
  c.outputs = {out};
  return Status::ok();
}

// ReverseSequence: the input's shape; batch_axis and time_axis are 0 and 1.
Status reverseSequenceShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &lens = c.inputs[1];
  int64_t batch = c.attrs.getInt("batch_axis", 1), time = c.attrs.getInt("time_axis", 0);
  SD_CHECK_ARG(x.rank() >= 2, "ReverseSequence takes a tensor of rank >= 2");
  SD_CHECK_ARG((batch == 0 && time == 1) || (batch == 1 && time == 0), "ReverseSequence batch_axis and time_axis "
               "must be 0 and 1 (either way round)");
  SD_CHECK_ARG(dtypeIsInteger(lens.dtype) && lens.rank() == 1 &&
               (lens.dims[0] < 0 || x.dims[size_t(batch)] < 0 || lens.dims[0] == x.dims[size_t(batch)]),
               "ReverseSequence sequence_lens must be 1-D integers, one per batch entry");
  c.outputs = {x};
  return Status::ok();
}

// TensorScatter: the cache's shape; update matches it but along `axis`.
Status tensorScatterShape(ShapeContext &c) {
  const TensorInfo &cache = c.inputs[0], &update = c.inputs[1];
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "mode", {"linear", "circular"}));
  int64_t axis = c.attrs.getInt("axis", -2);
  SD_RETURN_IF_ERROR(normalizeAxis(axis, cache.rank()));
  SD_CHECK_ARG(axis >= 1, "TensorScatter axis must come after the batch dim");
  SD_CHECK_ARG(update.dtype == cache.dtype && update.rank() == cache.rank(), "TensorScatter update must have the "
               "cache's type and rank");
  for (int64_t d = 0; d < cache.rank(); ++d) {
    int64_t a = cache.dims[size_t(d)], b = update.dims[size_t(d)];
    if (a < 0 || b < 0) continue;
    SD_CHECK_ARG(d == axis ? b <= a : a == b, "TensorScatter update ", formatDims(update.dims),
                 " does not fit cache ", formatDims(cache.dims), " along axis ", axis);
  }
  if (c.hasInput(2))
    SD_CHECK_ARG(dtypeIsInteger(c.inputs[2].dtype) && c.inputs[2].rank() == 1, "TensorScatter write_indices must "
                 "be a 1-D integer tensor");
  c.outputs = {cache};
  return Status::ok();
}

Status topKShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  int64_t axis = c.attrs.getInt("axis", -1);
  SD_RETURN_IF_ERROR(normalizeAxis(axis, x.rank()));
  std::vector<int64_t> k;
  TensorInfo out = x;
  if (c.constInts(1, k) && k.size() == 1) {
    SD_CHECK_ARG(k[0] >= 0 && (x.dims[size_t(axis)] < 0 || k[0] <= x.dims[size_t(axis)]),
                 "TopK k=", k[0], " exceeds axis size ", x.dims[size_t(axis)]);
    out.dims[size_t(axis)] = k[0];
  } else {
    out.dims[size_t(axis)] = kUnknownDim;
  }
  c.outputs = {out, sameAs(out, DType::I64)};
  return Status::ok();
}

// TopK with a run-time k: the whole axis as the bound, and the count (k).
Status topKBoundedShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &k = c.inputs[1];
  int64_t axis = c.attrs.getInt("axis", -1);
  SD_RETURN_IF_ERROR(normalizeAxis(axis, x.rank()));
  SD_CHECK_ARG(dtypeIsInteger(k.dtype) && k.numElements() == 1, "TopK k must be one integer");
  c.outputs = {x, sameAs(x, DType::I64), TensorInfo{DType::I64, {}}};
  return Status::ok();
}

Status triluShape(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs[0].rank() >= 2, "Trilu input must have rank >= 2");
  c.outputs = {c.inputs[0]};
  return Status::ok();
}

Status cumSumShape(ShapeContext &c) {
  c.outputs = {c.inputs[0]};
  return Status::ok();
}

} // namespace

void registerMovementShapes() {
  registerShapeRule("Reshape", reshapeShape);
  registerShapeRule("Transpose", transposeShape);
  registerShapeRule("Concat", concatShape);
  registerShapeRule("Split", splitShape);
  registerShapeRule("Slice", sliceShape);
  registerShapeRule("Gather", gatherShape);
  registerShapeRule("GatherElements", gatherElementsShape);
  registerShapeRule("GatherND", gatherNDShape);
  registerShapeRule("ScatterElements", scatterShape);
  registerShapeRule("ScatterND", scatterShape);
  registerShapeRule("Expand", expandShape);
  registerShapeRule("Squeeze", squeezeShape);
  registerShapeRule("Unsqueeze", unsqueezeShape);
  registerShapeRule("Flatten", flattenShape);
  registerShapeRule("Shape", shapeShape);
  registerShapeRule("Size", sizeShape);
  registerShapeRule("ConstantOfShape", constantOfShapeShape);
  registerShapeRule("EyeLike", eyeLikeShape);
  registerShapeRule("OneHot", oneHotShape);
  registerShapeRule("Range", rangeShape);
  registerShapeRule("Tile", tileShape);
  registerShapeRule("Pad", padShape);
  registerShapeRule("DepthToSpace", depthToSpaceShape);
  registerShapeRule("SpaceToDepth", spaceToDepthShape);
  registerShapeRule("TopK", topKShape);
  registerShapeRule("TopKBounded", topKBoundedShape);
  registerShapeRule("CenterCropPad", centerCropPadShape);
  registerShapeRule("TensorScatter", tensorScatterShape);
  registerShapeRule("ReverseSequence", reverseSequenceShape);
  registerShapeRule("Trilu", triluShape);
  registerShapeRule("CumSum", cumSumShape);
  registerShapeRule("CumProd", cumSumShape);
}

} // namespace sd
