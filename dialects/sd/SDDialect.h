// The sd dialect's C++ surface: dialect, ops, and the compute-op interface.
// Include only from compiler translation units (it pulls in MLIR).
#pragma once

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace sd::ir {
// Runs the op library's shape rule for `op` and checks its result types.
mlir::LogicalResult verifyAgainstShapeRule(mlir::Operation *op);
} // namespace sd::ir

#include "SDDialect.h.inc"
#include "SDInterfaces.h.inc"

#define GET_TYPEDEF_CLASSES
#include "SDTypes.h.inc"

#define GET_OP_CLASSES
#include "SDOps.h.inc"
