// ONNX sequences made static at import. A plan holds tensors only, so the
// importer keeps each sequence as the list of its tensors (a token value
// stands for it, NodeImporter::sequences) and every sequence op becomes list
// work at compile time: SequenceEmpty, SequenceConstruct, SequenceInsert and
// SequenceErase make new lists, SequenceLength is a constant, SequenceAt
// picks a tensor, ConcatFromSequence concatenates (or stacks) them, and
// SplitToSequence splits a tensor into one. Positions must be known at
// compile time. A sequence may be carried through an unrolled Loop, which is
// how the dynamo exporter writes nn.EmbeddingBag: SequenceEmpty, a Loop
// inserting one bag's sum per iteration, then ConcatFromSequence.
#include "SequenceHandler.h"
#include "OpLibraryBridge.h"
#include "OpMaker.h"

using namespace mlir;
using namespace sd::ir;

namespace sd {
namespace {

FailureOr<SmallVector<Value>> sequenceInput(NodeImporter &imp, const onnx::NodeProto &n, int i) {
  if (i >= n.input_size()) return imp.fail("needs a sequence as input " + std::to_string(i)), failure();
  FailureOr<Value> v = imp.lookupAny(n.input(i));
  if (failed(v)) return failure();
  if (!imp.isSequence(*v)) return imp.fail("input '" + n.input(i) + "' is not a sequence"), failure();
  return imp.sequences[*v];
}

// A position operand (absent: `fallback`), known at compile time, checked
// against a sequence of `size` tensors (`end`: size itself is a position, as
// SequenceInsert's is); negative counts from the end.
FailureOr<int64_t> positionInput(NodeImporter &imp, const onnx::NodeProto &n, int i, int64_t size, bool end,
                                 int64_t fallback) {
  if (i >= n.input_size() || n.input(i).empty()) return fallback;
  FailureOr<Value> v = imp.lookup(n.input(i));
  if (failed(v)) return failure();
  auto known = dyn_cast_or_null<DenseElementsAttr>(constantValue(*v));
  if (!known || known.getNumElements() != 1 || !known.getElementType().isInteger(64))
    return imp.fail("position '" + n.input(i) + "' is run-time data, which is not supported (sdc needs sequence " +
                    "positions at compile time)"),
           failure();
  int64_t p = (*known.value_begin<APInt>()).getSExtValue();
  if (p < 0) p += size;
  if (p < 0 || p > size || (!end && p == size))
    return imp.fail("position " + std::to_string(p) + " is outside a sequence of " + std::to_string(size) +
                    " tensors"),
           failure();
  return p;
}

LogicalResult bindSequence(NodeImporter &imp, const onnx::NodeProto &n, SmallVector<Value> tensors) {
  if (n.output_size() > 0 && !n.output(0).empty()) imp.values[n.output(0)] = sequenceToken(imp, std::move(tensors));
  return success();
}

LogicalResult concatFromSequence(NodeImporter &imp, const onnx::NodeProto &n, ArrayRef<Value> tensors) {
  if (tensors.empty()) return imp.fail("concatenates an empty sequence");
  const auto *axisAttr = attrOf(n, "axis"), *newAxisAttr = attrOf(n, "new_axis");
  if (!axisAttr) return imp.fail("needs an axis");
  int64_t axis = axisAttr->i();
  bool newAxis = newAxisAttr && newAxisAttr->i();
  OpMaker m{imp};
  SmallVector<Value> parts(tensors.begin(), tensors.end());
  if (newAxis) {
    int64_t rank = cast<RankedTensorType>(parts[0].getType()).getRank() + 1;
    if (axis < 0) axis += rank;
    for (Value &p : parts) p = m.op("Unsqueeze", "unsqueeze", {p, imp.constI64({axis})});
  }
  Value out = parts.size() == 1 ? parts[0] : m.op("Concat", "concat", parts, {m.i64("axis", axis)});
  if (!m.ok) return failure();
  imp.values[n.output(0)] = out;
  return success();
}

// SplitToSequence(input, split?) {axis, keepdims}: no split gives pieces of
// one (squeezed unless keepdims), a scalar split pieces of that size (the
// last one smaller), a 1-D split those sizes.
LogicalResult splitToSequence(NodeImporter &imp, const onnx::NodeProto &n) {
  FailureOr<Value> x = imp.lookup(n.input(0));
  if (failed(x)) return failure();
  auto type = cast<RankedTensorType>(x->getType());
  const auto *axisAttr = attrOf(n, "axis"), *keepAttr = attrOf(n, "keepdims");
  int64_t axis = axisAttr ? axisAttr->i() : 0, rank = type.getRank();
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank || type.isDynamicDim(axis)) return imp.fail("needs a static axis to split along");
  int64_t length = type.getDimSize(axis);
  SmallVector<int64_t> sizes;
  bool squeeze = false;
  if (n.input_size() < 2 || n.input(1).empty()) {
    sizes.assign(size_t(length), 1);
    squeeze = keepAttr && !keepAttr->i(); // keepdims=0 drops the axis
  } else {
    FailureOr<Value> split = imp.lookup(n.input(1));
    if (failed(split)) return failure();
    auto known = dyn_cast_or_null<DenseElementsAttr>(constantValue(*split));
    if (!known) return imp.fail("a run-time split is not supported (sdc needs the pieces' sizes at compile time)");
    SmallVector<int64_t> given;
    for (const APInt &v : known.getValues<APInt>()) given.push_back(v.getSExtValue());
    if (cast<ShapedType>(known.getType()).getRank() == 0) {
      if (given[0] <= 0) return imp.fail("split must be positive");
      for (int64_t at = 0; at < length; at += given[0]) sizes.push_back(std::min(given[0], length - at));
    } else {
      sizes = given;
    }
  }
  OpMaker m{imp};
  SmallVector<Value> pieces;
  if (sizes.size() == 1) {
    pieces.push_back(*x);
  } else {
    OpSpec spec{"Split", 1, "split", 2, int(sizes.size()), nullptr};
    auto built = imp.buildOp(spec, {*x, imp.constI64(sizes)}, {m.i64("axis", axis)}, unsigned(sizes.size()));
    if (failed(built)) return failure();
    pieces.assign((*built)->getResults().begin(), (*built)->getResults().end());
  }
  if (squeeze)
    for (Value &p : pieces) p = m.op("Squeeze", "squeeze", {p, imp.constI64({axis})});
  if (!m.ok) return failure();
  return bindSequence(imp, n, pieces);
}

} // namespace

Value sequenceToken(NodeImporter &imp, SmallVector<Value> tensors) {
  Value t = imp.none();
  imp.sequences[t] = std::move(tensors);
  return t;
}

LogicalResult importSequenceOp(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  const std::string &op = n.op_type();
  if (op == "SequenceEmpty") return bindSequence(imp, n, {});
  if (op == "SequenceConstruct") {
    SmallVector<Value> tensors;
    for (const std::string &in : n.input()) {
      FailureOr<Value> v = imp.lookup(in);
      if (failed(v)) return failure();
      tensors.push_back(*v);
    }
    return bindSequence(imp, n, tensors);
  }
  if (op == "SplitToSequence") return splitToSequence(imp, n);
  FailureOr<SmallVector<Value>> seq = sequenceInput(imp, n, 0);
  if (failed(seq)) return failure();
  int64_t size = int64_t(seq->size());
  if (op == "SequenceLength") {
    imp.values[n.output(0)] = imp.constI64({size}, /*scalar=*/true);
    return success();
  }
  if (op == "ConcatFromSequence") return concatFromSequence(imp, n, *seq);
  if (op == "SequenceInsert") {
    FailureOr<Value> t = n.input_size() > 1 ? imp.lookup(n.input(1)) : FailureOr<Value>(failure());
    FailureOr<int64_t> at = positionInput(imp, n, 2, size, /*end=*/true, size);
    if (failed(t) || failed(at)) return failure();
    seq->insert(seq->begin() + *at, *t);
    return bindSequence(imp, n, *seq);
  }
  FailureOr<int64_t> at = positionInput(imp, n, 1, size, /*end=*/false, size - 1);
  if (failed(at)) return failure();
  if (op == "SequenceAt") {
    imp.values[n.output(0)] = (*seq)[size_t(*at)];
    return success();
  }
  // SequenceErase
  seq->erase(seq->begin() + *at);
  return bindSequence(imp, n, *seq);
}

} // namespace sd
