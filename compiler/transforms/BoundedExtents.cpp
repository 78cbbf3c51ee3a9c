// sd-bounded-extents: follows each counted result (CountedExtents.h) to the
// entry's outputs. A consumer that works slice by slice along the counted dim
// (elementwise ops, gathers by counted indices, reshapes and transposes that
// keep the dim, slices and concats along other dims) passes the count on (a
// prefix slice [:k] of the dim as min(count, k)); one
// that would mix the padding into real values (a reduction, a gather along
// the counted dim, a Shape of it) is refused, naming both nodes. Counted entry
// results get their count as an extra, unnamed result and an
// `sd.output_extents` entry [result, count result, axis] that sd-bufferize
// turns into a counted output binding.
#include "CountedExtents.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"

namespace sd {
#define GEN_PASS_DEF_BOUNDEDEXTENTS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct Extent {
  Value count;
  int64_t axis;
  Operation *source; // the selecting op, for messages
};

ArrayRef<int64_t> shapeOf(Value v) { return cast<ShapedType>(v.getType()).getShape(); }

// Where `axis` of `from` lands in `to` when one only regroups the other's
// elements (Reshape, Squeeze, Unsqueeze, Flatten): the counted dim must stay a
// dim of its own with the same slices before it; -1 when it does not.
int64_t regroupedAxis(ArrayRef<int64_t> from, ArrayRef<int64_t> to, int64_t axis) {
  int64_t before = ShapedType::getNumElements(from.take_front(size_t(axis)));
  int64_t p = 1;
  for (size_t d = 0; d < to.size(); ++d) {
    if (p == before && to[d] == from[size_t(axis)]) return int64_t(d);
    p *= to[d];
    if (p > before) break;
  }
  return -1;
}

std::optional<std::vector<int64_t>> constInts(Value v) {
  auto attr = dyn_cast_or_null<DenseElementsAttr>(constantValue(v));
  if (!attr || !isa<IntegerType>(attr.getElementType())) return std::nullopt;
  std::vector<int64_t> out;
  for (const APInt &x : attr.getValues<APInt>()) out.push_back(x.getSExtValue());
  return out;
}

int64_t normalizedAxis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

struct BoundedExtentsPass : sd::impl::BoundedExtentsBase<BoundedExtentsPass> {
  llvm::DenseMap<Value, Extent> extents;
  std::string why; // why the current consumer cannot honour its count

  void runOnOperation() override {
    for (auto f : getOperation().getOps<func::FuncOp>())
      if (sd::isEntry(f) && failed(runOnEntry(f))) return signalPassFailure();
  }

  LogicalResult runOnEntry(func::FuncOp f) {
    extents.clear();
    Block &body = f.getBody().front();
    // Dynamic shapes are sd-check-static's to report.
    for (Operation &op : body)
      for (Value r : op.getResults())
        if (auto t = dyn_cast<ShapedType>(r.getType()); t && !t.hasStaticShape()) return success();
    for (Operation &op : body) {
      if (auto c = sd::countedResultsOf(&op)) {
        if (failed(refuseCountedOperands(&op))) return failure();
        for (auto [result, axis] : c->results) extents[op.getResult(result)] = Extent{op.getResult(c->count), axis, &op};
        continue;
      }
      if (isa<func::ReturnOp>(op)) return recordOutputs(f, cast<func::ReturnOp>(op));
      auto counted = llvm::make_filter_range(op.getOperands(), [&](Value v) { return extents.count(v) != 0; });
      if (counted.empty()) continue;
      Extent first = extents.lookup(*counted.begin());
      why.clear();
      for (Value v : counted)
        if (extents.lookup(v).count != first.count) why = "it combines the counts of two selections";
      if (why.empty() && succeeded(follow(&op, first))) continue;
      return op.emitError() << sd::describeNode(&op) << " cannot honour the run-time count of "
                            << sd::describeNode(first.source) << ", which fills only part of dim " << first.axis
                            << " of its result: " << why;
    }
    return success();
  }

  LogicalResult refuseCountedOperands(Operation *op) {
    for (Value v : op->getOperands())
      if (auto it = extents.find(v); it != extents.end()) {
        why = "a selection over a counted selection is not supported";
        return op->emitError() << sd::describeNode(op) << " cannot honour the run-time count of "
                               << sd::describeNode(it->second.source) << ": " << why;
      }
    return success();
  }

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
    if (isa<ShapeOp, SizeOp>(op)) return refuse("its size along that dim is only known at run time");
    if (isa<ReshapeOp, SqueezeOp, UnsqueezeOp, FlattenOp, IdentityOp>(op)) {
      if (!extents.count(op->getOperand(0))) return refuse("it reads the counted value as a shape");
      int64_t axis = regroupedAxis(shapeOf(op->getOperand(0)), shapeOf(op->getResult(0)), e.axis);
      if (axis < 0) return refuse("the reshape merges or splits the counted dim");
      extents[op->getResult(0)] = at(e, axis);
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
                                   "along other dims)");
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

  // Appends one count result per selection the outputs depend on.
  LogicalResult recordOutputs(func::FuncOp f, func::ReturnOp ret) {
    llvm::MapVector<Value, unsigned> countIndex;
    SmallVector<Value> operands(ret.getOperands());
    SmallVector<Attribute> records;
    Builder b(f.getContext());
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      auto it = extents.find(v);
      if (it == extents.end()) continue;
      auto [slot, added] = countIndex.try_emplace(it->second.count, unsigned(operands.size()));
      if (added) operands.push_back(it->second.count);
      records.push_back(b.getDenseI64ArrayAttr({int64_t(i), int64_t(slot->second), it->second.axis}));
    }
    if (records.empty()) return success();
    ret->setOperands(operands);
    f.setType(FunctionType::get(f.getContext(), f.getArgumentTypes(), ret->getOperandTypes()));
    f->setAttr("sd.output_extents", b.getArrayAttr(records));
    return success();
  }
};

} // namespace
