// ONNX op handlers, keyed by (op type, since_version). Most ops map 1:1 to an
// sd op (generic handler); older opsets that carried operands as attributes are
// upgraded to the newest form here, so everything downstream sees one form.
#include "SequenceHandler.h"
#include "AttentionHandler.h"
#include "ControlFlowHandler.h"
#include "FunctionOpsHandler.h"
#include "RecurrentHandler.h"
#include "RotaryHandler.h"
#include "ContribHandler.h"
#include "ImporterContext.h"
#include "OnnxImporter.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include <cstdio>
#include <map>

using namespace mlir;
using namespace sd::ir;

namespace sd {
namespace {

// Results to create: up to the last output the node names (unnamed trailing
// optional outputs are not computed), at most `spec.numResults` when fixed.
unsigned resultCount(const onnx::NodeProto &node, const OpSpec &spec) {
  unsigned named = 0;
  for (int i = 0; i < node.output_size(); ++i)
    if (!node.output(i).empty()) named = unsigned(i + 1);
  return spec.numResults < 0 ? named : std::max(1u, std::min(named, unsigned(spec.numResults)));
}

LogicalResult generic(NodeImporter &imp, const onnx::NodeProto &node, const OpSpec &spec) {
  auto operands = imp.operandsOf(node, spec);
  if (failed(operands)) return failure();
  auto attrs = imp.convertAttributes(node);
  if (failed(attrs)) return failure();
  unsigned nres = resultCount(node, spec);
  auto op = imp.buildOp(spec, *operands, *attrs, nres);
  if (failed(op)) return failure();
  return imp.bindResults(node, *op);
}

const onnx::AttributeProto *findAttr(const onnx::NodeProto &n, const char *name) {
  for (const auto &a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

// Moves INTS attribute `attr` into operand slot `slot` as an i64 constant.
LogicalResult attrToOperand(NodeImporter &imp, const onnx::NodeProto &node, const OpSpec &spec, const char *attr,
                            unsigned slot, SmallVector<StringRef> extraSkip = {}) {
  auto operands = imp.operandsOf(node, spec);
  if (failed(operands)) return failure();
  if (const auto *a = findAttr(node, attr)) {
    SmallVector<int64_t> v(a->ints().begin(), a->ints().end());
    if (slot >= operands->size()) return imp.fail("internal: bad operand slot");
    (*operands)[slot] = imp.constI64(v);
  }
  extraSkip.push_back(attr);
  auto attrs = imp.convertAttributes(node, extraSkip);
  if (failed(attrs)) return failure();
  unsigned nres = resultCount(node, spec);
  auto op = imp.buildOp(spec, *operands, *attrs, nres);
  if (failed(op)) return failure();
  return imp.bindResults(node, *op);
}

LogicalResult axesAttrToOperand(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  return attrToOperand(imp, n, s, "axes", 1);
}
LogicalResult splitAttrToOperand(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  return attrToOperand(imp, n, s, "split", 1);
}
LogicalResult topKAttrToOperand(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto operands = imp.operandsOf(n, s);
  if (failed(operands)) return failure();
  const auto *k = findAttr(n, "k");
  if (!k) return imp.fail("missing attribute 'k'");
  (*operands)[1] = imp.constI64({k->i()});
  auto attrs = imp.convertAttributes(n, {"k"});
  if (failed(attrs)) return failure();
  auto op = imp.buildOp(s, *operands, *attrs, resultCount(n, s));
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

LogicalResult sliceV1(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto data = imp.lookup(n.input(0));
  if (failed(data)) return failure();
  auto ints = [&](const char *name) -> Value {
    const auto *a = findAttr(n, name);
    if (!a) return imp.none();
    return imp.constI64(SmallVector<int64_t>(a->ints().begin(), a->ints().end()));
  };
  Value starts = ints("starts"), ends = ints("ends"), axes = ints("axes");
  if (isa<NoneType>(starts.getType()) || isa<NoneType>(ends.getType())) return imp.fail("missing starts/ends");
  auto op = imp.buildOp(s, {*data, starts, ends, axes, imp.none()}, {}, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

LogicalResult clipV1(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto x = imp.lookup(n.input(0));
  if (failed(x)) return failure();
  Type et = cast<ShapedType>(x->getType()).getElementType();
  const auto *mn = findAttr(n, "min"), *mx = findAttr(n, "max");
  Value lo = mn ? imp.constScalarLike(mn->f(), et) : imp.none();
  Value hi = mx ? imp.constScalarLike(mx->f(), et) : imp.none();
  auto op = imp.buildOp(s, {*x, lo, hi}, {}, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

// Identity of a tensor, or of a sequence: the same token (sequence ops never
// change a list, they make a new one; SequenceHandler.h).
LogicalResult identity(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  FailureOr<Value> v = n.input_size() ? imp.lookupAny(n.input(0)) : FailureOr<Value>(failure());
  if (succeeded(v) && imp.isSequence(*v)) {
    if (n.output_size() && !n.output(0).empty()) imp.values[n.output(0)] = *v;
    return success();
  }
  return generic(imp, n, s);
}

// CastLike(x, like) is Cast(x, to = like's element type): only like's type
// matters. As a Cast no value flows from `like`, so autodiff does not take it
// for a data dependence (dynamo writes ReLU6's bounds as CastLike(6, x)).
LogicalResult castLike(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto like = n.input_size() > 1 ? imp.lookup(n.input(1)) : FailureOr<Value>(failure());
  auto x = imp.lookup(n.input(0));
  if (failed(x) || failed(like)) return failure();
  std::optional<DType> to = toDType(cast<ShapedType>(like->getType()).getElementType());
  const OpSpec *castSpec = findOpSpec("Cast", imp.opset);
  if (!to || !castSpec) return generic(imp, n, s);
  auto attrs = imp.convertAttributes(n, {});
  if (failed(attrs)) return failure();
  attrs->push_back(imp.builder.getNamedAttr("to", imp.builder.getI64IntegerAttr(int64_t(*to))));
  auto op = imp.buildOp(*castSpec, {*x}, *attrs, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

LogicalResult padV2(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto x = imp.lookup(n.input(0));
  if (failed(x)) return failure();
  const auto *pads = findAttr(n, "pads");
  if (!pads) pads = findAttr(n, "paddings");
  if (!pads) return imp.fail("missing attribute 'pads'");
  Type et = cast<ShapedType>(x->getType()).getElementType();
  const auto *value = findAttr(n, "value");
  Value padsV = imp.constI64(SmallVector<int64_t>(pads->ints().begin(), pads->ints().end()));
  Value valueV = imp.constScalarLike(value ? value->f() : 0.0, et);
  auto attrs = imp.convertAttributes(n, {"pads", "paddings", "value"});
  if (failed(attrs)) return failure();
  auto op = imp.buildOp(s, {*x, padsV, valueV, imp.none()}, *attrs, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

// Softmax before opset 13 flattens the input to 2-D at `axis` (default 1).
LogicalResult softmaxV1(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto x = imp.lookup(n.input(0));
  if (failed(x)) return failure();
  const auto *axis = findAttr(n, "axis");
  SmallVector<NamedAttribute> attrs = {imp.builder.getNamedAttr("axis", imp.builder.getI64IntegerAttr(axis ? axis->i() : 1)),
                                       imp.builder.getNamedAttr("coerce2d", imp.builder.getI64IntegerAttr(1))};
  auto op = imp.buildOp(s, {*x}, attrs, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

// Legacy attributes with no effect at inference are dropped.
LogicalResult dropoutV1(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto x = imp.lookup(n.input(0));
  if (failed(x)) return failure();
  auto op = imp.buildOp(s, {*x, imp.none(), imp.none()}, {}, resultCount(n, s));
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

// The one value of input `name` when an initializer or a Constant holds it.
std::optional<double> constantScalarInput(NodeImporter &imp, const std::string &name) {
  ElementsAttr c;
  if (auto v = imp.values.find(name); v != imp.values.end()) c = constantValue(v->second);
  else if (auto g = imp.lazyGlobals.find(name); g != imp.lazyGlobals.end()) {
    std::string err;
    if (auto e = tensorToElements(imp.builder, *g->second, /*asResource=*/false, err); succeeded(e)) c = *e;
  }
  auto dense = dyn_cast_or_null<DenseElementsAttr>(c);
  if (!dense || dense.getNumElements() != 1) return std::nullopt;
  Type et = dense.getElementType();
  if (isa<FloatType>(et)) return (*dense.getValues<APFloat>().begin()).convertToDouble();
  if (et.isInteger(1)) return double(*dense.getValues<bool>().begin());
  return double((*dense.getValues<APInt>().begin()).getSExtValue());
}

// The dropout_rng state global's value: [seed, counter, row offset, rows],
// which the trainer seeds and sd-training-dropout advances per micro-batch.
Value randomState(NodeImporter &imp) {
  auto module = imp.builder.getInsertionBlock()->getParentOp()->getParentOfType<ModuleOp>();
  return loadRandomState(module, imp.builder, imp.loc);
}

// The stream of the next random node of the file: kExportedDropoutStream + k for the k-th.
NamedAttribute nextStream(NodeImporter &imp) {
  return imp.builder.getNamedAttr("stream", imp.builder.getI64IntegerAttr(kExportedDropoutStream + imp.randomSites++));
}

// A Dropout traced in train mode (training_mode true: a dynamo export of a
// module in train(), or TrainingMode.TRAINING) drops elements while a
// training plan trains, as PyTorch does, and nowhere else: it becomes
// seeded_dropout, which sd-training-dropout keeps in the training entries and
// removes from eval and infer. An inference import keeps the node, which the
// runtime refuses (a random mask).
LogicalResult dropout(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto mode = n.input_size() > 2 && !n.input(2).empty() ? constantScalarInput(imp, n.input(2)) : std::optional(0.0);
  if (!imp.options || !imp.options->training || !mode || *mode == 0) return generic(imp, n, s);
  auto ratio = n.input_size() > 1 && !n.input(1).empty() ? constantScalarInput(imp, n.input(1)) : std::optional(0.5);
  if (!ratio) return imp.fail("Dropout in training mode needs a constant ratio (an initializer or a Constant)");
  if (*ratio == 0) return generic(imp, n, s);
  if (*ratio < 0 || *ratio >= 1) {
    char shown[32];
    std::snprintf(shown, sizeof shown, "%g", *ratio);
    return imp.fail(std::string("Dropout ratio ") + shown + " is outside [0, 1)");
  }
  auto x = imp.lookup(n.input(0));
  if (failed(x)) return failure();
  Value rng = randomState(imp);
  SmallVector<NamedAttribute> attrs = {imp.builder.getNamedAttr("ratio", imp.builder.getF32FloatAttr(float(*ratio))),
                                       nextStream(imp)};
  OpSpec seeded{"SeededDropout", 1, "seeded_dropout", 2, 1, nullptr};
  auto y = imp.buildOp(seeded, {*x, rng}, attrs, 1);
  if (failed(y)) return failure();
  imp.values[n.output(0)] = (*y)->getResult(0);
  if (n.output_size() < 2 || n.output(1).empty()) return success();
  // The mask: where the same draw (stream, elements) keeps a one.
  Type et = cast<RankedTensorType>(x->getType()).getElementType();
  auto shape = imp.buildOp(OpSpec{"Shape", 15, "shape", 1, 1, nullptr}, {*x}, {}, 1);
  if (failed(shape)) return failure();
  auto ones = imp.buildOp(OpSpec{"Expand", 8, "expand", 2, 1, nullptr},
                          {imp.constScalarLike(1.0, et), (*shape)->getResult(0)}, {}, 1);
  if (failed(ones)) return failure();
  auto kept = imp.buildOp(seeded, {(*ones)->getResult(0), rng}, attrs, 1);
  if (failed(kept)) return failure();
  auto mask = imp.buildOp(OpSpec{"Greater", 13, "greater", 2, 1, nullptr},
                          {(*kept)->getResult(0), imp.constScalarLike(0.0, et)}, {}, 1);
  if (failed(mask)) return failure();
  imp.values[n.output(1)] = (*mask)->getResult(0);
  return success();
}

// RandomUniformLike and RandomNormalLike (shaped like input 0) and
// RandomUniform and RandomNormal (the `shape` attribute) in a training import
// (a train-mode export: Dropout2d's and drop path's Bernoulli masks, a VAE's
// noise) become seeded_random, drawn per micro-batch from the dropout_rng
// state like seeded_dropout; sd-training-dropout puts their expectation in
// eval and infer. Their `seed` gives way to sdrun's --seed.
LogicalResult randomOp(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  llvm::StringRef op = n.op_type();
  if (!imp.options || !imp.options->training)
    return imp.fail(op.str() + " draws random numbers, which sdc does only while training (a train-mode export's "
                                "dropout or noise): export the model after model.eval(), or compile it for training");
  const bool normal = op.starts_with("RandomNormal");
  auto floatAttr = [&](const char *name, float otherwise) {
    const auto *a = findAttr(n, name);
    return a ? a->f() : otherwise;
  };
  Value like;
  if (op.ends_with("Like")) {
    auto x = imp.lookup(n.input(0));
    if (failed(x)) return failure();
    like = *x;
  } else {
    const auto *shape = findAttr(n, "shape");
    if (!shape) return imp.fail("needs its shape attribute");
    auto zeros = imp.buildOp(OpSpec{"ConstantOfShape", 9, "constant_of_shape", 1, 1, nullptr},
                             {imp.constI64(SmallVector<int64_t>(shape->ints().begin(), shape->ints().end()))}, {}, 1);
    if (failed(zeros)) return failure();
    like = (*zeros)->getResult(0);
  }
  if (const auto *dtype = findAttr(n, "dtype"); dtype || !isa<FloatType>(cast<ShapedType>(like.getType()).getElementType())) {
    auto cast = imp.buildOp(OpSpec{"Cast", 13, "cast", 1, 1, nullptr}, {like},
                            {imp.builder.getNamedAttr("to", imp.builder.getI64IntegerAttr(dtype ? dtype->i() : 1))}, 1);
    if (failed(cast)) return failure();
    like = (*cast)->getResult(0);
  }
  SmallVector<NamedAttribute> attrs = {
      imp.builder.getNamedAttr("normal", imp.builder.getI64IntegerAttr(normal)),
      imp.builder.getNamedAttr("a", imp.builder.getF32FloatAttr(normal ? floatAttr("mean", 0) : floatAttr("low", 0))),
      imp.builder.getNamedAttr("b", imp.builder.getF32FloatAttr(normal ? floatAttr("scale", 1) : floatAttr("high", 1))),
      nextStream(imp)};
  auto y = imp.buildOp(OpSpec{"SeededRandom", 1, "seeded_random", 2, 1, nullptr}, {like, randomState(imp)}, attrs, 1);
  return failed(y) ? failure() : imp.bindResults(n, *y);
}

// PRelu before opset 7 applied a [C] slope per channel (axis 1); today's
// broadcasting aligns trailing dims, so reshape the slope to [C, 1, ..., 1].
LogicalResult preluLegacy(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto x = imp.lookup(n.input(0));
  auto slope = n.input_size() > 1 ? imp.lookup(n.input(1)) : FailureOr<Value>(failure());
  if (failed(x) || failed(slope)) return failure();
  auto xt = dyn_cast<RankedTensorType>(x->getType());
  auto st = dyn_cast<RankedTensorType>(slope->getType());
  Value sv = *slope;
  if (xt && st && st.getRank() == 1 && xt.getRank() > 2 && st.getDimSize(0) == xt.getDimSize(1)) {
    SmallVector<int64_t> shape(size_t(xt.getRank() - 1), 1);
    shape[0] = st.getDimSize(0);
    OpSpec reshape{"Reshape", 5, "reshape", 2, 1, nullptr};
    auto r = imp.buildOp(reshape, {sv, imp.constI64(shape)}, {}, 1);
    if (failed(r)) return failure();
    sv = (*r)->getResult(0);
  }
  auto op = imp.buildOp(s, {*x, sv}, {}, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

// Resize at opset 10 takes (X, scales) and behaves as asymmetric/floor.
LogicalResult resizeV10(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto x = imp.lookup(n.input(0));
  auto scales = n.input_size() > 1 ? imp.lookup(n.input(1)) : FailureOr<Value>(failure());
  if (failed(x) || failed(scales)) return failure();
  auto attrs = imp.convertAttributes(n);
  if (failed(attrs)) return failure();
  attrs->push_back(imp.builder.getNamedAttr("coordinate_transformation_mode", imp.builder.getStringAttr("asymmetric")));
  attrs->push_back(imp.builder.getNamedAttr("nearest_mode", imp.builder.getStringAttr("floor")));
  auto op = imp.buildOp(s, {*x, imp.none(), *scales, imp.none()}, *attrs, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

// Upsample (opset 9, deprecated at 10) is Resize-10: X and scales, asymmetric, floor.
LogicalResult upsampleV9(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  OpSpec resize = s;
  resize.opType = "Resize";
  return resizeV10(imp, n, resize);
}

// RoiAlign before opset 16 had no coordinate_transformation_mode and behaved
// as output_half_pixel (16's default is half_pixel).
LogicalResult roiAlignV10(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto operands = imp.operandsOf(n, s);
  auto attrs = imp.convertAttributes(n);
  if (failed(operands) || failed(attrs)) return failure();
  attrs->push_back(imp.builder.getNamedAttr("coordinate_transformation_mode",
                                            imp.builder.getStringAttr("output_half_pixel")));
  auto op = imp.buildOp(s, *operands, *attrs, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

// GatherND whose index tuples are one number (indices [..., 1], batch_dims
// 0: exporters write x[[i]]-style picks on the leading axis so, e.g. Falcon's
// fused q/k/v) is Gather on axis 0 with the last index axis squeezed, which
// has a gradient (GatherGrad, deterministic) and a kernel on every backend.
LogicalResult gatherND(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  const auto *batchDimsAttr = findAttr(n, "batch_dims");
  const int64_t batchDims = batchDimsAttr ? batchDimsAttr->i() : 0;
  auto data = imp.lookup(n.input(0));
  auto indices = n.input_size() > 1 ? imp.lookup(n.input(1)) : FailureOr<Value>(failure());
  if (failed(data) || failed(indices)) return failure();
  auto it = dyn_cast<RankedTensorType>(indices->getType());
  if (batchDims != 0 || !it || it.getRank() < 1 || it.getDimSize(it.getRank() - 1) != 1) return generic(imp, n, s);
  OpSpec squeeze{"Squeeze", 13, "squeeze", 2, 1, nullptr};
  auto picked = imp.buildOp(squeeze, {*indices, imp.constI64({-1})}, {}, 1);
  if (failed(picked)) return failure();
  OpSpec gather{"Gather", 13, "gather", 2, 1, nullptr};
  auto op = imp.buildOp(gather, {*data, (*picked)->getResult(0)},
                        {imp.builder.getNamedAttr("axis", imp.builder.getI64IntegerAttr(0))}, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

// Scatter (opsets 9-10) was renamed ScatterElements at 11, semantics unchanged.
LogicalResult scatterV9(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  OpSpec renamed = s;
  renamed.opType = "ScatterElements";
  return generic(imp, n, renamed);
}

LogicalResult batchNormLegacy(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  if (const auto *sp = findAttr(n, "spatial"); sp && sp->i() == 0)
    return imp.fail("BatchNormalization with spatial=0 is not supported");
  const auto *training = findAttr(n, "training_mode");
  if ((training && training->i()) || imp.trainModeNorms.count(n.name())) return importBatchNormTraining(imp, n, s);
  for (int i = 1; i < n.output_size(); ++i)
    if (!n.output(i).empty()) return imp.fail("BatchNormalization's running statistics come only with training_mode=1");
  auto operands = imp.operandsOf(n, s);
  if (failed(operands)) return failure();
  for (int i = 3; i < 5 && i < n.input_size(); ++i) {
    auto merged = imp.lazyGlobals.find(n.input(i));
    if (!imp.mergedStatistics.count(n.input(i)) || merged == imp.lazyGlobals.end()) continue;
    std::string err;
    auto value = tensorToElements(imp.builder, *merged->second, /*asResource=*/false, err);
    if (failed(value)) return imp.fail(err);
    (*operands)[size_t(i)] = imp.builder.create<ConstantOp>(imp.loc, value->getType(), *value);
  }
  auto attrs = imp.convertAttributes(n, {"spatial", "is_test", "consumed_inputs", "training_mode"});
  if (failed(attrs)) return failure();
  auto op = imp.buildOp(s, *operands, *attrs, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

LogicalResult gemmLegacy(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto operands = imp.operandsOf(n, s);
  if (failed(operands)) return failure();
  auto attrs = imp.convertAttributes(n, {"broadcast"});
  if (failed(attrs)) return failure();
  auto op = imp.buildOp(s, *operands, *attrs, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

LogicalResult constantOp(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (n.attribute_size() != 1) return imp.fail("Constant needs exactly one value attribute");
  const auto &a = n.attribute(0);
  Builder &b = imp.builder;
  ElementsAttr value;
  std::string err;
  auto vec = [&](Type et, auto values) {
    auto t = RankedTensorType::get({int64_t(values.size())}, et);
    return cast<ElementsAttr>(DenseElementsAttr::get(t, ArrayRef(values)));
  };
  if (a.name() == "value" && a.type() == onnx::AttributeProto::TENSOR) {
    auto v = tensorToElements(b, a.t(), /*asResource=*/false, err);
    if (failed(v)) return imp.fail(err);
    value = *v;
  } else if (a.name() == "value_float") {
    value = cast<ElementsAttr>(DenseElementsAttr::get(RankedTensorType::get({}, b.getF32Type()), a.f()));
  } else if (a.name() == "value_int") {
    value = cast<ElementsAttr>(DenseElementsAttr::get(RankedTensorType::get({}, b.getI64Type()), a.i()));
  } else if (a.name() == "value_floats") {
    value = vec(b.getF32Type(), SmallVector<float>(a.floats().begin(), a.floats().end()));
  } else if (a.name() == "value_ints") {
    value = vec(b.getI64Type(), SmallVector<int64_t>(a.ints().begin(), a.ints().end()));
  } else {
    return imp.fail("Constant attribute '" + a.name() + "' is not supported");
  }
  if (n.output_size() != 1) return imp.fail("Constant has one output");
  imp.values[n.output(0)] = imp.builder.create<ConstantOp>(imp.loc, value.getType(), value);
  return success();
}

LogicalResult constantOfShape(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto shape = imp.lookup(n.input(0));
  if (failed(shape)) return failure();
  double value = 0;
  int64_t dtype = int64_t(DType::F32);
  if (const auto *a = findAttr(n, "value")) {
    std::string err;
    auto v = tensorToElements(imp.builder, a->t(), false, err);
    if (failed(v)) return imp.fail(err);
    std::vector<uint8_t> bytes;
    if (!elementsToBytes(*v, bytes) || v->getNumElements() != 1) return imp.fail("value must hold one element");
    dtype = a->t().data_type();
    TensorView tv{bytes.data(), DType(dtype), {}};
    std::vector<double> d;
    if (!readDoubles(tv, d)) return imp.fail("value type is unsupported");
    value = d[0];
  }
  Builder &b = imp.builder;
  SmallVector<NamedAttribute> attrs = {b.getNamedAttr("value", b.getF64FloatAttr(value)),
                                       b.getNamedAttr("dtype", b.getI64IntegerAttr(dtype))};
  auto op = imp.buildOp(s, {*shape}, attrs, 1);
  return failed(op) ? failure() : imp.bindResults(n, *op);
}

// Ops whose sd form has every result, however many the node names: Unique,
// and the selections whose extra last result counts what they selected.
LogicalResult allResults(NodeImporter &imp, const onnx::NodeProto &node, const OpSpec &spec) {
  auto operands = imp.operandsOf(node, spec);
  if (failed(operands)) return failure();
  auto attrs = imp.convertAttributes(node);
  if (failed(attrs)) return failure();
  auto op = imp.buildOp(spec, *operands, *attrs, unsigned(spec.numResults));
  return failed(op) ? failure() : imp.bindResults(node, *op);
}

// TopK's k as an input (opset 10+): a k known now (a constant, or shape
// arithmetic the importer folded) gives TopK; one known only at run time gives
// TopKBounded, sized for the whole axis, with k as its count.
LogicalResult topKV10(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &s) {
  auto operands = imp.operandsOf(n, s);
  if (failed(operands)) return failure();
  if (constantValue((*operands)[1])) return generic(imp, n, s);
  OpSpec bounded{"TopKBounded", s.sinceVersion, "top_k_bounded", 2, 3, nullptr};
  return allResults(imp, n, bounded);
}

// DFT's axis: an attribute (default 1) before opset 20, an optional input
// (default -2) since; sd carries the default as the attribute either way.
LogicalResult dftOp(NodeImporter &imp, const onnx::NodeProto &node, const OpSpec &spec) {
  auto operands = imp.operandsOf(node, spec);
  if (failed(operands)) return failure();
  auto attrs = imp.convertAttributes(node);
  if (failed(attrs)) return failure();
  if (!llvm::any_of(*attrs, [](NamedAttribute a) { return a.getName() == "axis"; }))
    attrs->push_back(imp.builder.getNamedAttr("axis", imp.builder.getI64IntegerAttr(spec.sinceVersion >= 20 ? -2 : 1)));
  auto op = imp.buildOp(spec, *operands, *attrs, 1);
  return failed(op) ? failure() : imp.bindResults(node, *op);
}

// The table. Generic ops register at version 1; upgrades where semantics moved.
#define G(type, mn, nops, nres) {type, 1, mn, nops, nres, generic}
const OpSpec kSpecs[] = {
    // Elementwise unary.
    G("Exp", "exp", 1, 1), G("Log", "log", 1, 1), G("Sqrt", "sqrt", 1, 1), G("Reciprocal", "reciprocal", 1, 1),
    G("Sin", "sin", 1, 1), G("Cos", "cos", 1, 1), G("Tan", "tan", 1, 1), G("Asin", "asin", 1, 1),
    G("Acos", "acos", 1, 1), G("Atan", "atan", 1, 1), G("Sinh", "sinh", 1, 1), G("Cosh", "cosh", 1, 1),
    G("Asinh", "asinh", 1, 1), G("Acosh", "acosh", 1, 1), G("Atanh", "atanh", 1, 1), G("Tanh", "tanh", 1, 1),
    G("Erf", "erf", 1, 1), G("Sigmoid", "sigmoid", 1, 1), G("Softsign", "softsign", 1, 1),
    G("Softplus", "softplus", 1, 1), G("Mish", "mish", 1, 1), G("HardSwish", "hard_swish", 1, 1),
    G("Neg", "neg", 1, 1), G("Abs", "abs", 1, 1), G("Sign", "sign", 1, 1), G("Relu", "relu", 1, 1),
    G("Floor", "floor", 1, 1), G("Ceil", "ceil", 1, 1), G("Round", "round", 1, 1), {"Identity", 1, "identity", 1, 1, identity},
    G("Not", "not", 1, 1), G("BitCast", "bit_cast", 1, 1), G("BitwiseNot", "bitwise_not", 1, 1), G("Swish", "swish", 1, 1), G("Shrink", "shrink", 1, 1), G("IsNaN", "is_nan", 1, 1), G("IsInf", "is_inf", 1, 1),
    G("HardSigmoid", "hard_sigmoid", 1, 1), G("LeakyRelu", "leaky_relu", 1, 1), G("Elu", "elu", 1, 1),
    G("Selu", "selu", 1, 1), G("Celu", "celu", 1, 1), G("ThresholdedRelu", "thresholded_relu", 1, 1),
    G("Gelu", "gelu", 1, 1), G("Cast", "cast", 1, 1), {"CastLike", 15, "cast_like", 2, 1, castLike},
    // Binary and variadic.
    G("Add", "add", 2, 1), G("Sub", "sub", 2, 1), G("Mul", "mul", 2, 1), G("Div", "div", 2, 1),
    G("Pow", "pow", 2, 1), G("And", "and", 2, 1), G("Or", "or", 2, 1), G("Xor", "xor", 2, 1),
    G("BitwiseAnd", "bitwise_and", 2, 1), G("BitwiseOr", "bitwise_or", 2, 1), G("BitwiseXor", "bitwise_xor", 2, 1),
    G("Equal", "equal", 2, 1), G("Less", "less", 2, 1), G("LessOrEqual", "less_or_equal", 2, 1),
    G("Greater", "greater", 2, 1), G("GreaterOrEqual", "greater_or_equal", 2, 1), {"PRelu", 1, "prelu", 2, 1, preluLegacy}, {"PRelu", 7, "prelu", 2, 1, generic},
    G("Mod", "mod", 2, 1), G("BitShift", "bit_shift", 2, 1), G("Min", "min", -1, 1), G("Max", "max", -1, 1),
    G("Mean", "mean", -1, 1), G("Sum", "sum", -1, 1), G("Where", "where", 3, 1),
    {"Clip", 1, "clip", 3, 1, clipV1}, {"Clip", 11, "clip", 3, 1, generic},
    {"Dropout", 1, "dropout", 3, 2, dropoutV1}, {"Dropout", 12, "dropout", 3, 2, dropout},
    {"RandomUniformLike", 1, "seeded_random", 2, 1, randomOp}, {"RandomNormalLike", 1, "seeded_random", 2, 1, randomOp},
    {"RandomUniform", 1, "seeded_random", 0, 1, randomOp}, {"RandomNormal", 1, "seeded_random", 0, 1, randomOp},
    // Linear algebra.
    G("MatMul", "matmul", 2, 1), {"Gemm", 1, "gemm", 3, 1, gemmLegacy}, {"Gemm", 7, "gemm", 3, 1, generic},
    // Softmax family.
    {"Softmax", 1, "softmax", 1, 1, softmaxV1}, {"Softmax", 13, "softmax", 1, 1, generic},
    {"LogSoftmax", 1, "log_softmax", 1, 1, softmaxV1}, {"LogSoftmax", 13, "log_softmax", 1, 1, generic},
    {"Hardmax", 1, "hardmax", 1, 1, softmaxV1}, {"Hardmax", 13, "hardmax", 1, 1, generic},
    // Reductions: axes moved from attribute to operand (ReduceSum at 13, the rest at 18).
    {"ReduceSum", 1, "reduce_sum", 2, 1, axesAttrToOperand}, {"ReduceSum", 13, "reduce_sum", 2, 1, generic},
    {"ReduceMean", 1, "reduce_mean", 2, 1, axesAttrToOperand}, {"ReduceMean", 18, "reduce_mean", 2, 1, generic},
    {"ReduceMax", 1, "reduce_max", 2, 1, axesAttrToOperand}, {"ReduceMax", 18, "reduce_max", 2, 1, generic},
    {"ReduceMin", 1, "reduce_min", 2, 1, axesAttrToOperand}, {"ReduceMin", 18, "reduce_min", 2, 1, generic},
    {"ReduceProd", 1, "reduce_prod", 2, 1, axesAttrToOperand}, {"ReduceProd", 18, "reduce_prod", 2, 1, generic},
    {"ReduceL1", 1, "reduce_l1", 2, 1, axesAttrToOperand}, {"ReduceL1", 18, "reduce_l1", 2, 1, generic},
    {"ReduceL2", 1, "reduce_l2", 2, 1, axesAttrToOperand}, {"ReduceL2", 18, "reduce_l2", 2, 1, generic},
    {"ReduceLogSum", 1, "reduce_log_sum", 2, 1, axesAttrToOperand},
    {"ReduceLogSum", 18, "reduce_log_sum", 2, 1, generic},
    {"ReduceLogSumExp", 1, "reduce_log_sum_exp", 2, 1, axesAttrToOperand},
    {"ReduceLogSumExp", 18, "reduce_log_sum_exp", 2, 1, generic},
    {"ReduceSumSquare", 1, "reduce_sum_square", 2, 1, axesAttrToOperand},
    {"ReduceSumSquare", 18, "reduce_sum_square", 2, 1, generic},
    G("ArgMax", "arg_max", 1, 1), G("ArgMin", "arg_min", 1, 1),
    // Normalization.
    {"LayerNormalization", 17, "layer_normalization", 3, 3, generic},
    {"RMSNormalization", 23, "rms_normalization", 2, 1, generic},
    {"BatchNormalization", 1, "batch_normalization", 5, 1, batchNormLegacy},
    {"GroupNormalization", 18, "instance_normalization", 3, 1, importGroupNormalization},
    {"GroupNormalization", 21, "instance_normalization", 3, 1, importGroupNormalization},
    G("InstanceNormalization", "instance_normalization", 3, 1), G("LpNormalization", "lp_normalization", 1, 1),
    G("MeanVarianceNormalization", "mean_variance_normalization", 1, 1),
    // Convolution and pooling.
    G("Conv", "conv", 3, 1), G("ConvTranspose", "conv_transpose", 3, 1),
    {"MaxPool", 1, "max_pool", 1, 2, generic}, G("AveragePool", "average_pool", 1, 1), G("LpPool", "lp_pool", 1, 1),
    G("GlobalAveragePool", "global_average_pool", 1, 1), G("GlobalMaxPool", "global_max_pool", 1, 1),
    G("GlobalLpPool", "global_lp_pool", 1, 1),
    {"Resize", 10, "resize", 4, 1, resizeV10}, {"Resize", 11, "resize", 4, 1, generic},
    {"Einsum", 12, "einsum", -1, 1, generic},
    // Quantization.
    {"QuantizeLinear", 10, "quantize_linear", 3, 1, generic},
    {"DequantizeLinear", 10, "dequantize_linear", 3, 1, generic},
    {"DynamicQuantizeLinear", 11, "dynamic_quantize_linear", 1, 3, generic},
    {"MatMulInteger", 10, "matmul_integer", 4, 1, generic}, {"QLinearMatMul", 10, "qlinear_matmul", 8, 1, generic},
    {"ConvInteger", 10, "conv_integer", 4, 1, generic}, {"QLinearConv", 10, "qlinear_conv", 9, 1, generic},
    // Losses.
    {"SoftmaxCrossEntropyLoss", 12, "softmax_cross_entropy_loss", 3, 2, generic},
    {"NegativeLogLikelihoodLoss", 12, "negative_log_likelihood_loss", 3, 1, generic},
    // Shape and data movement.
    {"Reshape", 5, "reshape", 2, 1, generic}, G("Transpose", "transpose", 1, 1), G("Concat", "concat", -1, 1),
    {"Split", 2, "split", 2, -1, splitAttrToOperand}, {"Split", 13, "split", 2, -1, generic},
    {"Slice", 1, "slice", 5, 1, sliceV1}, {"Slice", 10, "slice", 5, 1, generic},
    G("Gather", "gather", 2, 1), G("GatherElements", "gather_elements", 2, 1), {"GatherND", 1, "gather_nd", 2, 1, gatherND},
    G("ScatterElements", "scatter_elements", 3, 1), G("ScatterND", "scatter_nd", 3, 1),
    {"Scatter", 9, "scatter_elements", 3, 1, scatterV9}, {"Upsample", 9, "resize", 4, 1, upsampleV9},
    G("Expand", "expand", 2, 1),
    {"Squeeze", 1, "squeeze", 2, 1, axesAttrToOperand}, {"Squeeze", 13, "squeeze", 2, 1, generic},
    {"Unsqueeze", 1, "unsqueeze", 2, 1, axesAttrToOperand}, {"Unsqueeze", 13, "unsqueeze", 2, 1, generic},
    G("Flatten", "flatten", 1, 1), G("Shape", "shape", 1, 1), G("Size", "size", 1, 1),
    {"ConstantOfShape", 9, "constant_of_shape", 1, 1, constantOfShape}, G("EyeLike", "eye_like", 1, 1),
    G("OneHot", "one_hot", 3, 1), G("Range", "range", 3, 1), {"Tile", 6, "tile", 2, 1, generic},
    {"Pad", 2, "pad", 4, 1, padV2}, {"Pad", 11, "pad", 4, 1, generic},
    G("DepthToSpace", "depth_to_space", 1, 1), G("SpaceToDepth", "space_to_depth", 1, 1),
    {"TopK", 1, "top_k", 2, 2, topKAttrToOperand}, {"TopK", 10, "top_k", 2, 2, topKV10},
    {"Attention", 23, "attention", -1, -1, importAttention},
    {"FlexAttention", 1, "matmul", -1, 1, importFlexAttention}, // ai.onnx.preview (OnnxImporter.cpp)
    {"RotaryEmbedding", 23, "rotary_embedding", -1, 1, importRotaryEmbedding},
    // onnxruntime registers this contrib op in the default domain (ContribHandler.cpp).
    {"SimplifiedLayerNormalization", 1, "rms_normalization", -1, 1, importSimplifiedLayerNorm},
    {"GridSample", 16, "grid_sample", 2, 1, generic},
    {"CausalConvWithState", 27, "conv", -1, -1, importCausalConvWithState},
    {"LinearAttention", 27, "linear_attention", 6, 2, allResults},
    {"TensorScatter", 24, "tensor_scatter", 3, 1, generic},
    {"AffineGrid", 20, "affine_grid", 2, 1, generic}, {"CenterCropPad", 18, "center_crop_pad", 2, 1, generic},
    {"Col2Im", 18, "col2im", 3, 1, generic}, {"DeformConv", 19, "deform_conv", 5, 1, generic},
    {"RoiAlign", 10, "roi_align", 3, 1, roiAlignV10}, {"RoiAlign", 16, "roi_align", 3, 1, generic},
    {"MaxUnpool", 9, "max_unpool", 3, 1, generic}, G("Det", "det", 1, 1),
    {"ReverseSequence", 10, "reverse_sequence", 2, 1, generic}, G("LRN", "lrn", 1, 1),
    {"TfIdfVectorizer", 9, "tfidf_vectorizer", 1, 1, generic},
    {"SwiGLU", 28, "swish", -1, 1, importSwiGlu},
    {"DFT", 17, "dft", 3, 1, dftOp}, {"DFT", 20, "dft", 3, 1, dftOp}, {"STFT", 17, "stft", 4, 1, generic},
    {"HannWindow", 17, "hann_window", 1, 1, generic}, {"HammingWindow", 17, "hamming_window", 1, 1, generic},
    {"BlackmanWindow", 17, "blackman_window", 1, 1, generic},
    {"MelWeightMatrix", 17, "mel_weight_matrix", 5, 1, generic},
    {"NonZero", 1, "non_zero", 1, 2, allResults}, {"Compress", 1, "compress", 2, 2, allResults},
    {"Unique", 1, "unique", 1, 5, allResults}, {"NonMaxSuppression", 10, "non_max_suppression", 5, 2, allResults},
    G("Trilu", "trilu", 2, 1), G("CumSum", "cum_sum", 2, 1), G("CumProd", "cum_prod", 2, 1),
    {"Constant", 1, "constant", 0, 1, constantOp},
    // Control flow, made static at import (ControlFlowHandler.cpp). Loop's M and
    // Scan-8's sequence_lens may be absent: no first-input check (0 operands).
    {"If", 1, "if_select", -1, -1, importIf}, {"Loop", 1, "loop_guard", 0, -1, importLoop},
    // Sequences: lists the importer keeps (SequenceHandler.h).
    {"SequenceEmpty", 11, "", 0, 1, importSequenceOp}, {"SequenceConstruct", 11, "", -1, 1, importSequenceOp},
    {"SequenceInsert", 11, "", 3, 1, importSequenceOp}, {"SequenceAt", 11, "", 2, 1, importSequenceOp},
    {"SequenceErase", 11, "", 2, 1, importSequenceOp}, {"SequenceLength", 11, "", 1, 1, importSequenceOp},
    {"ConcatFromSequence", 11, "", 1, 1, importSequenceOp}, {"SplitToSequence", 11, "", 2, 1, importSequenceOp},
    {"Scan", 8, "gather", 0, -1, importScan},
    // Recurrent nets: one input GEMM per direction, the recurrence unrolled (RecurrentHandler.cpp).
    {"RNN", 7, "matmul", -1, -1, importRecurrent}, {"GRU", 7, "matmul", -1, -1, importRecurrent},
    {"LSTM", 7, "matmul", -1, -1, importRecurrent},
};
#undef G

} // namespace

const OpSpec *findOpSpec(const std::string &opType, int64_t opset) {
  const OpSpec *best = nullptr;
  for (const OpSpec &s : kSpecs)
    if (opType == s.opType && s.sinceVersion <= opset && (!best || s.sinceVersion >= best->sinceVersion)) best = &s;
  return best;
}

bool isKnownOpType(const std::string &opType) {
  for (const OpSpec &s : kSpecs)
    if (opType == s.opType) return true;
  return false;
}

} // namespace sd
