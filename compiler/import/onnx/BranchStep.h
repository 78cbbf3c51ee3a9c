// If steps (BranchStep.cpp): an ONNX If on run-time data whose branches cost
// more than computing both is worth becomes one sd.if over two outlined body
// functions, of which a run executes only the taken one.
#pragma once
#include "ImporterContext.h"
#include "OpMaker.h"
#include <optional>

namespace sd {

// What running `ops` costs, roughly: multiply-adds for matrix products and
// convolutions, one per result element otherwise, and a nested loop step's
// body times its iterations. None when a result's shape is not static.
std::optional<int64_t> estimatedCost(llvm::ArrayRef<mlir::Operation *> ops);

struct BranchStepSpec {
  mlir::Value condition;
  // Each branch as the importer left it inline: its ops, in order, and its
  // outputs.
  llvm::SmallVector<mlir::Operation *> thenOps, elseOps;
  llvm::SmallVector<mlir::Value> thenOuts, elseOuts;
};

// Moves both branches into body functions and puts an sd.if where they were.
// Returns null (and changes nothing) when the branches cannot be steps: an
// output or an outer-scope value without a static shape, outputs of different
// types, or one branch reading what the other computes.
ir::IfOp emitBranchStep(NodeImporter &imp, const BranchStepSpec &spec);

} // namespace sd
