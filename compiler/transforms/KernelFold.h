// Folding an op whose operands are all known, by running its CPU kernel: the
// same arithmetic the runtime would do, so folded and unfolded plans agree.
// Used by sd-propagate-shapes and by the importer, which needs If conditions
// and Loop trip counts before it can unroll.
#pragma once
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Operation.h"
#include "llvm/ADT/SmallVector.h"

namespace sd {
namespace ir {
struct OpShapeQuery;
}

// The most result bytes one fold may create during import (as sd-propagate-shapes' default).
constexpr int64_t kImportFoldBytes = int64_t(1) << 20;

// Replaces the uses of `op`'s results with constants when every operand is
// known (for Shape/Size: its operand's shape), or, for an IfSelect with a
// known condition, with the taken branch. `replacements` gets the new values
// (empty when nothing folded). Fails only when the kernel itself fails, after
// emitting the error at the op. `inferred`: the op's query with its shape rule
// already run (sd-propagate-shapes has one), so it is not built and run twice.
mlir::LogicalResult foldWithKernels(mlir::Operation *op, int64_t maxBytes,
                                    llvm::SmallVectorImpl<mlir::Value> *replacements = nullptr,
                                    ir::OpShapeQuery *inferred = nullptr);

// The operand an IfSelect passes on when its condition is a constant; null otherwise.
mlir::Value takenBranch(mlir::Operation *ifSelect);

// sd-propagate-shapes on one function: result types from the shape rules,
// all-constant ops folded, dead ops erased. sd-specialize calls it too when
// run-time If selects may fold, so that the branch they drop never reaches
// the verifier with shapes it cannot take.
mlir::LogicalResult propagateShapes(mlir::func::FuncOp f, int64_t maxFoldBytes);

} // namespace sd
