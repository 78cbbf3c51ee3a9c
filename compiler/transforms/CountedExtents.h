// Ops that fill only a prefix of a result sized for the most they can select,
// and count what they filled (NonMaxSuppression). The static shape of such a
// result, and of everything computed from it, is a bound, not an extent:
// folding must not turn its Shape or Size into a constant, and
// sd-bounded-extents checks that every consumer honours the count.
#pragma once
#include "mlir/IR/Operation.h"
#include "llvm/ADT/DenseSet.h"
#include <optional>

namespace sd {

struct CountedResult {
  unsigned result; // the bounded result
  unsigned count;  // its one-element int64 count
  int64_t axis;    // the dim the count applies to
};
std::optional<CountedResult> countedResultOf(mlir::Operation *op);

// The counted values among ops visited in order (import or a pass's walk):
// counted results and every result of an op that reads one.
class CountedValues {
public:
  void visit(mlir::Operation *op);
  bool readsCounted(mlir::Operation *op) const;
  bool empty() const { return values.empty(); }

private:
  llvm::DenseSet<mlir::Value> values;
};

} // namespace sd
