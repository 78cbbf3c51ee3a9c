// Live ranges of step-IR buffers, shared by sd-inplace-reuse, sd-liveness and
// sd-pack-arena. Views extend the life of the buffer they alias.
#pragma once
#include "SDDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"

namespace sd {

struct LiveRange {
  int64_t first = 0, last = 0; // step indices, inclusive
};

// The arena buffer behind `v` (through views), or null for globals/none.
ir::BufferOp rootBuffer(mlir::Value v);

struct BufferLiveness {
  llvm::DenseMap<mlir::Operation *, LiveRange> ranges; // keyed by sd.buffer op
  llvm::SmallVector<ir::StepOp> steps;
  int64_t numSteps = 0;
  void compute(mlir::func::FuncOp f);
};

} // namespace sd
