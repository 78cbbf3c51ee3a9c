// GradBuilder: op construction and broadcast reductions for the VJP rules.
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {

ArrayRef<int64_t> shapeOf(Value v) { return cast<RankedTensorType>(v.getType()).getShape(); }
Type elementTypeOf(Value v) { return cast<ShapedType>(v.getType()).getElementType(); }

Value GradBuilder::castTo(Value v, Type elementType) {
  if (!v || elementTypeOf(v) == elementType) return v;
  std::optional<DType> to = toDType(elementType);
  if (!to) {
    emitError(loc_) << "no cast to " << elementType << " for a gradient";
    return fail(), Value();
  }
  return make<CastOp>({v}, {attr("to", int64_t(*to))});
}

Value GradBuilder::equalMask(Value a, Value b) { return castTo(make<EqualOp>({a, b}), elementTypeOf(a)); }

bool reducedAxesOf(Operation *reduction, SmallVectorImpl<int64_t> &axes) {
  Value data = reduction->getOperand(0), given = reduction->getOperand(1);
  int64_t rank = int64_t(shapeOf(data).size());
  if (!isa<NoneType>(given.getType()) && !constantInts(given, axes)) return false;
  auto noop = reduction->getAttrOfType<IntegerAttr>("noop_with_empty_axes");
  if (axes.empty() && !(noop && noop.getInt()))
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  for (int64_t &a : axes)
    if (a < 0) a += rank;
  return true;
}

bool constantInts(Value v, SmallVectorImpl<int64_t> &out) {
  ElementsAttr c = constantValue(v);
  if (!c) return false;
  auto dense = dyn_cast<DenseIntElementsAttr>(c);
  if (!dense) return false;
  for (const APInt &i : dense.getValues<APInt>()) out.push_back(i.getSExtValue());
  return true;
}

Value GradBuilder::scalar(Type elementType, double v) {
  auto type = RankedTensorType::get({}, elementType);
  Attribute a = isa<FloatType>(elementType) ? Attribute(b_.getFloatAttr(elementType, v))
                                             : Attribute(b_.getIntegerAttr(elementType, int64_t(v)));
  return b_.create<ConstantOp>(loc_, type, DenseElementsAttr::get(type, a));
}

Value GradBuilder::ints(ArrayRef<int64_t> v) { return ints({int64_t(v.size())}, v); }

Value GradBuilder::ints(ArrayRef<int64_t> shape, ArrayRef<int64_t> values) {
  auto type = RankedTensorType::get(shape, b_.getI64Type());
  return b_.create<ConstantOp>(loc_, type, DenseElementsAttr::get(type, values));
}

SmallVector<NamedAttribute> GradBuilder::attrsOf(Operation *op, ArrayRef<StringRef> names) {
  SmallVector<NamedAttribute> out;
  for (StringRef n : names)
    if (Attribute a = op->getAttr(n)) out.push_back(b_.getNamedAttr(n, a));
  return out;
}

Value GradBuilder::none() { return b_.create<NoneOp>(loc_, b_.getNoneType()); }

Value GradBuilder::add(Value a, Value b) { return make<AddOp>({a, b}); }
Value GradBuilder::sub(Value a, Value b) { return make<SubOp>({a, b}); }
Value GradBuilder::mul(Value a, Value b) { return make<MulOp>({a, b}); }
Value GradBuilder::div(Value a, Value b) { return make<DivOp>({a, b}); }
Value GradBuilder::neg(Value a) { return make<NegOp>({a}); }
Value GradBuilder::scale(Value a, double s) { return a ? mul(a, scalar(elementTypeOf(a), s)) : Value(); }

Value GradBuilder::reshape(Value v, ArrayRef<int64_t> shape) {
  if (v && shapeOf(v) == shape) return v;
  return make<ReshapeOp>({v, ints(shape)});
}

Value GradBuilder::transpose(Value v, ArrayRef<int64_t> perm) { return make<TransposeOp>({v}, {attr("perm", perm)}); }

Value GradBuilder::swapLastTwo(Value v) {
  if (!v) return v;
  int64_t r = int64_t(shapeOf(v).size());
  SmallVector<int64_t> perm;
  for (int64_t i = 0; i < r; ++i) perm.push_back(i);
  std::swap(perm[size_t(r - 1)], perm[size_t(r - 2)]);
  return transpose(v, perm);
}

Value GradBuilder::reduceSum(Value v, ArrayRef<int64_t> axes, bool keepdims) {
  if (axes.empty()) return v;
  return make<ReduceSumOp>({v, ints(axes)}, {attr("keepdims", int64_t(keepdims))});
}

Value GradBuilder::sliceAxis(Value v, int64_t axis, int64_t start, int64_t end, int64_t step) {
  return make<SliceOp>({v, ints({start}), ints({end}), ints({axis}), ints({step})});
}

Value GradBuilder::padAxis(Value v, int64_t axis, int64_t before, int64_t after) {
  if (!v || (before == 0 && after == 0)) return v;
  SmallVector<int64_t> pads(2 * shapeOf(v).size(), 0);
  pads[size_t(axis)] = before;
  pads[size_t(axis) + shapeOf(v).size()] = after;
  return make<PadOp>({v, ints(pads), none(), none()});
}

Value GradBuilder::zeros(Type type) {
  auto t = cast<RankedTensorType>(type);
  return make<ExpandOp>({scalar(t.getElementType(), 0.0), ints(t.getShape())});
}

Value GradBuilder::unbroadcast(Value grad, Type target) {
  if (!grad || grad.getType() == target) return grad;
  ArrayRef<int64_t> gs = shapeOf(grad), ts = cast<RankedTensorType>(target).getShape();
  int64_t lead = int64_t(gs.size()) - int64_t(ts.size());
  SmallVector<int64_t> axes;
  for (int64_t i = 0; i < int64_t(gs.size()); ++i)
    if (i < lead || (ts[size_t(i - lead)] == 1 && gs[size_t(i)] != 1)) axes.push_back(i);
  return reshape(reduceSum(grad, axes, false), ts);
}

Value GradBuilder::broadcastTo(Value grad, Type target, ArrayRef<int64_t> axes) {
  if (!grad) return grad;
  SmallVector<int64_t> kept(cast<RankedTensorType>(target).getShape());
  for (int64_t a : axes) kept[size_t(a)] = 1;
  Value r = reshape(grad, kept);
  if (r && r.getType() == target) return r;
  return make<ExpandOp>({r, ints(cast<RankedTensorType>(target).getShape())});
}

} // namespace sd::ir
