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
#include <optional>
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

// What the dynamo exporter's optimizer merged or dropped that a training
// import undoes, told apart by each node's FX source (the PyTorch op and the
// parameters it read): the optimizer keeps one initializer per distinct
// value, so a node may read another module's parameter, or a parameter where
// PyTorch read a constant (a LayerNorm without weight reading an RMSNorm's
// ones); it removes all-zero biases; it folds a transposed or reshaped
// parameter into a copy, which trains apart from the parameter itself.
struct ExportRepairs {
  struct Reread {
    int node = 0, slot = 0;
    std::string source; // the initializer the node reads
    std::string weight; // its own parameter to read instead; "" for a frozen copy of source (a constant in PyTorch)
  };
  std::vector<Reread> rereads;
  struct RestoredBias {
    int node = 0;          // a Gemm, Conv or ConvTranspose the optimizer took the bias of
    std::string parameter; // its name, restored as a zero weight
  };
  std::vector<RestoredBias> restoredBiases;
  struct Refold {
    std::string copy, parameter; // an initializer the optimizer folded from a parameter the model also reads
    bool transposed = false;     // copy = parameter transposed (2-D), else reshaped
    // The parameter is not in the file (the copy is all that is left of it:
    // a Linear's weight that a MatMul reads transposed, a norm's vector
    // reshaped): it is made from the copy (restoredParameter), so it trains
    // and is saved as PyTorch's.
    bool restored = false;
    // Axes along which the copy repeats one slice (a parameter's rows the
    // optimizer gathered for every batch item or position: ViT's class
    // token, BERT's token type, OPT's positions): `parameter` is then those
    // rows once (the copy with these axes of length 1, named copy + ".rows"),
    // and the copy their Expand, so their gradients sum as in PyTorch.
    std::vector<int64_t> broadcastAxes;
  };
  std::vector<Refold> refolds;
  // Folded initializers that train apart from PyTorch's parameters and that
  // sdc cannot derive again (several parameters folded into one, such as
  // weight_norm's g * v / |v|; a parameter's rows gathered with repeats):
  // each mapped to why, naming the parameters it came from.
  std::map<std::string, std::string> foldedTogether;
  // The parameters the forward reads that the file lacks and no repair
  // restores: they cannot train (the driver names them).
  std::vector<std::string> dropped;
  // A node the optimizer's common-subexpression elimination merged into an
  // equal one, M (GPT-NeoX's and Falcon's two norms of one input, equal
  // while fresh): a copy of M computes `value` again, reading at `params`'
  // slots the parameters PyTorch's op read (made with M's weights' bytes),
  // and the `readers` (node, slot) read it.
  struct Unmerged {
    int node = 0;
    std::string value;
    std::vector<std::pair<int, std::string>> params;
    std::vector<std::pair<int, int>> readers;
  };
  std::vector<Unmerged> unmerged;
  // The parameters the file lacks that no node's FX source reads: unused by
  // the forward, or tied to another by a name the file does not tell
  // (BART's model.shared.weight), or read by a node the optimizer merged
  // with an equal one where `unmerged` cannot tell which. They are in no
  // saved weights.
  std::vector<std::string> unread;
  // Parameters PyTorch ties to others (an LM head's weight that is the
  // input embedding's): torch.export lists each name, but the graph reads
  // one. Each initializer mapped to its other names, so trained weights are
  // saved under every name the model's state_dict has.
  std::map<std::string, std::vector<std::string>> tiedNames;
};
ExportRepairs exportRepairs(const onnx::ModelProto &model, const TorchParameters &tp);
// g's nodes with the repairs applied: each refolded copy's nodes (a
// Transpose, or a Constant shape and a Reshape) first, then g's own with the
// reread inputs renamed and the restored biases added.
google::protobuf::RepeatedPtrField<onnx::NodeProto> repairedNodes(const onnx::GraphProto &g,
                                                                   const ExportRepairs &r);
// The zero bias `name` restored to a Gemm, Conv or ConvTranspose node with
// weight `w`: its output count long, of w's float type; nullopt when unknown.
std::optional<onnx::TensorProto> zeroBias(const onnx::NodeProto &n, const onnx::TensorProto &w,
                                          const std::string &name);
// The name of the weight a reread reads: the parameter's own, or the frozen copy's.
inline std::string rereadName(const ExportRepairs::Reread &r) {
  return r.weight.empty() ? r.source + ".constant" : r.weight;
}
// A restored refold's parameter, made from its copy: transposed back, a
// vector, or the copy's repeated slices once.
onnx::TensorProto restoredParameter(const ExportRepairs::Refold &r, const onnx::TensorProto &copy);
// Applies the repairs to the model itself, for `sdc merge` of trained
// weights saved under the restored names (the importer applies them to its
// own copy of the nodes instead, reading the weights in place).
void repairModel(onnx::ModelProto &model, const ExportRepairs &r);

// BatchNormalizations a dynamo export traced in train mode (FX source
// aten._native_batch_norm_legit_functional with training=True), which the
// exporter writes as inference nodes (no training_mode): each node's name
// mapped to its running statistics' buffer paths (running_mean,
// running_var; "" where the signature does not name one).
std::map<std::string, std::array<std::string, 2>> trainModeBatchNorms(const onnx::ModelProto &model);

// Why a training import must refuse the model when the dynamo exporter's
// optimizer folded a train-mode BatchNorm into another node (a fresh norm,
// traced as an inference node of unit statistics, folded into the Conv
// before it): which node; "" when none was.
std::string foldedTrainModeBatchNorm(const onnx::ModelProto &model);
// Nodes an eval-mode BatchNorm was folded into ("'node_Conv_0' (Conv)"):
// their weights are the product with the norm's, frozen (the exporter marks
// no parameter), and the norm's own parameters are not in the file.
std::vector<std::string> foldedEvalBatchNorms(const onnx::ModelProto &model);

// Gathers a dynamo export wrote for nn.Embedding with padding_idx (FX source
// aten.embedding with a third argument): each node's name mapped to that
// row, whose weight PyTorch never trains.
std::map<std::string, int64_t> embeddingPaddingRows(const onnx::ModelProto &model);

// Eval-mode BatchNormalization statistics merged with a parameter of equal value.
std::unordered_set<std::string> mergedStatistics(const onnx::GraphProto &g,
                                                 const std::unordered_set<std::string> &weights);

} // namespace sd
