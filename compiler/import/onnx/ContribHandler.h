// onnxruntime's contrib ops that onnxruntime-genai's model builder writes
// (GroupQueryAttention, SkipSimplifiedLayerNormalization in com.microsoft;
// SimplifiedLayerNormalization in the default domain), imported as sd ops
// (ContribHandler.cpp).
#pragma once
#include "ImporterContext.h"

namespace sd {
// The handler of com.microsoft op `opType`; null when it is not supported.
OpHandler findContribHandler(const std::string &opType);
mlir::LogicalResult importSimplifiedLayerNorm(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &spec);
} // namespace sd
