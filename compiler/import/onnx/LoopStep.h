// Loop steps (LoopStep.cpp): an ONNX Loop or Scan too long to unroll, as one
// sd.loop over a loop-body function.
#pragma once
#include "ImporterContext.h"
#include "OpMaker.h"
#include "llvm/ADT/STLFunctionalExtras.h"

namespace sd {

struct LoopStepSpec {
  // M (one int64) when it is run-time data, else null: the loop then runs
  // maxTrips iterations unless its condition stops it.
  mlir::Value trip;
  // The first condition when it is run-time data, else null (true).
  mlir::Value condition;
  llvm::SmallVector<mlir::Value> carried;
  int64_t maxTrips = 0;
  // Ranks of the body's iteration-number and condition arguments (ONNX
  // declares them as scalars or as one-element tensors).
  int iterationRank = 0, conditionRank = 0;
  // The run-time error when the loop still wants to go on after maxTrips.
  std::string overflowMessage;
  // Imports the body at the builder's insertion point, given its arguments
  // (iteration number, condition, carried values); returns the next
  // condition, the next carried values and each scan output's slice.
  llvm::function_ref<mlir::FailureOr<llvm::SmallVector<mlir::Value>>(llvm::ArrayRef<mlir::Value>)> importBody;
};

// Emits the loop step and its body function. The step's results are the final
// carried values, then the scan outputs (maxTrips slices stacked along a new
// first axis).
mlir::FailureOr<ir::LoopOp> emitLoopStep(NodeImporter &imp, const LoopStepSpec &spec);

} // namespace sd
