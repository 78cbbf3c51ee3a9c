// Shape rules of the backward contracts the autodiff pass emits, of the
// optimizer updates and of training-time dropout. Backward outputs take the shape of the forward operand
// they differentiate; updates write their state operands in place.
#include "sd/ops/index_geometry.h"
#include "sd/ops/math/optimizer.h"
#include "sd/ops/window_geometry.h"
#include "shape_util.h"

namespace sd {
namespace {

Status requireSameDims(const TensorInfo &a, const TensorInfo &b, const char *what) {
  if (a.rankKnown && b.rankKnown && a.dims != b.dims)
    return sdError(what, ": shapes differ: ", formatDims(a.dims), " vs ", formatDims(b.dims));
  return Status::ok();
}

// SoftmaxGrad / LogSoftmaxGrad / GeluGrad (dy, forward tensor) -> dx.
Status pointwiseGradShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(requireSameDims(c.inputs[0], c.inputs[1], "gradient"));
  c.outputs = {c.inputs[1]};
  return Status::ok();
}

// A norm gradient's sums (sd-norm-grad-sum): the accumulate operand (x's
// shape, f32 or f64 as x, or none) and further summands of dy (dy's shape and type).
Status checkNormGradSums(ShapeContext &c, const char *what) {
  if (c.hasInput(3)) {
    SD_RETURN_IF_ERROR(checkNormAccumulateType(c.inputs[1].dtype, c.inputs[3].dtype, what));
    SD_RETURN_IF_ERROR(requireSameDims(c.inputs[3], c.inputs[1], what));
  }
  for (size_t i = 4; i < c.inputs.size(); ++i) {
    SD_CHECK_ARG(c.hasInput(i), what, ": dy's summand (operand ", i, ") is missing");
    SD_RETURN_IF_ERROR(checkNormGradTermType(c.inputs[0].dtype, c.inputs[i].dtype, i, what));
    SD_RETURN_IF_ERROR(requireSameDims(c.inputs[i], c.inputs[0], what));
  }
  return Status::ok();
}

// With narrow_type (16 bf16, 10 f16), one more result: dx rounded to that type (an f32 x's).
Status narrowedInputGrad(ShapeContext &c, const char *what) {
  if (!c.attrs.has("narrow_type")) return Status::ok();
  const int64_t to = c.attrs.getInt("narrow_type", 0);
  SD_CHECK_ARG((to == int64_t(DType::BF16) || to == int64_t(DType::F16)) && c.inputs[1].dtype == DType::F32, what,
               ": narrow_type ", to, " is not bf16 (16) or f16 (10) for an f32 x; x is ",
               dtypeName(c.inputs[1].dtype));
  c.outputs.push_back(TensorInfo{DType(to), c.inputs[1].dims});
  return Status::ok();
}

// LayerNormalizationGrad(dy, x, scale[, accumulate[, dy summands]]) -> dx (+ accumulate), dscale, dbias[, narrowed dx].
Status layerNormGradShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(requireSameDims(c.inputs[0], c.inputs[1], "LayerNormalizationGrad"));
  SD_RETURN_IF_ERROR(checkNormGradSums(c, "LayerNormalizationGrad"));
  c.outputs = {c.inputs[1], c.inputs[2], c.inputs[2]};
  return narrowedInputGrad(c, "LayerNormalizationGrad");
}

// RMSNormalizationGrad(dy, x, scale[, accumulate[, dy summands]]) -> dx (+ accumulate), dscale[, narrowed dx].
Status rmsNormGradShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(requireSameDims(c.inputs[0], c.inputs[1], "RMSNormalizationGrad"));
  SD_RETURN_IF_ERROR(checkNormGradSums(c, "RMSNormalizationGrad"));
  c.outputs = {c.inputs[1], c.inputs[2]};
  return narrowedInputGrad(c, "RMSNormalizationGrad");
}

// GatherGrad(dy, indices) {axis, data_shape} -> d(data): scatter-add of dy rows.
Status gatherGradShape(ShapeContext &c) {
  std::vector<int64_t> data = c.attrs.getInts("data_shape");
  int64_t axis = c.attrs.getInt("axis", 0);
  SD_RETURN_IF_ERROR(normalizeAxis(axis, int64_t(data.size())));
  for (int64_t d : data) SD_CHECK_ARG(d >= 0, "GatherGrad data_shape must be static");
  const TensorInfo &dy = c.inputs[0], &idx = c.inputs[1];
  if (dy.rankKnown && idx.rankKnown) {
    Dims want(data.begin(), data.begin() + axis);
    want.insert(want.end(), idx.dims.begin(), idx.dims.end());
    want.insert(want.end(), data.begin() + axis + 1, data.end());
    if (dy.isStatic() && idx.isStatic() && want != dy.dims)
      return sdError("GatherGrad: gradient ", formatDims(dy.dims), " does not match ", formatDims(want));
  }
  TensorInfo out;
  out.dtype = dy.dtype;
  out.dims.assign(data.begin(), data.end());
  c.outputs = {out};
  return Status::ok();
}

// SoftmaxCrossEntropyLossGrad(dloss, logits, labels) -> dlogits.
Status sceGradShape(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs[0].rank() == 0 || !c.inputs[0].rankKnown, "SoftmaxCrossEntropyLossGrad: dloss must be a scalar");
  SD_CHECK_ARG(c.inputs[1].rank() >= 2, "SoftmaxCrossEntropyLossGrad: logits must have rank >= 2");
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "reduction", {"mean", "sum"}));
  c.outputs = {c.inputs[1]};
  return Status::ok();
}

// ConvGradWeight(dy, x) {conv attributes, kernel_shape required} -> dW [M, C/group, kernel...].
Status convGradWeightShape(ShapeContext &c) {
  const TensorInfo &dy = c.inputs[0], &x = c.inputs[1];
  Dims kernel = c.attrs.getInts("kernel_shape");
  int64_t group = c.attrs.getInt("group", 1);
  SD_CHECK_ARG(x.isStatic() && dy.isStatic() && x.rank() >= 3 && dy.rank() == x.rank(),
               "ConvGradWeight needs static [N, C, ...] operands of one rank");
  SD_CHECK_ARG(size_t(x.rank()) == kernel.size() + 2, "ConvGradWeight needs kernel_shape for each spatial dim");
  SD_CHECK_ARG(group >= 1 && x.dims[1] % group == 0 && dy.dims[1] % group == 0, "ConvGradWeight: bad group ", group);
  WindowGeometry g;
  SD_RETURN_IF_ERROR(resolveWindows(c.attrs, Dims(x.dims.begin() + 2, x.dims.end()), kernel, false, g));
  if (Dims(dy.dims.begin() + 2, dy.dims.end()) != g.out)
    return sdError("ConvGradWeight: gradient ", formatDims(dy.dims), " does not match the conv output");
  TensorInfo out;
  out.dtype = dy.dtype;
  out.dims = {dy.dims[1], x.dims[1] / group};
  out.dims.insert(out.dims.end(), kernel.begin(), kernel.end());
  c.outputs = {out};
  return Status::ok();
}

// MaxPoolGrad / AveragePoolGrad(dy, x) {pool attributes} -> dx shaped like x.
Status poolGradShape(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs[1].rank() >= 3, "pool gradient: input must be [N, C, ...]");
  c.outputs = {c.inputs[1]};
  return Status::ok();
}

// An attention gradient's operands `at` and `at` + 1: the forward's output
// and row statistics (sd-attention-stats), both or neither.
Status checkForwardStats(const ShapeContext &c, size_t at, const TensorInfo &dy, const Dims &y, bool tokenMajor,
                         const char *op) {
  SD_CHECK_ARG(c.hasInput(at) == c.hasInput(at + 1), op, " takes the forward's output and statistics together");
  if (!c.hasInput(at)) return Status::ok();
  SD_CHECK_ARG(c.inputs[at].dims == y && c.inputs[at].dtype == dy.dtype, op, ": the forward's output ",
               formatDims(c.inputs[at].dims), " is not ", formatDims(y));
  const Dims rows = attentionRowDims(y, tokenMajor);
  SD_CHECK_ARG(c.inputs[at + 1].dtype == DType::F32 && c.inputs[at + 1].dims == rows, op, ": statistics ",
               formatDims(c.inputs[at + 1].dims), " are not f32 ", formatDims(rows));
  return Status::ok();
}

// AttentionGrad(dy, q, kt, v, mask, positions, y, lse) -> dq, dkt, dv; q, kt and v share their batch dims.
Status attentionGradShape(ShapeContext &c) {
  const TensorInfo &dy = c.inputs[0], &q = c.inputs[1], &kt = c.inputs[2], &v = c.inputs[3];
  SD_CHECK_ARG(q.isStatic() && kt.isStatic() && v.isStatic() && dy.isStatic() && q.rank() >= 2 &&
                   kt.rank() == q.rank() && v.rank() == q.rank(),
               "AttentionGrad needs static q, kt, v of one rank");
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "layout", {"bhtd", "bshd"}));
  const bool tokenMajor = c.attrs.getString("layout", "bhtd") == "bshd";
  Dims want;
  if (tokenMajor) {
    Dims scores;
    SD_RETURN_IF_ERROR(tokenMajorAttentionDims(q, kt, v, scores, want));
  } else {
    Dims batch(q.dims.begin(), q.dims.end() - 2);
    SD_CHECK_ARG(Dims(kt.dims.begin(), kt.dims.end() - 2) == batch && Dims(v.dims.begin(), v.dims.end() - 2) == batch,
                 "AttentionGrad: q, kt and v must have the same batch dims (no broadcasting)");
    want = batch;
    want.push_back(q.dims[q.dims.size() - 2]);
    want.push_back(v.dims.back());
  }
  if (dy.dims != want) return sdError("AttentionGrad: gradient ", formatDims(dy.dims), " is not ", formatDims(want));
  if (c.hasInput(5)) SD_RETURN_IF_ERROR(checkAttentionPositions(q, kt, c.inputs[5], tokenMajor));
  SD_RETURN_IF_ERROR(checkForwardStats(c, 6, dy, want, tokenMajor, "AttentionGrad"));
  c.outputs = {q, kt, v};
  return Status::ok();
}

// QkvAttentionGrad(dy, qkv, mask, positions, y, lse) {kv_heads} -> dqkv shaped like qkv.
Status qkvAttentionGradShape(ShapeContext &c) {
  const TensorInfo &dy = c.inputs[0], &qkv = c.inputs[1];
  TensorInfo q, k, v;
  SD_RETURN_IF_ERROR(qkvAttentionParts(qkv, c.attrs, q, k, v));
  const Dims want = q.dims; // y [B, T, H, d]
  if (dy.dims != want || dy.dtype != qkv.dtype)
    return sdError("QkvAttentionGrad: gradient ", formatDims(dy.dims), " is not ", dtypeName(qkv.dtype), " ",
                   formatDims(want));
  if (c.hasInput(3)) SD_RETURN_IF_ERROR(checkAttentionPositions(q, k, c.inputs[3], true));
  SD_RETURN_IF_ERROR(checkForwardStats(c, 4, dy, want, true, "QkvAttentionGrad"));
  c.outputs = {qkv};
  return Status::ok();
}

// SeededDropout(x, rng int64[2]) {ratio, stream} -> y shaped like x.
Status seededDropoutShape(ShapeContext &c) {
  const TensorInfo &rng = c.inputs[1];
  SD_CHECK_ARG(dtypeIsFloat(c.inputs[0].dtype), "SeededDropout needs a float input");
  SD_CHECK_ARG(rng.dtype == DType::I64 && (!rng.rankKnown || rng.numElements() == 2 || rng.numElements() == 4),
               "SeededDropout: rng must be int64[4] (seed, counter, row offset, rows) or int64[2] (seed, counter)");
  double ratio = c.attrs.getFloat("ratio", 0.0);
  SD_CHECK_ARG(ratio >= 0.0 && ratio < 1.0, "SeededDropout: ratio ", ratio, " is outside [0, 1)");
  c.outputs = {c.inputs[0]};
  return Status::ok();
}

// SeededRandom(like, rng) {normal, a, b, stream} -> shaped like `like`.
Status seededRandomShape(ShapeContext &c) {
  const TensorInfo &rng = c.inputs[1];
  SD_CHECK_ARG(dtypeIsFloat(c.inputs[0].dtype), "SeededRandom draws floats, not ", dtypeName(c.inputs[0].dtype));
  SD_CHECK_ARG(rng.dtype == DType::I64 && (!rng.rankKnown || rng.numElements() == 2 || rng.numElements() == 4),
               "SeededRandom: rng must be int64[4] (seed, counter, row offset, rows) or int64[2] (seed, counter)");
  c.outputs = {c.inputs[0]};
  return Status::ok();
}

TensorInfo scalarF32() {
  TensorInfo t;
  t.dtype = DType::F32;
  return t;
}

Status requireScalars(const ShapeContext &c, size_t from, size_t to, const char *op) {
  for (size_t i = from; i < to; ++i)
    if (c.inputs[i].rankKnown && c.inputs[i].numElements() != 1)
      return sdError(op, ": operand ", i, " must hold one value, got ", formatDims(c.inputs[i].dims));
  return Status::ok();
}

// AdamW(param, grad, m, v, step, lr, weight_decay, grad_scale[, skip]) -> param, m, v, grad (zeroed).
Status adamwShape(ShapeContext &c) {
  for (size_t i = 1; i < 4; ++i) SD_RETURN_IF_ERROR(requireSameDims(c.inputs[0], c.inputs[i], "AdamW"));
  SD_RETURN_IF_ERROR(requireScalars(c, 4, c.inputs.size(), "AdamW"));
  c.outputs = {c.inputs[0], c.inputs[2], c.inputs[3], c.inputs[1]};
  return Status::ok();
}

// GroupedAdamW(step, lr, weight_decay, grad_scale, skip | none, params..., grads..., exp_avgs..., exp_avg_sqs...)
// -> params..., exp_avgs..., exp_avg_sqs..., grads... (zeroed): N AdamW updates, `decay` one flag each.
Status groupedAdamwShape(ShapeContext &c) {
  const size_t first = math::kGroupedAdamWScalars, tensors = c.inputs.size() > first ? c.inputs.size() - first : 0;
  const size_t n = tensors / 4;
  SD_CHECK_ARG(tensors > 0 && tensors % 4 == 0, "GroupedAdamW: ", tensors,
               " tensor operands, not 4 (param, grad, exp_avg, exp_avg_sq) per updated tensor");
  SD_CHECK_ARG(c.attrs.getInts("decay").size() == n, "GroupedAdamW: ", c.attrs.getInts("decay").size(),
               " decay flags for ", n, " tensors");
  SD_RETURN_IF_ERROR(requireScalars(c, 0, 4, "GroupedAdamW"));
  if (c.hasInput(4)) SD_RETURN_IF_ERROR(requireScalars(c, 4, 5, "GroupedAdamW"));
  c.outputs.assign(tensors, TensorInfo{});
  for (size_t i = 0; i < n; ++i) {
    const TensorInfo &param = c.inputs[first + i];
    for (size_t k = 1; k < 4; ++k) SD_RETURN_IF_ERROR(requireSameDims(param, c.inputs[first + k * n + i], "GroupedAdamW"));
    c.outputs[i] = param;                           // param
    c.outputs[n + i] = c.inputs[first + 2 * n + i]; // exp_avg
    c.outputs[2 * n + i] = c.inputs[first + 3 * n + i];
    c.outputs[3 * n + i] = c.inputs[first + n + i]; // the zeroed grad
  }
  return Status::ok();
}

// SGD(param, grad, momentum_buffer, step, lr, weight_decay, grad_scale[, skip]) -> param, buffer, grad (zeroed).
Status sgdShape(ShapeContext &c) {
  for (size_t i = 1; i < 3; ++i) SD_RETURN_IF_ERROR(requireSameDims(c.inputs[0], c.inputs[i], "SGD"));
  SD_RETURN_IF_ERROR(requireScalars(c, 3, c.inputs.size(), "SGD"));
  c.outputs = {c.inputs[0], c.inputs[2], c.inputs[1]};
  return Status::ok();
}

// GradScale(tokens, max_norm, grads...) -> scale, norm: the factor that turns
// accumulated sums into means over the counted tokens and clips the global norm.
Status gradScaleShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(requireScalars(c, 0, 2, "GradScale"));
  c.outputs = {scalarF32(), scalarF32()};
  return Status::ok();
}

} // namespace

void registerGradientShapes() {
  for (const char *op : {"SoftmaxGrad", "LogSoftmaxGrad", "GeluGrad"}) registerShapeRule(op, pointwiseGradShape);
  registerShapeRule("LayerNormalizationGrad", layerNormGradShape);
  registerShapeRule("RMSNormalizationGrad", rmsNormGradShape);
  registerShapeRule("GatherGrad", gatherGradShape);
  registerShapeRule("SoftmaxCrossEntropyLossGrad", sceGradShape);
  registerShapeRule("ConvGradWeight", convGradWeightShape);
  registerShapeRule("MaxPoolGrad", poolGradShape);
  registerShapeRule("AveragePoolGrad", poolGradShape);
  registerShapeRule("SeededDropout", seededDropoutShape);
  registerShapeRule("SeededRandom", seededRandomShape);
  registerShapeRule("AttentionGrad", attentionGradShape);
  registerShapeRule("QkvAttentionGrad", qkvAttentionGradShape);
  registerShapeRule("AdamW", adamwShape);
  registerShapeRule("GroupedAdamW", groupedAdamwShape);
  registerShapeRule("SGD", sgdShape);
  registerShapeRule("GradScale", gradScaleShape);
}

} // namespace sd
