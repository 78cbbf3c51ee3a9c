// Converts between MLIR types/attributes and the op library's DType, AttrMap
// and TensorInfo, so the compiler runs the same shape rules and kernels as the
// runtime.
#pragma once
#include "sd/ops/registry.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Operation.h"
#include <optional>

namespace sd::ir {

std::optional<DType> toDType(mlir::Type elementType);
mlir::Type toMlirType(mlir::MLIRContext *ctx, DType dt);
TensorInfo toTensorInfo(mlir::Type type); // NoneType → dtype Undefined
// Bytes a static tensor or buffer of `type` takes in a plan: the op library's
// element size (one byte for bool and the 4- and 2-bit integers).
int64_t storageBytes(mlir::ShapedType type);
mlir::Type toTensorType(mlir::MLIRContext *ctx, const TensorInfo &info);
// The op's inherent attributes as the kernels see them.
AttrMap toAttrMap(mlir::Operation *op);
AttrMap toAttrMap(mlir::DictionaryAttr dict);
mlir::DictionaryAttr toDictionary(mlir::MLIRContext *ctx, const AttrMap &attrs);
// Raw little-endian element bytes of a constant (bools one byte each); false if
// the attribute kind is unsupported.
bool elementsToBytes(mlir::ElementsAttr attr, std::vector<uint8_t> &out);
mlir::DenseElementsAttr bytesToElements(mlir::ShapedType type, const std::vector<uint8_t> &bytes);
// Value of `v` when it is an sd.constant.
mlir::ElementsAttr constantValue(mlir::Value v);

// Shape context for a compute op; `storage` keeps constant operand bytes alive.
struct OpShapeQuery {
  AttrMap attrs;
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  std::unique_ptr<ShapeContext> ctx;
};
OpShapeQuery buildShapeQuery(mlir::Operation *op);
// The same for an op not built yet: its operands, attributes and result count.
OpShapeQuery buildShapeQuery(mlir::ValueRange operands, AttrMap attrs, unsigned numResults);

// Builds compute op `opName` (contract `contract`) with result types given by
// the op library's shape rule. On a rule error, emits it at `loc` and returns null.
mlir::Operation *buildComputeOp(mlir::OpBuilder &b, mlir::Location loc, llvm::StringRef opName,
                                llvm::StringRef contract, mlir::ValueRange operands,
                                llvm::ArrayRef<mlir::NamedAttribute> attrs, unsigned numResults = 1);

} // namespace sd::ir
