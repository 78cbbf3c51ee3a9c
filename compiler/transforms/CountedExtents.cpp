#include "CountedExtents.h"
#include "PassDetail.h"
#include "SDDialect.h"

using namespace mlir;

namespace sd {

// Compress's and Unique's optional axis, made non-negative; 0 (the flattened
// elements) when absent.
static int64_t selectionAxis(Operation *op, std::optional<int64_t> axis) {
  int64_t rank = cast<ShapedType>(op->getOperand(0).getType()).getRank();
  return !axis ? 0 : *axis < 0 ? *axis + rank : *axis;
}

std::optional<CountedResults> countedResultsOf(Operation *op) {
  if (isa<ir::NonMaxSuppressionOp>(op)) return CountedResults{1, {{0, 0}}};
  if (isa<ir::NonZeroOp>(op)) return CountedResults{1, {{0, 1}}};
  if (auto c = dyn_cast<ir::CompressOp>(op)) return CountedResults{1, {{0, selectionAxis(op, c.getAxis())}}};
  if (auto t = dyn_cast<ir::TopKBoundedOp>(op)) {
    int64_t axis = t.getAxis().value_or(-1), rank = cast<ShapedType>(op->getOperand(0).getType()).getRank();
    if (axis < 0) axis += rank;
    return CountedResults{2, {{0, axis}, {1, axis}}};
  }
  if (auto u = dyn_cast<ir::UniqueOp>(op)) return CountedResults{4, {{0, selectionAxis(op, u.getAxis())}, {1, 0}, {3, 0}}};
  return std::nullopt;
}

// `v`, or the value it is computed from by ops that map each element to one
// element of the same shape.
static Value elementwiseSource(Value v) {
  while (Operation *op = v.getDefiningOp()) {
    auto compute = dyn_cast<ir::ComputeOpInterface>(op);
    bool oneToOne = compute && op->getNumOperands() == 1 && op->getNumResults() == 1 &&
                    (isa<ir::IdentityOp>(op) || isElementwiseContract(compute.getContractName()));
    if (!oneToOne || cast<ShapedType>(op->getOperand(0).getType()).getShape() !=
                         cast<ShapedType>(v.getType()).getShape())
      break;
    v = op->getOperand(0);
  }
  return v;
}

Value expandedToItsOwnShape(Operation *op) {
  auto expand = dyn_cast<ir::ExpandOp>(op);
  auto shape = expand ? op->getOperand(1).getDefiningOp<ir::ShapeOp>() : ir::ShapeOp{};
  if (!shape || shape.getStart().value_or(0) != 0 || shape.getEnd()) return nullptr;
  Value x = op->getOperand(0);
  if (elementwiseSource(shape->getOperand(0)) != elementwiseSource(x)) return nullptr;
  return x;
}

Operation *countedSourceOf(Value v) {
  llvm::SmallVector<Value> work{v};
  llvm::DenseSet<Operation *> seen;
  while (!work.empty()) {
    Operation *op = work.pop_back_val().getDefiningOp();
    if (!op || !seen.insert(op).second) continue;
    if (countedResultsOf(op)) return op;
    work.append(op->operand_begin(), op->operand_end());
  }
  return nullptr;
}

bool CountedValues::readsCounted(Operation *op) const {
  if (values.empty()) return false;
  return llvm::any_of(op->getOperands(), [&](Value v) { return values.contains(v); });
}

void CountedValues::visit(Operation *op) {
  if (auto c = countedResultsOf(op))
    for (auto [result, axis] : c->results) values.insert(op->getResult(result));
  else if (readsCounted(op)) values.insert(op->result_begin(), op->result_end());
}

} // namespace sd
