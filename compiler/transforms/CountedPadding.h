// What sd-bounded-extents builds where a consumer reads the padding of a
// counted value (CountedExtents.h) but can be made not to: the padding
// replaced by a value that leaves the consumer's result unchanged (0 for a
// sum or a product's contracted dim, -inf for a max or a softmax), and the
// run-time extents a Shape or Size reads, as values computed from the count.
#pragma once
#include "mlir/IR/Builders.h"
#include "mlir/IR/Value.h"

namespace sd {

// The element that leaves a reduction or softmax over it unchanged.
enum class Neutral { Zero, One, Lowest, Highest };

// Where(index along `axis` < count, x, neutral): x with every element past
// the count along `axis` replaced. `count` is an i64 scalar.
mlir::Value maskPadding(mlir::OpBuilder &b, mlir::Location loc, mlir::Value x, mlir::Value count, int64_t axis,
                        Neutral neutral);

// dims [start, end) of `x`'s run-time shape, the count at `axis` (ONNX
// Shape's start and end, clamped): an i64 vector.
mlir::Value runTimeShape(mlir::OpBuilder &b, mlir::Location loc, mlir::Value x, mlir::Value count, int64_t axis,
                         int64_t start, int64_t end);

// The number of elements of `x` at run time: count times the other dims (an
// i64 scalar).
mlir::Value runTimeSize(mlir::OpBuilder &b, mlir::Location loc, mlir::Value x, mlir::Value count, int64_t axis);

// `count` times `factor`, cast to `element` (a mean's divisor).
mlir::Value countAs(mlir::OpBuilder &b, mlir::Location loc, mlir::Value count, int64_t factor, mlir::Type element);

} // namespace sd
