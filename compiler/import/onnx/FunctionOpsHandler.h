// ONNX ops that the standard defines as functions of other ops, imported as
// those sd ops (FunctionOpsHandler.cpp).
#pragma once
#include "ImporterContext.h"

namespace sd {
mlir::LogicalResult importCausalConvWithState(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &spec);
mlir::LogicalResult importSwiGlu(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &spec);
mlir::LogicalResult importBatchNormTraining(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &spec);
mlir::LogicalResult importGroupNormalization(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &spec);
} // namespace sd
