// Helpers for importer handlers that decompose one ONNX node into several
// sd ops (Attention, RotaryEmbedding).
#pragma once
#include "ImporterContext.h"
#include "SDDialect.h"
#include <algorithm>
#include <initializer_list>

namespace sd {

inline const onnx::AttributeProto *attrOf(const onnx::NodeProto &n, const char *name) {
  for (const auto &a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

// Fails naming the first attribute of `n` that is not in `known`: a handler
// that reads attributes itself must not silently drop one it does not know.
inline mlir::LogicalResult onlyAttrs(NodeImporter &imp, const onnx::NodeProto &n,
                                     std::initializer_list<const char *> known) {
  for (const auto &a : n.attribute())
    if (std::none_of(known.begin(), known.end(), [&](const char *k) { return a.name() == k; }))
      return imp.fail("attribute '" + a.name() + "' is not supported");
  return mlir::success();
}

// Input i of the node, or a null Value when it is absent (past the end or named "").
inline mlir::FailureOr<mlir::Value> optionalInput(NodeImporter &imp, const onnx::NodeProto &n, int i) {
  if (i >= n.input_size() || n.input(i).empty()) return mlir::Value();
  return imp.lookup(n.input(i));
}

inline llvm::ArrayRef<int64_t> dimsOf(mlir::Value v) { return mlir::cast<mlir::RankedTensorType>(v.getType()).getShape(); }
inline bool isStatic(mlir::Value v) { return mlir::cast<mlir::RankedTensorType>(v.getType()).hasStaticShape(); }
inline mlir::Type elementOf(mlir::Value v) { return mlir::cast<mlir::RankedTensorType>(v.getType()).getElementType(); }

// v's dims, where shape inference left one dynamic filled in from the
// exporter's value_info for `name` (a dynamo export's head count behind a
// computed Reshape). Only a hint: when specialization knows the shapes, the
// shape rules check every op built from it, so a wrong declaration fails there.
inline llvm::SmallVector<int64_t> dimsHinted(NodeImporter &imp, const std::string &name, mlir::Value v) {
  llvm::SmallVector<int64_t> dims(dimsOf(v));
  auto it = imp.declaredDims.find(name);
  if (it == imp.declaredDims.end() || it->second.size() != dims.size()) return dims;
  for (size_t i = 0; i < dims.size(); ++i)
    if (mlir::ShapedType::isDynamic(dims[i]) && it->second[i] > 0) dims[i] = it->second[i];
  return dims;
}

// Output i of the node names v, when the node has that output and names it.
inline void bindOutput(NodeImporter &imp, const onnx::NodeProto &n, int i, mlir::Value v) {
  if (i < n.output_size() && !n.output(i).empty()) imp.values[n.output(i)] = v;
}

// ONNX's TensorProto code of a float element type (Cast's `to`).
inline int64_t onnxFloatType(mlir::Type t) {
  if (t.isF16()) return 10;
  if (t.isBF16()) return 16;
  if (t.isF64()) return 11;
  return 1;
}

// Builds sd ops by mnemonic, remembering the first failure.
struct OpMaker {
  NodeImporter &imp;
  bool ok = true;

  // `contract`: the op library's name (its shape rule), e.g. "MatMul" for sd.matmul.
  mlir::Value op(const char *contract, const char *mnemonic, llvm::ArrayRef<mlir::Value> operands, llvm::ArrayRef<mlir::NamedAttribute> attrs = {}) {
    if (!ok) return mlir::Value();
    for (mlir::Value v : operands)
      if (!v) return ok = false, mlir::Value();
    OpSpec spec{contract, 1, mnemonic, int(operands.size()), 1, nullptr};
    auto built = imp.buildOp(spec, operands, attrs, 1);
    if (mlir::failed(built)) return ok = false, mlir::Value();
    return (*built)->getResult(0);
  }
  mlir::NamedAttribute i64(const char *name, int64_t v) { return imp.builder.getNamedAttr(name, imp.builder.getI64IntegerAttr(v)); }
  mlir::Value reshape(mlir::Value v, llvm::ArrayRef<int64_t> shape) { return op("Reshape", "reshape", {v, imp.constI64(shape)}); }
  mlir::Value transpose(mlir::Value v, llvm::ArrayRef<int64_t> perm) {
    return op("Transpose", "transpose", {v}, {imp.builder.getNamedAttr("perm", imp.builder.getDenseI64ArrayAttr(perm))});
  }
  mlir::Value scalar(double v, mlir::Type et) { return imp.constScalarLike(v, et); }
};

} // namespace sd
