#include "CountedFlow.h"
#include "CountedPadding.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace sd::ir;
using sd::Extent;
using sd::AttrMap;
using sd::Neutral;

namespace {
ArrayRef<int64_t> shapeOf(Value v) { return cast<ShapedType>(v.getType()).getShape(); }

// Where `axis` of `from` lands in `to` when one only regroups the other's
// elements (Reshape, Squeeze, Unsqueeze, Flatten), and by what the count
// grows there: the counted dim must stay the outermost of the dim it lands
// in, with the same slices before it; it may merge with dims after it
// ([count, 4] -> [count * 4]: the real elements stay a prefix). Nullopt when
// it is split or merged with dims before it.
std::optional<std::pair<int64_t, int64_t>> regroupedAxis(ArrayRef<int64_t> from, ArrayRef<int64_t> to,
                                                         int64_t axis) {
  int64_t before = ShapedType::getNumElements(from.take_front(size_t(axis)));
  int64_t bound = from[size_t(axis)], p = 1;
  for (size_t d = 0; d < to.size(); ++d) {
    if (p == before) {
      int64_t merged = bound;
      for (size_t k = size_t(axis) + 1; merged != to[d] && merged < to[d] && k < from.size() && bound > 0; ++k)
        merged *= from[k];
      if (merged == to[d]) return std::make_pair(int64_t(d), bound > 0 ? merged / bound : 1);
    }
    p *= to[d];
    if (p > before) break;
  }
  return std::nullopt;
}

std::optional<std::vector<int64_t>> constInts(Value v) {
  auto attr = dyn_cast_or_null<DenseElementsAttr>(constantValue(v));
  if (!attr || !isa<IntegerType>(attr.getElementType())) return std::nullopt;
  std::vector<int64_t> out;
  for (const APInt &x : attr.getValues<APInt>()) out.push_back(x.getSExtValue());
  return out;
}

int64_t normalizedAxis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

struct Rules {
  llvm::DenseMap<Value, Extent> &extents;
  std::string &why; // why the current consumer cannot honour its count

  Extent at(const Extent &e, int64_t axis) { return Extent{e.count, axis, e.source}; }

  LogicalResult refuse(const std::string &reason) {
    why = reason;
    return failure();
  }

  // Passes the count on to `op`'s results, or says why it cannot.
  LogicalResult follow(Operation *op, const Extent &e) {
    auto compute = dyn_cast<ComputeOpInterface>(op);
    if (!compute) return refuse("only compute ops may read it");
    StringRef contract = compute.getContractName();
    if (sd::isElementwiseContract(contract)) return followElementwise(op);
    if (isa<ShapeOp, SizeOp>(op)) return replaceSizeRead(op, e);
    if (isReduction(op)) return followReduction(op, e);
    if (isa<ArgMaxOp, ArgMinOp>(op)) return followArgReduction(op, e);
    if (isa<SoftmaxOp, LogSoftmaxOp, HardmaxOp>(op)) return followSoftmax(op, e);
    if (isa<LayerNormalizationOp, RMSNormalizationOp>(op)) return followNormalization(op, e);
    if (auto l = dyn_cast<LinearOp>(op)) return followLinear(l, e);
    if (isa<MatMulOp>(op)) return followMatMul(op, e);
    if (auto g = dyn_cast<GemmOp>(op)) return followGemm(g, e);
    if (isa<ReshapeOp, SqueezeOp, UnsqueezeOp, FlattenOp, IdentityOp>(op)) {
      if (!extents.count(op->getOperand(0))) return refuse("it reads the counted value as a shape");
      auto lands = regroupedAxis(shapeOf(op->getOperand(0)), shapeOf(op->getResult(0)), e.axis);
      if (!lands) return refuse("the reshape splits the counted dim or merges it with the dims before it");
      auto [axis, factor] = *lands;
      Value count = e.count;
      if (factor != 1) {
        OpBuilder b(op->getContext());
        b.setInsertionPointAfter(op);
        count = sd::countAs(b, op->getLoc(), e.count, factor, b.getI64Type());
      }
      extents[op->getResult(0)] = Extent{count, axis, e.source};
      return success();
    }
    if (auto t = dyn_cast<TransposeOp>(op)) {
      int64_t rank = int64_t(shapeOf(op->getOperand(0)).size());
      SmallVector<int64_t> perm;
      if (auto p = t.getPerm()) perm.assign(p->begin(), p->end());
      else
        for (int64_t d = rank - 1; d >= 0; --d) perm.push_back(d);
      extents[op->getResult(0)] = at(e, int64_t(llvm::find(perm, e.axis) - perm.begin()));
      return success();
    }
    if (auto g = dyn_cast<GatherOp>(op)) return followGather(g, e);
    if (auto g = dyn_cast<GatherNDOp>(op)) {
      int64_t indexRank = int64_t(shapeOf(g.getOperand(1)).size());
      if (extents.count(g.getOperand(0)) || g.getBatchDims().value_or(0) != 0)
        return refuse("GatherND would read the padding of the data it indexes");
      if (e.axis == indexRank - 1) return refuse("the counted dim holds the index tuples");
      extents[op->getResult(0)] = e;
      return success();
    }
    if (auto s = dyn_cast<SliceOp>(op)) return followSlice(s, e);
    if (auto c = dyn_cast<ConcatOp>(op)) {
      if (normalizedAxis(c.getAxis(), int64_t(shapeOf(c.getResult()).size())) == e.axis)
        return refuse("it concatenates along the counted dim");
      extents[op->getResult(0)] = e;
      return success();
    }
    if (auto s = dyn_cast<SplitOp>(op)) {
      if (s->getOperand(0) != op->getOperand(0) || !extents.count(op->getOperand(0)) ||
          normalizedAxis(s.getAxis().value_or(0), int64_t(shapeOf(op->getOperand(0)).size())) == e.axis)
        return refuse("it splits the counted dim");
      for (Value r : op->getResults()) extents[r] = e;
      return success();
    }
    return refuse(contract.str() + " is not one of the ops that work slice by slice (elementwise ops, gathers by "
                                   "counted indices, reshapes and transposes keeping the dim, slices and concats "
                                   "along other dims, products, reductions, softmaxes and normalizations)");
  }

  // Operand `i` of `op` with its padding replaced by `neutral`.
  // (An operand read twice, as A^T A reads it, is masked once.)
  Value maskOperand(Operation *op, unsigned i, Neutral neutral) {
    Value x = op->getOperand(i);
    const Extent e = extents.lookup(x);
    OpBuilder b(op);
    Value masked = sd::maskPadding(b, op->getLoc(), x, e.count, e.axis, neutral);
    extents[masked] = e;
    for (OpOperand &use : op->getOpOperands())
      if (use.get() == x) use.set(masked);
    return masked;
  }

  // Shape and Size read the run-time extents: computed from the count.
  LogicalResult replaceSizeRead(Operation *op, const Extent &e) {
    OpBuilder b(op);
    Value x = op->getOperand(0), value;
    if (auto s = dyn_cast<ShapeOp>(op))
      value = sd::runTimeShape(b, op->getLoc(), x, e.count, e.axis, s.getStart().value_or(0),
                               s.getEnd().value_or(int64_t(shapeOf(x).size())));
    else
      value = sd::runTimeSize(b, op->getLoc(), x, e.count, e.axis);
    op->getResult(0).replaceAllUsesWith(value);
    op->erase();
    return success();
  }

  static bool isReduction(Operation *op) {
    return isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp, ReduceMinOp, ReduceProdOp, ReduceL1Op, ReduceL2Op,
               ReduceLogSumOp, ReduceLogSumExpOp, ReduceSumSquareOp>(op);
  }

  // The value that leaves the reduction unchanged when it meets the padding.
  static Neutral neutralOfReduction(Operation *op) {
    if (isa<ReduceMaxOp, ReduceLogSumExpOp, ArgMaxOp>(op)) return Neutral::Lowest;
    if (isa<ReduceMinOp, ArgMinOp>(op)) return Neutral::Highest;
    if (isa<ReduceProdOp>(op)) return Neutral::One;
    return Neutral::Zero; // sums, of values, magnitudes or squares
  }

  // Where the counted dim lands in a reduction's result when it is not reduced.
  void keepThroughReduction(Operation *op, const Extent &e, llvm::ArrayRef<int64_t> reduced, bool keepdims) {
    int64_t axis = e.axis;
    if (!keepdims) axis -= int64_t(llvm::count_if(reduced, [&](int64_t d) { return d < e.axis; }));
    for (Value r : op->getResults()) extents[r] = at(e, axis);
  }

  LogicalResult followReduction(Operation *op, const Extent &e) {
    if (!extents.count(op->getOperand(0))) return refuse("it reduces over counted axes");
    SmallVector<int64_t> reduced;
    if (!reducedAxesOf(op, reduced)) return refuse("its axes are not constants");
    if (!llvm::is_contained(reduced, e.axis))
      return keepThroughReduction(op, e, reduced, toAttrMap(op).getInt("keepdims", 1)), success();
    maskOperand(op, 0, neutralOfReduction(op));
    if (auto mean = dyn_cast<ReduceMeanOp>(op)) divideByCount(mean, e, reduced);
    return success(); // nothing of the result is padding
  }

  // A mean over the counted dim: the sum of the masked values over the
  // count times the other reduced dims, as ONNX Runtime divides.
  void divideByCount(ReduceMeanOp mean, const Extent &e, llvm::ArrayRef<int64_t> reduced) {
    OpBuilder b(mean);
    Value sum = b.create<ReduceSumOp>(mean.getLoc(), mean->getResultTypes(), mean->getOperands(), mean->getAttrs())
                    ->getResult(0);
    int64_t others = 1;
    for (int64_t d : reduced)
      if (d != e.axis) others *= shapeOf(mean->getOperand(0))[size_t(d)];
    auto type = cast<RankedTensorType>(sum.getType());
    Value n = sd::countAs(b, mean.getLoc(), e.count, others, type.getElementType());
    mean->getResult(0).replaceAllUsesWith(b.create<DivOp>(mean.getLoc(), type, ValueRange{sum, n}).getResult());
    mean->erase();
  }

  LogicalResult followArgReduction(Operation *op, const Extent &e) {
    AttrMap attrs = toAttrMap(op);
    int64_t axis = normalizedAxis(attrs.getInt("axis", 0), int64_t(shapeOf(op->getOperand(0)).size()));
    if (axis != e.axis) return keepThroughReduction(op, e, {axis}, attrs.getInt("keepdims", 1)), success();
    // The padding follows every counted element: with the first extreme
    // picked, a neutral extreme never wins a tie; with the last, it would.
    if (attrs.getInt("select_last_index", 0)) return refuse("it picks the last extreme along the counted dim");
    maskOperand(op, 0, neutralOfReduction(op));
    return success();
  }

  LogicalResult followSoftmax(Operation *op, const Extent &e) {
    AttrMap attrs = toAttrMap(op);
    int64_t axis = normalizedAxis(attrs.getInt("axis", -1), int64_t(shapeOf(op->getOperand(0)).size()));
    bool across = attrs.getInt("coerce2d", 0) ? e.axis >= axis : e.axis == axis;
    // exp(-inf) = 0: the padding adds nothing to the real elements' sums.
    if (across) maskOperand(op, 0, Neutral::Lowest);
    extents[op->getResult(0)] = e;
    return success();
  }

  LogicalResult followNormalization(Operation *op, const Extent &e) {
    if (!extents.count(op->getOperand(0)) || llvm::any_of(op->getOperands().drop_front(), [&](Value v) {
          return extents.count(v) != 0;
        }))
      return refuse("its scale or bias is counted");
    if (e.axis >= normalizedAxis(toAttrMap(op).getInt("axis", -1), int64_t(shapeOf(op->getOperand(0)).size())))
      return refuse("it normalizes over the counted dim");
    for (Value r : op->getResults()) extents[r] = e; // the statistics keep the leading dims
    return success();
  }

  // Products: a counted dim that is contracted is masked with zeros (the
  // padding adds nothing to the sums); one that is not lands in the result.
  // `roles[i]` is, for operand i, where its counted dim lands (-1:
  // contracted), or nullopt when the operand is not counted.
  LogicalResult followProduct(Operation *op, llvm::ArrayRef<std::optional<int64_t>> landsAt) {
    std::optional<Extent> result;
    llvm::SmallDenseSet<Value, 2> masked;
    for (auto [i, lands] : llvm::enumerate(landsAt)) {
      if (!lands) continue;
      const Extent &e = extents.lookup(op->getOperand(unsigned(i)));
      if (*lands < 0) {
        if (!masked.contains(op->getOperand(unsigned(i)))) masked.insert(maskOperand(op, unsigned(i), Neutral::Zero));
        continue;
      }
      if (shapeOf(op->getResult(0))[size_t(*lands)] != shapeOf(op->getOperand(unsigned(i)))[size_t(e.axis)])
        return refuse("it broadcasts the counted dim");
      if (result && result->axis != *lands) return refuse("its operands are counted along different dims");
      result = at(e, *lands);
    }
    if (result) extents[op->getResult(0)] = *result;
    return success();
  }

  std::optional<int64_t> axisOf(Value v) {
    auto it = extents.find(v);
    return it == extents.end() ? std::nullopt : std::optional<int64_t>(it->second.axis);
  }

  LogicalResult followLinear(LinearOp l, const Extent &e) {
    if (!extents.count(l.getInput()) || extents.count(l->getOperand(1)) || extents.count(l->getOperand(2)))
      return refuse("its weight or bias is counted");
    int64_t rank = int64_t(shapeOf(l.getInput()).size());
    int64_t axis = *axisOf(l.getInput());
    return followProduct(l, {axis == rank - 1 ? -1 : axis});
  }

  LogicalResult followMatMul(Operation *op, const Extent &e) {
    int64_t ra = int64_t(shapeOf(op->getOperand(0)).size()), rb = int64_t(shapeOf(op->getOperand(1)).size());
    int64_t ro = int64_t(shapeOf(op->getResult(0)).size());
    std::optional<int64_t> a = axisOf(op->getOperand(0)), bAxis = axisOf(op->getOperand(1));
    std::optional<int64_t> aLands, bLands;
    if (a) aLands = *a == ra - 1 ? -1 : rb == 1 ? *a : *a + (ro - ra);
    if (bAxis) bLands = rb == 1 || *bAxis == rb - 2 ? -1 : ra == 1 ? (*bAxis == rb - 1 ? ro - 1 : *bAxis)
                                                                  : *bAxis + (ro - rb);
    return followProduct(op, {aLands, bLands});
  }

  LogicalResult followGemm(GemmOp g, const Extent &e) {
    if (extents.count(g->getOperand(2))) return refuse("its C operand is counted");
    bool transA = g.getTransA().value_or(0), transB = g.getTransB().value_or(0);
    std::optional<int64_t> a = axisOf(g->getOperand(0)), bAxis = axisOf(g->getOperand(1));
    std::optional<int64_t> aLands, bLands;
    if (a) aLands = (*a == 1) != transA ? -1 : 0;     // rows of A are the result's rows
    if (bAxis) bLands = (*bAxis == 0) != transB ? -1 : 1; // columns of B its columns
    return followProduct(g, {aLands, bLands});
  }

  LogicalResult followElementwise(Operation *op) {
    ArrayRef<int64_t> out = shapeOf(op->getResult(0));
    std::optional<Extent> result;
    for (Value v : op->getOperands()) {
      auto it = extents.find(v);
      if (it == extents.end()) continue;
      ArrayRef<int64_t> in = shapeOf(v);
      int64_t axis = it->second.axis + int64_t(out.size() - in.size());
      if (out[size_t(axis)] != in[size_t(it->second.axis)]) return refuse("it broadcasts the counted dim");
      if (result && result->axis != axis) return refuse("its operands are counted along different dims");
      result = at(it->second, axis);
    }
    for (Value r : op->getResults()) extents[r] = *result;
    return success();
  }

  LogicalResult followGather(GatherOp g, const Extent &e) {
    int64_t rank = int64_t(shapeOf(g.getOperand(0)).size());
    int64_t axis = normalizedAxis(g.getAxis().value_or(0), rank);
    int64_t indexRank = int64_t(shapeOf(g.getOperand(1)).size());
    auto data = extents.find(g.getOperand(0));
    if (data != extents.end()) {
      if (extents.count(g.getOperand(1))) return refuse("it gathers a counted value by counted indices");
      if (data->second.axis == axis) return refuse("it gathers along the counted dim, which may read the padding");
      int64_t a = data->second.axis;
      extents[g.getResult()] = at(e, a < axis ? a : a - 1 + indexRank);
      return success();
    }
    extents[g.getResult()] = at(e, axis + e.axis); // the indices' dims replace data's `axis`
    return success();
  }

  LogicalResult followSlice(SliceOp s, const Extent &e) {
    for (unsigned i = 1; i < s->getNumOperands(); ++i)
      if (extents.count(s->getOperand(i))) return refuse("it slices by counted values");
    ArrayRef<int64_t> in = shapeOf(s.getOperand(0)), out = shapeOf(s.getResult());
    // Sliced dims are those whose size changes, or that a negative step reverses.
    std::optional<std::vector<int64_t>> axes = constInts(s->getOperand(3)), steps = constInts(s->getOperand(4));
    bool reversed = false;
    if (steps && axes)
      for (size_t k = 0; k < steps->size() && k < axes->size(); ++k)
        reversed |= (*steps)[k] < 0 && normalizedAxis((*axes)[k], int64_t(in.size())) == e.axis;
    if (steps && !axes)
      reversed = e.axis < int64_t(steps->size()) && (*steps)[size_t(e.axis)] < 0;
    if ((!steps && !isa<NoneType>(s->getOperand(4).getType())) || (!axes && !isa<NoneType>(s->getOperand(3).getType())))
      return refuse("its axes or steps are not constants");
    if (reversed) return refuse("it reverses the counted dim");
    if (in[size_t(e.axis)] != out[size_t(e.axis)]) return followPrefix(s, e, axes, steps);
    extents[s.getResult()] = e;
    return success();
  }

  // A prefix of the counted dim ([:k]: start 0, step 1, a constant end k)
  // keeps min(count, k) rows: that becomes the count of the result.
  LogicalResult followPrefix(SliceOp s, const Extent &e, const std::optional<std::vector<int64_t>> &axes,
                             const std::optional<std::vector<int64_t>> &steps) {
    std::optional<std::vector<int64_t>> starts = constInts(s->getOperand(1)), ends = constInts(s->getOperand(2));
    int64_t rank = int64_t(shapeOf(s.getOperand(0)).size());
    if (!starts || !ends) return refuse("it slices the counted dim by values that are not constants");
    size_t k = 0;
    while (k < starts->size() && (axes ? normalizedAxis((*axes)[k], rank) : int64_t(k)) != e.axis) ++k;
    if (k >= starts->size() || k >= ends->size() || (*starts)[k] != 0 || (*ends)[k] < 0 ||
        (steps && k < steps->size() && (*steps)[k] != 1))
      return refuse("it slices the counted dim other than as a prefix [:k] (start 0, step 1, end k >= 0)");
    OpBuilder b(s->getContext());
    b.setInsertionPointAfter(s);
    auto scalar = RankedTensorType::get({}, b.getI64Type());
    int64_t kept = shapeOf(s.getResult())[size_t(e.axis)];
    Value limit = b.create<ConstantOp>(s.getLoc(), scalar, DenseElementsAttr::get(scalar, kept));
    Value count = b.create<MinOp>(s.getLoc(), scalar, ValueRange{e.count, limit});
    extents[s.getResult()] = Extent{count, e.axis, e.source};
    return success();
  }
};

} // namespace

mlir::LogicalResult sd::CountedFlow::follow(Operation *op, const Extent &e, std::string &why) {
  return Rules{extents, why}.follow(op, e);
}
