// Shared helpers for pass implementations.
#pragma once
#include "SDDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace sd {
// Entry functions carry `sd.entry = "<name>"`.
inline bool isEntry(mlir::func::FuncOp f) { return f->hasAttr("sd.entry"); }
// The ONNX node name carried by a location, or "" when there is none.
std::string nodeNameOf(mlir::Location loc);
// "node 'x' (Op)" for diagnostics.
std::string describeNode(mlir::Operation *op);
} // namespace sd
