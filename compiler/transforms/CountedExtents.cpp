#include "CountedExtents.h"
#include "SDDialect.h"

using namespace mlir;

namespace sd {

std::optional<CountedResult> countedResultOf(Operation *op) {
  if (isa<ir::NonMaxSuppressionOp>(op)) return CountedResult{0, 1, 0};
  return std::nullopt;
}

bool CountedValues::readsCounted(Operation *op) const {
  if (values.empty()) return false;
  return llvm::any_of(op->getOperands(), [&](Value v) { return values.contains(v); });
}

void CountedValues::visit(Operation *op) {
  if (auto c = countedResultOf(op)) values.insert(op->getResult(c->result));
  else if (readsCounted(op)) values.insert(op->result_begin(), op->result_end());
}

} // namespace sd
