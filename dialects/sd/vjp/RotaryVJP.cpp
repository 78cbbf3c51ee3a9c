// Reverse-mode rule of Rotary: a rotation's gradient is the transposed
// rotation by the same angles, so the backward is one more Rotary kernel.
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

// cos and sin are tables (buffers of the source model, never its parameters):
// they get no gradient, so full fine-tuning, which marks every float weight
// trainable, leaves a table the exporter stored as a weight frozen
// (sd-autodiff re-freezes weights no gradient reached), as PyTorch would.
LogicalResult rotaryVJP(RotaryOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (!need[0]) return success();
  SmallVector<NamedAttribute> attrs = g.attrsOf(op, {"interleaved", "seq_axis", "rotated_heads"});
  attrs.push_back(g.attr("transposed", op.getTransposed().value_or(0) ? int64_t(0) : int64_t(1)));
  dx[0] = g.make<RotaryOp>({dy[0], op.getCos(), op.getSin(), op.getPositions()}, attrs);
  return dx[0] ? success() : failure();
}

} // namespace

void attachRotaryVJPs(MLIRContext *ctx) { attachVJP<RotaryOp, rotaryVJP>(ctx); }

} // namespace sd::ir
