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
// On a BatchNormalization that normalizes by its batch's statistics (an ONNX
// training_mode=1 node of a training plan): [@running_mean, @running_var,
// momentum], the globals that sd-training-batch-norm updates in training
// entries and reads instead of the batch's in the others.
constexpr const char *kRunningStatisticsAttr = "sd.running_statistics";
// On a Gather along axis 0 that is an nn.Embedding with padding_idx (the
// dynamo exporter's FX source says so): the row index whose weight row gets
// no gradient, as in PyTorch.
constexpr const char *kPaddingRowAttr = "sd.padding_row";
// On a global the exporter says is not one of the module's parameters (a
// folded constant, a buffer): full fine-tuning and --trainable leave it frozen.
constexpr const char *kNotParameterAttr = "sd.not_parameter";
} // namespace sd::ir

#include "SDDialect.h.inc"
#include "SDInterfaces.h.inc"

#define GET_TYPEDEF_CLASSES
#include "SDTypes.h.inc"

#define GET_OP_CLASSES
#include "SDOps.h.inc"
