// ONNX ModelProto -> sd dialect module. The ModelProto must outlive the module:
// weight globals reference initializer bytes in place (MLIR resources).
#pragma once
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include <map>
#include <string>
#include <vector>

namespace onnx {
class ModelProto;
class TensorProto;
}

namespace sd {

struct ImportOptions {
  std::string modelPath; // for locations
  // Integer initializers up to this many elements become sd.constant (shape
  // arithmetic folds through them); float ones with one element too.
  int64_t maxConstantElements = 4096;
  // Graph inputs bound to constant values at compile time (sdc --bind):
  // shape-determining inputs of an ahead-of-time plan must be known.
  std::map<std::string, const onnx::TensorProto *> bindings;
  // Ranks from --shapes, for graph inputs the model gives no shape.
  std::map<std::string, int64_t> inputRanks;
  // Static shapes of graph inputs known before import (an inference plan's one
  // --shapes bucket): If conditions and loop counts on shapes fold at import.
  std::map<std::string, std::vector<int64_t>> inputShapes;
  // Upper bound on the iterations of a Loop whose trip count or condition is
  // run-time data (sdc --max-trip); 0: such loops are refused.
  int64_t maxTrip = 0;
  // Loops and Scans of at most this many iterations unroll; longer ones
  // become a loop step over an outlined body (LoopStep.h).
  int64_t maxUnroll = 64;
  // An If on run-time data computes both branches and selects while the
  // cheaper branch costs at most this much (sdc --max-select; BranchStep.h);
  // above it, an inference plan runs only the taken branch, as an If step.
  int64_t maxSelect = 65536;
  // A training plan: Ifs always select (a branch step is not differentiable).
  bool training = false;
};

mlir::OwningOpRef<mlir::ModuleOp> importOnnxModel(mlir::MLIRContext *ctx, const onnx::ModelProto &model,
                                                  const ImportOptions &opts, std::string &error);

} // namespace sd
