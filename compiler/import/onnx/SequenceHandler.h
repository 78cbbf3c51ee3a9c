// ONNX sequences, kept by the importer as lists of tensors (SequenceHandler.cpp).
#pragma once
#include "ImporterContext.h"

namespace sd {
mlir::LogicalResult importSequenceOp(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &spec);
// A sequence's token for `tensors` (NodeImporter::sequences).
mlir::Value sequenceToken(NodeImporter &imp, llvm::SmallVector<mlir::Value> tensors);
} // namespace sd
