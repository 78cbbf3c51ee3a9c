// ONNX RNN, GRU and LSTM as sd ops (RecurrentHandler.cpp).
#pragma once
#include "ImporterContext.h"

namespace sd {
mlir::LogicalResult importRecurrent(NodeImporter &imp, const onnx::NodeProto &node, const OpSpec &spec);
} // namespace sd
