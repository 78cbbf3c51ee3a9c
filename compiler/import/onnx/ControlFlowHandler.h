// ONNX If, Loop and Scan, made static at import (ControlFlowHandler.cpp).
#pragma once
#include "ImporterContext.h"

namespace sd {
mlir::LogicalResult importIf(NodeImporter &imp, const onnx::NodeProto &node, const OpSpec &spec);
mlir::LogicalResult importLoop(NodeImporter &imp, const onnx::NodeProto &node, const OpSpec &spec);
mlir::LogicalResult importScan(NodeImporter &imp, const onnx::NodeProto &node, const OpSpec &spec);
} // namespace sd
