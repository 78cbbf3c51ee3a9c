// Reverse-mode rule of Rotary: a rotation's gradient is the transposed
// rotation by the same angles, so the backward is one more Rotary kernel.
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

LogicalResult rotaryVJP(RotaryOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (need[1] || need[2]) return op.emitError("Rotary: the cos/sin angles are not differentiable");
  if (!need[0]) return success();
  SmallVector<NamedAttribute> attrs = g.attrsOf(op, {"interleaved"});
  attrs.push_back(g.attr("transposed", op.getTransposed().value_or(0) ? int64_t(0) : int64_t(1)));
  dx[0] = g.make<RotaryOp>({dy[0], op.getCos(), op.getSin(), op.getPositions()}, attrs);
  return dx[0] ? success() : failure();
}

} // namespace

void attachRotaryVJPs(MLIRContext *ctx) { attachVJP<RotaryOp, rotaryVJP>(ctx); }

} // namespace sd::ir
