// How the run-time count of a selection (CountedExtents.h) passes through
// the ops that read a counted value, for sd-bounded-extents. A consumer that
// works slice by slice along the counted dim (elementwise ops, gathers by
// counted indices, reshapes and transposes that keep the dim, slices and
// concats along other dims, products, reductions, softmaxes and
// normalizations over other dims) passes the count on (a prefix slice [:k]
// of the dim as min(count, k)). One that reads across the counted dim gets
// the padding masked first where a neutral value makes its result exact
// (CountedPadding.h): a sum, mean, max or min over it, a product contracting
// it, a softmax along it; a Shape or Size of it becomes the run-time extents
// computed from the count. Any other consumer that would mix the padding
// into real values (a gather along the counted dim, a normalization over it)
// is refused.
#pragma once
#include "mlir/IR/Operation.h"
#include "llvm/ADT/DenseMap.h"
#include <string>

namespace sd {

// The count that dim `axis` of a value holds, and the selection it comes from.
struct Extent {
  mlir::Value count;
  int64_t axis;
  mlir::Operation *source; // the selecting op, for messages
};

// The counted values of one entry, each with its extent.
class CountedFlow {
public:
  llvm::DenseMap<mlir::Value, Extent> extents;
  // Passes `e`, the extent of one of `op`'s counted operands, on to `op`'s
  // results: rewrites `op` where its padding must be masked first, and
  // replaces (erases) a Shape or Size by the extents it computes. On failure
  // `why` says why `op` cannot honour the count.
  mlir::LogicalResult follow(mlir::Operation *op, const Extent &e, std::string &why);
};

} // namespace sd
