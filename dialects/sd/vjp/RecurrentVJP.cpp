// Reverse-mode rule of Recurrence (one direction of an ONNX RNN/GRU/LSTM):
// one RecurrenceGrad over the saved per-step values. The input projection
// before it (xw = X·Wᵀ + biases) is ordinary MatMul/Add and has its own rules.
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

LogicalResult recurrenceVJP(RecurrenceOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (dy.size() > 3 && dy[3]) return op.emitError("Recurrence: its saved values are not differentiable");
  if (need[6]) return op.emitError("Recurrence: sequence_lens is not differentiable");
  Value grad = dy[0] ? dy[0] : g.zeros(op.getY().getType());
  Value gradH = dy[1] ? dy[1] : g.none(), gradC = dy[2] ? dy[2] : g.none();
  SmallVector<NamedAttribute> attrs = g.attrsOf(op, {"cell", "reverse", "clip", "input_forget", "linear_before_reset",
                                                     "activations", "activation_alpha", "activation_beta"});
  Operation *back = g.op<RecurrenceGradOp>({grad, op.getSaved(), op.getR(), gradH, gradC, op.getPeepholes(),
                                            op.getSequenceLens()},
                                           attrs, 6);
  if (!back) return failure();
  // Operands xw, r, initial_h, initial_c, peepholes, reset_bias map to results 0..5.
  for (unsigned i = 0; i < 6 && i < dx.size(); ++i)
    if (need[i]) dx[i] = back->getResult(i);
  return success();
}

} // namespace

void attachRecurrentVJPs(MLIRContext *ctx) { attachVJP<RecurrenceOp, recurrenceVJP>(ctx); }

} // namespace sd::ir
