// Shape rules of orthogonal subspace fine-tuning (sd-peft-osft): the
// factorized linear, its gradient, the dense rebuild of W and the gradient
// projection steps. U is [out, k], S [k], V [k, in] for both halves.
#include "shape_util.h"

namespace sd {
namespace {

constexpr int64_t kUnknown = -1;

bool known(int64_t d) { return d >= 0; }

// Checks one factor triple (U, S, V) of rank-2, rank-1, rank-2 with a shared
// rank and updates out/in from it; `what` names the half in errors.
Status checkFactors(const TensorInfo &u, const TensorInfo &s, const TensorInfo &v, const char *what, int64_t &out,
                    int64_t &in) {
  if (!u.rankKnown || !s.rankKnown || !v.rankKnown) return Status::ok();
  SD_CHECK_ARG(u.rank() == 2 && s.rank() == 1 && v.rank() == 2, "OSFT ", what, " factors must be U [out, k], S [k], ",
               "V [k, in], got ", formatDims(u.dims), ", ", formatDims(s.dims), ", ", formatDims(v.dims));
  int64_t k = s.dims[0];
  auto agree = [](int64_t a, int64_t b) { return !known(a) || !known(b) || a == b; };
  SD_CHECK_ARG(agree(u.dims[1], k) && agree(v.dims[0], k), "OSFT ", what, " factors disagree on the rank: U ",
               formatDims(u.dims), ", S ", formatDims(s.dims), ", V ", formatDims(v.dims));
  SD_CHECK_ARG(agree(out, u.dims[0]) && agree(in, v.dims[1]), "OSFT ", what, " factors are ", formatDims(u.dims),
               " and ", formatDims(v.dims), ", the other half is ", out, " x ", in);
  if (known(u.dims[0])) out = u.dims[0];
  if (known(v.dims[1])) in = v.dims[1];
  return Status::ok();
}

Status checkBothHalves(const ShapeContext &c, size_t first, int64_t &out, int64_t &in) {
  for (size_t i = first; i < first + 6; ++i)
    SD_CHECK_ARG(c.inputs[i].dtype == DType::F32, "OSFT factors are f32, operand ", i, " is ",
                 dtypeName(c.inputs[i].dtype));
  SD_RETURN_IF_ERROR(checkFactors(c.inputs[first], c.inputs[first + 1], c.inputs[first + 2], "high", out, in));
  return checkFactors(c.inputs[first + 3], c.inputs[first + 4], c.inputs[first + 5], "low", out, in);
}

// OsftLinear(x [..., in], U_high, S_high, V_high, U_low, S_low, V_low, bias [out]?) -> [..., out].
Status osftLinearShape(ShapeContext &c) {
  int64_t out = kUnknown, in = kUnknown;
  SD_RETURN_IF_ERROR(checkBothHalves(c, 1, out, in));
  const TensorInfo &x = c.inputs[0];
  SD_CHECK_ARG(x.dtype == DType::F32, "OsftLinear input must be f32, got ", dtypeName(x.dtype));
  TensorInfo y = x;
  if (x.rankKnown) {
    SD_CHECK_ARG(x.rank() >= 1, "OsftLinear input must have at least one dimension");
    SD_CHECK_ARG(!known(in) || !known(x.dims.back()) || x.dims.back() == in, "OsftLinear input ",
                 formatDims(x.dims), " does not match factors of ", in, " inputs");
    y.dims.back() = out;
  }
  if (c.hasInput(7) && c.inputs[7].rankKnown)
    SD_CHECK_ARG(c.inputs[7].rank() == 1 && (!known(out) || !known(c.inputs[7].dims[0]) || c.inputs[7].dims[0] == out),
                 "OsftLinear bias must be [", out, "], got ", formatDims(c.inputs[7].dims));
  c.outputs = {y};
  return Status::ok();
}

// OsftLinearGrad(dy, x, factors...) -> dx, dU_low, dS_low, dV_low.
Status osftLinearGradShape(ShapeContext &c) {
  int64_t out = kUnknown, in = kUnknown;
  SD_RETURN_IF_ERROR(checkBothHalves(c, 2, out, in));
  const TensorInfo &dy = c.inputs[0], &x = c.inputs[1];
  SD_CHECK_ARG(dy.dtype == DType::F32 && x.dtype == DType::F32, "OsftLinearGrad takes f32 tensors");
  if (dy.rankKnown && x.rankKnown && dy.isStatic() && x.isStatic()) {
    SD_CHECK_ARG(dy.rank() == x.rank() && x.rank() >= 1 && x.dims.back() == in && dy.dims.back() == out &&
                     product(dy.dims) / std::max<int64_t>(out, 1) == product(x.dims) / std::max<int64_t>(in, 1),
                 "OsftLinearGrad: gradient ", formatDims(dy.dims), " does not match input ", formatDims(x.dims),
                 " for ", out, " x ", in, " factors");
  }
  c.outputs = {x, c.inputs[5], c.inputs[6], c.inputs[7]};
  return Status::ok();
}

// OsftCompose(factors...) -> W [out, in].
Status osftComposeShape(ShapeContext &c) {
  int64_t out = kUnknown, in = kUnknown;
  SD_RETURN_IF_ERROR(checkBothHalves(c, 0, out, in));
  TensorInfo w;
  w.dtype = DType::F32;
  w.dims = {out, in};
  c.outputs = {w};
  return Status::ok();
}

// OsftComposeGrad(dW, U_low, S_low, V_low) -> dU_low, dS_low, dV_low.
Status osftComposeGradShape(ShapeContext &c) {
  int64_t out = kUnknown, in = kUnknown;
  for (size_t i = 0; i < 4; ++i)
    SD_CHECK_ARG(c.inputs[i].dtype == DType::F32, "OsftComposeGrad takes f32 tensors, operand ", i, " is ",
                 dtypeName(c.inputs[i].dtype));
  SD_RETURN_IF_ERROR(checkFactors(c.inputs[1], c.inputs[2], c.inputs[3], "low", out, in));
  const TensorInfo &dw = c.inputs[0];
  if (dw.rankKnown)
    SD_CHECK_ARG(dw.rank() == 2 && (!known(out) || dw.dims[0] == out) && (!known(in) || dw.dims[1] == in),
                 "OsftComposeGrad: gradient ", formatDims(dw.dims), " is not ", out, " x ", in);
  c.outputs = {c.inputs[1], c.inputs[2], c.inputs[3]};
  return Status::ok();
}

// The (x, high) pairs from operand `first` on, one side each: checks them and
// returns the coefficient count, sum of k_i r_i.
StatusOr<int64_t> coefficientCount(const ShapeContext &c, size_t first, const char *op) {
  std::vector<int64_t> sides = c.attrs.getInts("sides");
  SD_CHECK_ARG(c.inputs.size() >= first && (c.inputs.size() - first) % 2 == 0 &&
                   sides.size() * 2 == c.inputs.size() - first && !sides.empty(),
               op, " takes (x, high) pairs and one side per pair: ", c.inputs.size() - first, " operands, ",
               sides.size(), " sides");
  int64_t total = 0;
  for (size_t p = 0; p < sides.size(); ++p) {
    const TensorInfo &x = c.inputs[first + 2 * p], &h = c.inputs[first + 2 * p + 1];
    SD_CHECK_ARG(sides[p] == 0 || sides[p] == 1, op, " side must be 0 (U) or 1 (V), got ", sides[p]);
    SD_CHECK_ARG(x.dtype == DType::F32 && h.dtype == DType::F32, op, " takes f32 tensors");
    SD_CHECK_ARG(x.rankKnown && h.rankKnown && x.isStatic() && h.isStatic() && x.rank() == 2 && h.rank() == 2, op,
                 " pair ", p, " must be static 2-D tensors");
    bool u = sides[p] == 0;
    SD_CHECK_ARG(u ? x.dims[0] == h.dims[0] : x.dims[1] == h.dims[1], op, " pair ", p, ": ", formatDims(x.dims),
                 " and subspace ", formatDims(h.dims), " do not share the ", u ? "row" : "column", " dimension");
    total += (u ? h.dims[1] * x.dims[1] : x.dims[0] * h.dims[0]);
  }
  return total;
}

// OsftCoefficients(x0, high0, x1, high1, ...) {sides} -> f32 [sum of k_i r_i].
Status osftCoefficientsShape(ShapeContext &c) {
  auto total = coefficientCount(c, 0, "OsftCoefficients");
  if (!total.isOk()) return total.status();
  TensorInfo out;
  out.dtype = DType::F32;
  out.dims = {total.value()};
  c.outputs = {out};
  return Status::ok();
}

// OsftDeflate(coefficients, x0, high0, ...) {sides} -> x0, x1, ...
Status osftDeflateShape(ShapeContext &c) {
  SD_CHECK_ARG(!c.inputs.empty(), "OsftDeflate takes the coefficients and (x, high) pairs");
  auto total = coefficientCount(c, 1, "OsftDeflate");
  if (!total.isOk()) return total.status();
  const TensorInfo &coef = c.inputs[0];
  SD_CHECK_ARG(coef.dtype == DType::F32 && coef.rankKnown && coef.rank() == 1 && coef.dims[0] == total.value(),
               "OsftDeflate coefficients must be f32 [", total.value(), "], got ", formatDims(coef.dims));
  SD_CHECK_ARG(c.numOutputs * 2 + 1 == c.inputs.size(), "OsftDeflate has one result per pair");
  c.outputs.clear();
  for (size_t p = 1; p < c.inputs.size(); p += 2) c.outputs.push_back(c.inputs[p]);
  return Status::ok();
}

} // namespace

void registerOsftShapes() {
  registerShapeRule("OsftLinear", osftLinearShape);
  registerShapeRule("OsftLinearGrad", osftLinearGradShape);
  registerShapeRule("OsftCompose", osftComposeShape);
  registerShapeRule("OsftComposeGrad", osftComposeGradShape);
  registerShapeRule("OsftCoefficients", osftCoefficientsShape);
  registerShapeRule("OsftDeflate", osftDeflateShape);
}

} // namespace sd
