// State shared by the graph walker and the per-op handlers.
#pragma once
#include "SDDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "onnx/onnx_pb.h"
#include <array>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace sd {

class NodeImporter;
struct ImportOptions;

// The first stream of an exported train-mode Dropout or random node: the
// k-th of the file draws this + k, apart from the streams LoRA's dropout
// numbers from 0.
constexpr int64_t kExportedDropoutStream = int64_t(1) << 32;

struct OpSpec;
using OpHandler = mlir::LogicalResult (*)(NodeImporter &, const onnx::NodeProto &, const OpSpec &);

// One handler per (op type, since_version): the importer picks the newest
// spec whose since_version is <= the model's opset.
struct OpSpec {
  const char *opType;
  int sinceVersion;
  const char *mnemonic; // sd op (without "sd.")
  int numOperands;      // sd operand count (-1: variadic); missing ones become sd.none
  int numResults;       // -1: as many as the node has
  OpHandler handler;
};

const OpSpec *findOpSpec(const std::string &opType, int64_t opset);
bool isKnownOpType(const std::string &opType);

class NodeImporter {
public:
  NodeImporter(mlir::OpBuilder &b, const std::string &modelPath) : builder(b), modelPath(modelPath) {}

  mlir::OpBuilder &builder;
  std::string modelPath;
  std::string error;
  std::unordered_map<std::string, mlir::Value> values;
  std::unordered_map<std::string, const onnx::TensorProto *> lazyGlobals; // created on first use
  // Identity nodes whose output became a weight of its own (untieMergedWeights).
  std::unordered_set<std::string> untiedOutputs;
  // Eval-mode BatchNormalization statistics that an exporter merged with a
  // parameter of equal value (a fresh norm's running mean is its zero bias):
  // a training import reads them from a frozen copy (mergedStatistics).
  std::unordered_set<std::string> mergedStatistics;
  // BatchNormalizations a dynamo export traced in train mode, by node name:
  // the weights holding their running mean and variance (the buffers' own,
  // trainModeStatistics in OnnxImporter.cpp).
  std::map<std::string, std::array<std::string, 2>> trainModeNorms;
  // nn.Embedding Gathers with padding_idx, by node name: the row tagged
  // kPaddingRowAttr (embeddingPaddingRows in TorchExports.h).
  std::map<std::string, int64_t> paddingRows;
  mlir::Location loc = mlir::UnknownLoc::get(builder.getContext());
  std::string nodeDesc; // "<scope>: node 'x' (Op, opset N)"
  std::string nodeName; // "x"
  // What error messages start with: the model path, or inside a subgraph the
  // node owning it and the attribute ("model.onnx: node 'If_0' (If, opset 11) then_branch").
  std::string scope;
  const ImportOptions *options = nullptr;
  // What the control-flow handlers decided, one line per node (shown by --dry-run).
  std::vector<std::string> controlFlowNotes;
  // Values whose shape is only a bound (CountedExtents.h): their Shape and
  // Size must not fold.
  std::unordered_set<std::string> countedNames;
  int64_t opset = 0;
  // Train-mode Dropouts and random nodes imported so far (their streams:
  // nextStream in OpHandlers.cpp).
  int64_t randomSites = 0;
  // The exporter's value_info dims per ONNX name (-1 where it names none): hints
  // for the handlers that decompose a node and need a head count that shape
  // inference left dynamic (dimsHinted in OpMaker.h).
  std::unordered_map<std::string, std::vector<int64_t>> declaredDims;

  mlir::LogicalResult fail(const std::string &msg) {
    if (error.empty()) error = nodeDesc + ": " + msg;
    return mlir::failure();
  }
  // ONNX sequences (SequenceHandler.h): the importer keeps a sequence's
  // tensors as a list, so a plan never holds one. The sequence itself is a
  // token (an sd.none of its own) that only the sequence ops, Identity and an
  // unrolled Loop's carried values take.
  llvm::DenseMap<mlir::Value, llvm::SmallVector<mlir::Value>> sequences;
  bool isSequence(mlir::Value v) const { return v && sequences.count(v); }
  // Value of an ONNX name; empty name gives sd.none. lookup refuses a
  // sequence (the node wants a tensor); lookupAny takes either.
  mlir::FailureOr<mlir::Value> lookup(const std::string &name);
  mlir::FailureOr<mlir::Value> lookupAny(const std::string &name);
  mlir::Value none();
  // i64 1-D constant (attribute-to-operand upgrades).
  mlir::Value constI64(llvm::ArrayRef<int64_t> values, bool scalar = false);
  mlir::Value constScalarLike(double v, mlir::Type elementType);
  // Converts node attributes; `skip` names attributes handled by the caller.
  mlir::FailureOr<llvm::SmallVector<mlir::NamedAttribute>> convertAttributes(const onnx::NodeProto &node,
                                                                              llvm::ArrayRef<llvm::StringRef> skip = {});
  // Builds sd.<mnemonic> with result types from the shape rules; verifies it.
  mlir::FailureOr<mlir::Operation *> buildOp(const OpSpec &spec, llvm::ArrayRef<mlir::Value> operands,
                                             llvm::ArrayRef<mlir::NamedAttribute> attrs, unsigned numResults);
  mlir::LogicalResult bindResults(const onnx::NodeProto &node, mlir::Operation *op);
  mlir::FailureOr<llvm::SmallVector<mlir::Value>> operandsOf(const onnx::NodeProto &node, const OpSpec &spec);
};

// Imports a graph's nodes at the builder's insertion point.
mlir::LogicalResult importNodes(NodeImporter &imp, const onnx::GraphProto &g);
// Imports subgraph `g` (an If branch, a Loop or Scan body) inline, its inputs
// bound to `inputs`; returns its outputs. Names it defines do not leak out;
// outer-scope names are visible inside. `what` names it in errors ("then_branch").
mlir::FailureOr<llvm::SmallVector<mlir::Value>> importSubgraph(NodeImporter &imp, const onnx::GraphProto &g,
                                                              const std::string &what, llvm::ArrayRef<mlir::Value> inputs);

// Tensor bytes of an ONNX TensorProto as an MLIR ElementsAttr; false + error on bad data.
mlir::FailureOr<mlir::ElementsAttr> tensorToElements(mlir::Builder &b, const onnx::TensorProto &t, bool asResource,
                                                     std::string &error);
mlir::FailureOr<mlir::RankedTensorType> tensorTypeOf(mlir::Builder &b, const onnx::TensorProto &t, std::string &error);

} // namespace sd
