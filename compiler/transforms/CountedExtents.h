// Ops that fill only a prefix of a result sized for the most they can select,
// and count what they filled (NonMaxSuppression, and NonZero, Compress,
// Unique and TopK on run-time values). The static shape of such a
// result, and of everything computed from it, is a bound, not an extent:
// folding must not turn its Shape or Size into a constant, and
// sd-bounded-extents checks that every consumer honours the count.
#pragma once
#include "mlir/IR/Operation.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"
#include <optional>

namespace sd {

// The results of such an op that are filled only in part, each with the dim
// the count applies to, and the result holding the count (one int64).
struct CountedResults {
  unsigned count;
  llvm::SmallVector<std::pair<unsigned, int64_t>, 3> results; // (result, axis)
};
std::optional<CountedResults> countedResultsOf(mlir::Operation *op);

// For Expand(x, Shape(y)) where y is x, or is computed from x element for
// element (one-operand elementwise ops): x, which already has that shape at
// run time; null for any other op. torch.onnx's dynamo exporter broadcasts a
// boolean mask's NonZero indices against one another this way (a Max of one
// operand, then its Shape), and a Shape of a counted value cannot fold.
mlir::Value expandedToItsOwnShape(mlir::Operation *op);

// The selection (an op with counted results) that `v` is computed from, or
// null: what a Shape of `v` that cannot fold reads the size of.
mlir::Operation *countedSourceOf(mlir::Value v);

// The counted values among ops visited in order (import or a pass's walk):
// counted results and every result of an op that reads one.
class CountedValues {
public:
  void visit(mlir::Operation *op);
  bool readsCounted(mlir::Operation *op) const;

private:
  llvm::DenseSet<mlir::Value> values;
};

} // namespace sd
