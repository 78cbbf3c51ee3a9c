// What PyTorch's ONNX exporters leave in a model, read for training
// imports: which initializers are the module's parameters, the module each
// node came from, what the dynamo exporter's optimizer merged or dropped,
// and which BatchNormalizations were traced in train mode. The dynamo
// exporter writes this in metadata_props (ONNX 1.16), which libonnx 1.12
// keeps among protobuf's unknown fields; the TorchScript exporter in names.
#pragma once
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "onnx/onnx_pb.h"
#include <array>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

namespace sd {

// The value of metadata_props entry `key` of a proto whose metadata_props
// is field `number`; "" when absent.
std::string unknownMetadata(const google::protobuf::UnknownFieldSet &unknown, int number, llvm::StringRef key);
// The strings of a Python list's repr: "['', 'model', \"it's\"]" -> "", "model", "it's".
std::vector<std::string> quotedStrings(const std::string &v);
// The dotted path of the PyTorch module a node came from ("" if unknown).
std::string torchModuleScope(const onnx::NodeProto &node);

// Weights that nodes of several modules read in the same role, each mapped
// to the modules reading it (the driver warns when one of them trains).
mlir::DictionaryAttr sharedWeights(mlir::Builder &b, const onnx::GraphProto &g,
                                   const std::unordered_set<std::string> &weights);

// Which initializers of a PyTorch export are the module's parameters.
struct TorchParameters {
  bool marked = false;                    // the dynamo exporter's marks are there
  std::unordered_set<std::string> params; // when marked, every parameter; else the unmarked names
  std::unordered_set<std::string> foldedFrom; // the parameters folded into other initializers
  // A one-element float initializer that is a parameter (a one-output
  // head's bias, CLIP's logit_scale): a training plan keeps it as a weight.
  bool scalarParameter(const std::string &name) const { return params.count(name) != 0; }
  // A marked export's initializer that is not a parameter: frozen for good.
  bool notParameter(const std::string &name) const { return marked && !params.count(name); }
};
TorchParameters torchParameters(const onnx::ModelProto &model);

// The parameters a dynamo export's forward reads that the file lacks.
std::vector<std::string> droppedParameters(const onnx::ModelProto &model, const TorchParameters &tp);

// BatchNormalizations a dynamo export traced in train mode (FX source
// aten._native_batch_norm_legit_functional with training=True), which the
// exporter writes as inference nodes (no training_mode): each node's name
// mapped to its running statistics' buffer paths (running_mean,
// running_var; "" where the signature does not name one).
std::map<std::string, std::array<std::string, 2>> trainModeBatchNorms(const onnx::ModelProto &model);

// Eval-mode BatchNormalization statistics merged with a parameter of equal value.
std::unordered_set<std::string> mergedStatistics(const onnx::GraphProto &g,
                                                 const std::unordered_set<std::string> &weights);

} // namespace sd
