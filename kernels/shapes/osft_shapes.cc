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

// OsftCoefficients(x0, high0, x1, high1, ...) {sides} -> f32 [sum of k_i r_i].
Status osftCoefficientsShape(ShapeContext &c) {
  std::vector<int64_t> sides = c.attrs.getInts("sides");
  SD_CHECK_ARG(c.inputs.size() % 2 == 0 && sides.size() * 2 == c.inputs.size(),
               "OsftCoefficients takes (x, high) pairs and one side per pair: ", c.inputs.size(), " operands, ",
               sides.size(), " sides");
  int64_t total = 0;
  for (size_t p = 0; p < sides.size(); ++p) {
    const TensorInfo &x = c.inputs[2 * p], &h = c.inputs[2 * p + 1];
    SD_CHECK_ARG(sides[p] == 0 || sides[p] == 1, "OsftCoefficients side must be 0 (U) or 1 (V), got ", sides[p]);
    SD_CHECK_ARG(x.dtype == DType::F32 && h.dtype == DType::F32, "OsftCoefficients takes f32 tensors");
    SD_CHECK_ARG(x.rankKnown && h.rankKnown && x.isStatic() && h.isStatic() && x.rank() == 2 && h.rank() == 2,
                 "OsftCoefficients pair ", p, " must be static 2-D tensors");
    bool u = sides[p] == 0;
    SD_CHECK_ARG(u ? x.dims[0] == h.dims[0] : x.dims[1] == h.dims[1], "OsftCoefficients pair ", p, ": ",
                 formatDims(x.dims), " and subspace ", formatDims(h.dims), " do not share the ",
                 u ? "row" : "column", " dimension");
    total += (u ? h.dims[1] * x.dims[1] : x.dims[0] * h.dims[0]);
  }
  TensorInfo out;
  out.dtype = DType::F32;
  out.dims = {total};
  c.outputs = {out};
  return Status::ok();
}

// OsftDeflate(x, high, coefficients) {side, offset} -> x.
Status osftDeflateShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &h = c.inputs[1], &coef = c.inputs[2];
  int64_t side = c.attrs.getInt("side", -1), offset = c.attrs.getInt("offset", -1);
  SD_CHECK_ARG(side == 0 || side == 1, "OsftDeflate side must be 0 (U) or 1 (V), got ", side);
  SD_CHECK_ARG(x.dtype == DType::F32 && h.dtype == DType::F32 && coef.dtype == DType::F32,
               "OsftDeflate takes f32 tensors");
  SD_CHECK_ARG(x.rankKnown && h.rankKnown && coef.rankKnown && x.isStatic() && h.isStatic() && coef.isStatic() &&
                   x.rank() == 2 && h.rank() == 2 && coef.rank() == 1,
               "OsftDeflate takes static 2-D x and subspace and 1-D coefficients");
  bool u = side == 0;
  SD_CHECK_ARG(u ? x.dims[0] == h.dims[0] : x.dims[1] == h.dims[1], "OsftDeflate: ", formatDims(x.dims),
               " and subspace ", formatDims(h.dims), " do not share the ", u ? "row" : "column", " dimension");
  int64_t need = u ? h.dims[1] * x.dims[1] : x.dims[0] * h.dims[0];
  SD_CHECK_ARG(offset >= 0 && offset + need <= coef.dims[0], "OsftDeflate coefficients [", offset, ", ",
               offset + need, ") fall outside the buffer of ", coef.dims[0]);
  c.outputs = {x};
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
