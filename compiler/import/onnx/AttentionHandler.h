// The ONNX Attention op (opset 23+), imported as sd ops (AttentionHandler.cpp).
#pragma once
#include "ImporterContext.h"

namespace sd {
mlir::LogicalResult importAttention(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &spec);
// FlexAttention of the ai.onnx.preview domain, its score/prob mod graphs inline.
mlir::LogicalResult importFlexAttention(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &spec);
} // namespace sd
