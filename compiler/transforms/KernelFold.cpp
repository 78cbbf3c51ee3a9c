#include "KernelFold.h"
#include "CountedExtents.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "mlir/IR/Builders.h"
#include <cstring>

using namespace mlir;
using namespace sd::ir;

namespace sd {

// Ops whose result depends only on operand shapes, not values.
static bool readsOnlyShapes(StringRef contract) { return contract == "Shape" || contract == "Size"; }

static LogicalResult foldQuery(Operation *op, const KernelDef &def, bool shapeOnly, OpShapeQuery &q,
                               int64_t maxBytes, SmallVectorImpl<Value> *replacements);

Value takenBranch(Operation *ifSelect) {
  auto cond = dyn_cast_or_null<DenseElementsAttr>(constantValue(ifSelect->getOperand(0)));
  if (!cond || cond.getNumElements() != 1) return Value();
  return ifSelect->getOperand(*cond.value_begin<bool>() ? 1 : 2);
}

LogicalResult foldWithKernels(Operation *op, int64_t maxBytes, SmallVectorImpl<Value> *replacements,
                              OpShapeQuery *inferred) {
  auto compute = dyn_cast<ComputeOpInterface>(op);
  if (!compute) return success();
  StringRef contract = compute.getContractName();
  if (contract == "IfSelect") {
    Value taken = takenBranch(op);
    // A result type still to be refined keeps the select until it is.
    if (!taken || taken.getType() != op->getResult(0).getType()) return success();
    op->getResult(0).replaceAllUsesWith(taken);
    if (replacements) replacements->push_back(taken);
    return success();
  }
  bool shapeOnly = readsOnlyShapes(contract);
  // Cheap test first: building the query copies every constant operand.
  for (Value v : op->getOperands()) {
    if (isa<NoneType>(v.getType())) continue;
    bool known = shapeOnly ? cast<ShapedType>(v.getType()).hasStaticShape() : bool(v.getDefiningOp<ConstantOp>());
    if (!known) return success();
  }
  const KernelDef *def = cpuKernels().find(contract.str());
  if (!def) return success();
  if (inferred) return foldQuery(op, *def, shapeOnly, *inferred, maxBytes, replacements);
  // Built in place: its ShapeContext refers to its own attributes.
  OpShapeQuery q = buildShapeQuery(op);
  Status s = inferShapes(contract.str(), *q.ctx);
  if (!s.isOk()) return op->emitError() << describeNode(op) << ": " << s.message();
  return foldQuery(op, *def, shapeOnly, q, maxBytes, replacements);
}

// The kernel run of foldWithKernels, on a query whose shape rule has run.
static LogicalResult foldQuery(Operation *op, const KernelDef &def, bool shapeOnly, OpShapeQuery &q,
                               int64_t maxBytes, SmallVectorImpl<Value> *replacements) {
  for (unsigned i = 0; i < op->getNumOperands(); ++i) {
    if (isa<NoneType>(op->getOperand(i).getType())) continue;
    if (shapeOnly ? !q.ctx->inputs[i].isStatic() : q.ctx->constInputs[i] == nullptr) return success();
  }
  int64_t bytes = 0; // element counts are bounded by 2^40 (inferShapes)
  for (auto &o : q.ctx->outputs) {
    if (!o.isStatic()) return success();
    bytes += o.numElements() * int64_t(dtypeSize(o.dtype));
    if (bytes > maxBytes) return success();
  }
  std::vector<std::vector<uint8_t>> results(op->getNumResults());
  KernelContext kc{q.attrs, {}, {}, nullptr};
  for (unsigned i = 0; i < op->getNumOperands(); ++i) {
    if (const TensorView *v = q.ctx->constInputs[i]) kc.inputs.push_back(*v);
    else if (isa<NoneType>(op->getOperand(i).getType())) kc.inputs.push_back(TensorView{});
    else kc.inputs.push_back(TensorView{nullptr, q.ctx->inputs[i].dtype, q.ctx->inputs[i].dims});
  }
  for (unsigned i = 0; i < op->getNumResults(); ++i) {
    const TensorInfo &o = q.ctx->outputs[i];
    results[i].assign(size_t(o.numElements()) * dtypeSize(o.dtype) + 1, 0);
    kc.outputs.push_back(TensorView{results[i].data(), o.dtype, o.dims});
  }
  Status s = runKernel(def, kc);
  if (!s.isOk()) return op->emitError() << describeNode(op) << ": " << s.message();
  OpBuilder b(op);
  SmallVector<Value> made;
  std::vector<Dims> dims;
  for (unsigned i = 0; i < op->getNumResults(); ++i) {
    results[i].pop_back();
    dims.push_back(q.ctx->outputs[i].dims);
  }
  // A selection folds to what it selected, not to the bound it was sized for.
  std::optional<CountedResults> counted = countedResultsOf(op);
  if (counted) {
    int64_t n = 0;
    std::memcpy(&n, results[counted->count].data(), sizeof n);
    for (auto [r, axis] : counted->results)
      if (!keepPrefixAlong(results[r], dims[r], dtypeSize(q.ctx->outputs[r].dtype), size_t(axis), n))
        return success();
  }
  for (unsigned i = 0; i < op->getNumResults(); ++i) {
    auto type = cast<ShapedType>(op->getResult(i).getType());
    if (!type.hasStaticShape() || counted) type = RankedTensorType::get(dims[i], type.getElementType());
    DenseElementsAttr value = bytesToElements(type, results[i]);
    if (!value) return success();
    made.push_back(b.create<ConstantOp>(op->getLoc(), type, value));
  }
  for (unsigned i = 0; i < op->getNumResults(); ++i) {
    // The importer's typed uses stay; a trimmed selection's users are refined after it.
    if (made[i].getType() != op->getResult(i).getType() && !counted) continue;
    op->getResult(i).replaceAllUsesWith(made[i]);
  }
  if (replacements) replacements->append(made.begin(), made.end());
  return success();
}

} // namespace sd
