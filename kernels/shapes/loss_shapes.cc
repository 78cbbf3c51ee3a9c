// Shape rules for SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.
#include "shape_util.h"

namespace sd {

static Status lossShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0], &t = c.inputs[1];
  SD_CHECK_ARG(dtypeIsFloat(x.dtype), "loss input must be float");
  SD_CHECK_ARG(dtypeIsInteger(t.dtype), "loss target must be integer");
  SD_CHECK_ARG(x.rank() >= 2, "loss input must be [N, C, ...]");
  SD_CHECK_ARG(t.rank() == x.rank() - 1, "loss target rank ", t.rank(), " must be input rank - 1");
  for (int64_t d = 0; d < t.rank(); ++d) {
    int64_t xd = x.dims[size_t(d == 0 ? 0 : d + 1)], td = t.dims[size_t(d)];
    SD_CHECK_ARG(xd < 0 || td < 0 || xd == td, "loss target shape ", formatDims(t.dims), " does not match input ",
                 formatDims(x.dims));
  }
  if (c.hasInput(2))
    SD_CHECK_ARG(c.inputs[2].rank() == 1 && (c.inputs[2].dims[0] == x.dims[1] || x.dims[1] < 0),
                 "loss weight must be [C]");
  std::string red = c.attrs.getString("reduction", "mean");
  SD_CHECK_ARG(red == "mean" || red == "sum" || red == "none", "unknown reduction '", red, "'");
  // f32_loss: half scores, an f32 loss and log_prob (SoftmaxCrossEntropyLoss's attribute).
  const bool f32Loss = c.attrs.getInt("f32_loss", 0) != 0;
  SD_CHECK_ARG(!f32Loss || dtypeIsHalf(x.dtype) || x.dtype == DType::F32, "f32_loss takes f32, bf16 or f16 scores");
  TensorInfo out, logProb = x;
  out.dtype = f32Loss ? DType::F32 : x.dtype;
  logProb.dtype = out.dtype;
  if (red == "none") out.dims = t.dims;
  c.outputs = {out, logProb};
  return Status::ok();
}

void registerLossShapes() {
  registerShapeRule("SoftmaxCrossEntropyLoss", lossShape);
  registerShapeRule("NegativeLogLikelihoodLoss", lossShape);
}

} // namespace sd
