// The ONNX RotaryEmbedding op (opset 23), imported as sd ops (RotaryHandler.cpp).
#pragma once
#include "ImporterContext.h"

namespace sd {
mlir::LogicalResult importRotaryEmbedding(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &spec);
} // namespace sd
