#include "CountedPadding.h"
#include "OpLibraryBridge.h"
#include "SDDialect.h"
#include "mlir/IR/BuiltinTypes.h"
#include <numeric>

using namespace mlir;
using namespace sd::ir;

namespace sd {

static Value constI64(OpBuilder &b, Location loc, ArrayRef<int64_t> shape, ArrayRef<int64_t> values) {
  auto type = RankedTensorType::get(shape, b.getI64Type());
  return b.create<ConstantOp>(loc, type, DenseElementsAttr::get(type, values));
}

static Attribute neutralOf(Type element, Neutral neutral) {
  if (auto f = dyn_cast<FloatType>(element)) {
    const llvm::fltSemantics &sem = f.getFloatSemantics();
    switch (neutral) {
    case Neutral::Zero: return FloatAttr::get(f, APFloat::getZero(sem));
    case Neutral::One: return FloatAttr::get(f, APFloat::getOne(sem));
    case Neutral::Lowest:
    case Neutral::Highest: {
      // Formats without infinities (the 8-bit E4M3FN) take their largest finite value.
      bool negative = neutral == Neutral::Lowest;
      APFloat inf = APFloat::getInf(sem, negative);
      return FloatAttr::get(f, inf.isInfinity() ? inf : APFloat::getLargest(sem, negative));
    }
    }
  }
  auto i = cast<IntegerType>(element);
  unsigned bits = i.getWidth();
  bool isUnsigned = i.isUnsigned() || bits == 1;
  switch (neutral) {
  case Neutral::Zero: return IntegerAttr::get(i, APInt(bits, 0));
  case Neutral::One: return IntegerAttr::get(i, APInt(bits, 1));
  case Neutral::Lowest: return IntegerAttr::get(i, isUnsigned ? APInt::getMinValue(bits) : APInt::getSignedMinValue(bits));
  case Neutral::Highest:
    return IntegerAttr::get(i, isUnsigned ? APInt::getMaxValue(bits) : APInt::getSignedMaxValue(bits));
  }
  return {};
}

Value maskPadding(OpBuilder &b, Location loc, Value x, Value count, int64_t axis, Neutral neutral) {
  auto type = cast<RankedTensorType>(x.getType());
  int64_t bound = type.getDimSize(axis);
  SmallVector<int64_t> shape(size_t(type.getRank()), 1);
  shape[size_t(axis)] = bound;
  SmallVector<int64_t> positions(static_cast<size_t>(bound), 0);
  std::iota(positions.begin(), positions.end(), int64_t(0));
  Value index = constI64(b, loc, shape, positions);
  Value kept = b.create<LessOp>(loc, RankedTensorType::get(shape, b.getI1Type()), ValueRange{index, count});
  auto scalar = RankedTensorType::get({}, type.getElementType());
  Value fill = b.create<ConstantOp>(loc, scalar, DenseElementsAttr::get(scalar, neutralOf(type.getElementType(), neutral)));
  return b.create<WhereOp>(loc, type, ValueRange{kept, x, fill});
}

Value runTimeShape(OpBuilder &b, Location loc, Value x, Value count, int64_t axis, int64_t start, int64_t end) {
  ArrayRef<int64_t> dims = cast<ShapedType>(x.getType()).getShape();
  int64_t rank = int64_t(dims.size());
  auto clamp = [&](int64_t d) { return std::clamp(d < 0 ? d + rank : d, int64_t(0), rank); };
  start = clamp(start), end = std::max(clamp(end), start);
  auto part = [&](int64_t from, int64_t to) {
    return constI64(b, loc, {to - from}, dims.slice(size_t(from), size_t(to - from)));
  };
  if (axis < start || axis >= end) return part(start, end);
  SmallVector<Value> parts;
  if (axis > start) parts.push_back(part(start, axis));
  parts.push_back(b.create<ReshapeOp>(loc, RankedTensorType::get({1}, b.getI64Type()),
                                      ValueRange{count, constI64(b, loc, {1}, {1})}));
  if (end > axis + 1) parts.push_back(part(axis + 1, end));
  if (parts.size() == 1) return parts.front();
  return b.create<ConcatOp>(loc, RankedTensorType::get({end - start}, b.getI64Type()), parts, int64_t(0));
}

Value runTimeSize(OpBuilder &b, Location loc, Value x, Value count, int64_t axis) {
  ArrayRef<int64_t> dims = cast<ShapedType>(x.getType()).getShape();
  int64_t others = 1;
  for (size_t d = 0; d < dims.size(); ++d)
    if (int64_t(d) != axis) others *= dims[d];
  return b.create<MulOp>(loc, count.getType(), ValueRange{count, constI64(b, loc, {}, {others})});
}

Value countAs(OpBuilder &b, Location loc, Value count, int64_t factor, Type element) {
  if (factor != 1) count = b.create<MulOp>(loc, count.getType(), ValueRange{count, constI64(b, loc, {}, {factor})});
  if (element == cast<ShapedType>(count.getType()).getElementType()) return count;
  std::optional<DType> to = toDType(element);
  return b.create<CastOp>(loc, RankedTensorType::get({}, element), count, b.getI64IntegerAttr(int64_t(*to)),
                          IntegerAttr(), StringAttr());
}

} // namespace sd
