// The summed cross-entropy and the two-output loss entry both training
// recipes build (sd-recipe-sft over token positions, sd-recipe-classify over
// rows): eval_step returns loss_sum and the count of labels it covered, so
// gradient accumulation normalizes over a whole window.
#pragma once
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace sd::ir {
class GradBuilder;
}

namespace sd {

// Labels that are not counted (PyTorch's ignore_index).
constexpr int64_t kIgnoreIndex = -100;

struct SummedLoss {
  mlir::Value loss;  // f32 scalar: the sum over counted labels
  mlir::Value count; // f32 scalar: how many labels were not kIgnoreIndex
};
// Cross-entropy of scores [n, classes] against int64 labels [n], summed
// over the labels that are not kIgnoreIndex. Null values when g failed.
SummedLoss summedCrossEntropy(sd::ir::GradBuilder &g, mlir::Value scores, mlir::Value labels);

// Replaces f's outputs with (loss_sum, tokens).
mlir::LogicalResult finishLossEntry(mlir::func::FuncOp f, mlir::Value loss, mlir::Value count);

// A new int64 input of `f` named `name`, shaped [dims of `like` up to
// `rank`], with `like`'s dimension names for those axes (so --shapes
// specializes it with the input it follows).
mlir::Value addLabelsInput(mlir::func::FuncOp f, unsigned like, int64_t rank, llvm::StringRef name);

} // namespace sd
