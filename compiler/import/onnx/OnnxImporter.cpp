// Walks an ONNX graph and builds the sd module: globals for weights, one
// `infer` entry, a handler call per node.
#include "sd/format/training_abi.h"
#include "OnnxImporter.h"
#include "ContribHandler.h"
#include "ImporterContext.h"
#include "OpLibraryBridge.h"
#include "CountedExtents.h"
#include "KernelFold.h"
#include "TorchExports.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "mlir/IR/BuiltinDialect.h"
#include "mlir/IR/Verifier.h"
#include <google/protobuf/unknown_field_set.h>
#include "llvm/ADT/ScopeExit.h"
#include <algorithm>
#include <cctype>
#include <deque>
#include <map>
#include <optional>
#include <set>

using namespace mlir;
using namespace sd::ir;

namespace sd {

FailureOr<RankedTensorType> tensorTypeOf(Builder &b, const onnx::TensorProto &t, std::string &error) {
  if (!dtypeIsKnown(t.data_type())) {
    error = "tensor '" + t.name() + "' has unsupported data type " + std::to_string(t.data_type());
    return failure();
  }
  Type et = toMlirType(b.getContext(), DType(t.data_type()));
  if (!et.isIntOrFloat()) {
    error = "tensor '" + t.name() + "' is a constant of type " + dtypeName(DType(t.data_type())) +
            ", which sdc takes only as a graph input or a computed value";
    return failure();
  }
  SmallVector<int64_t> dims;
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0) {
      error = "tensor '" + t.name() + "' has negative dim";
      return failure();
    }
    if (d > 0 && n > (int64_t(1) << 40) / d) {
      error = "tensor '" + t.name() + "' has more than 2^40 elements";
      return failure();
    }
    n *= std::max<int64_t>(d, 1);
    dims.push_back(d);
  }
  return RankedTensorType::get(dims, et);
}

FailureOr<ElementsAttr> tensorToElements(Builder &b, const onnx::TensorProto &t, bool asResource, std::string &error) {
  auto type = tensorTypeOf(b, t, error);
  if (failed(type)) return failure();
  DType dt = DType(t.data_type());
  size_t es = dtypeSize(dt);
  int64_t n = type->getNumElements();
  std::vector<uint8_t> bytes(size_t(n) * es);
  if (t.has_raw_data()) {
    size_t packed = packedSize(dt, n); // 4- and 2-bit integers come packed; sdc holds a byte each
    if (t.raw_data().size() != packed) {
      error = "tensor '" + t.name() + "' raw_data holds " + std::to_string(t.raw_data().size()) + " bytes, needs " +
              std::to_string(packed);
      return failure();
    }
    if (packed != bytes.size()) {
      unpackNarrow(dt, reinterpret_cast<const uint8_t *>(t.raw_data().data()), n, bytes.data());
      return cast<ElementsAttr>(bytesToElements(*type, bytes));
    }
    if (asResource) {
      // Reference the proto's bytes in place: no copy of large weights.
      auto blob = UnmanagedAsmResourceBlob::allocateWithAlign(ArrayRef<char>(t.raw_data().data(), t.raw_data().size()), 1);
      return cast<ElementsAttr>(DenseResourceElementsAttr::get(*type, t.name().empty() ? "weight" : t.name(), std::move(blob)));
    }
    std::memcpy(bytes.data(), t.raw_data().data(), bytes.size());
  } else {
    auto fill = [&](auto &field, auto conv) -> bool {
      if (field.size() != n) return false;
      for (int64_t i = 0; i < n; ++i) conv(i, field.Get(int(i)));
      return true;
    };
    bool ok = false;
    switch (dt) {
    case DType::F32: ok = fill(t.float_data(), [&](int64_t i, float v) { std::memcpy(&bytes[size_t(i) * 4], &v, 4); }); break;
    case DType::F64: ok = fill(t.double_data(), [&](int64_t i, double v) { std::memcpy(&bytes[size_t(i) * 8], &v, 8); }); break;
    case DType::I64: ok = fill(t.int64_data(), [&](int64_t i, int64_t v) { std::memcpy(&bytes[size_t(i) * 8], &v, 8); }); break;
    case DType::U32: case DType::U64:
      ok = fill(t.uint64_data(), [&](int64_t i, uint64_t v) { std::memcpy(&bytes[size_t(i) * es], &v, es); });
      break;
    case DType::String: break;
    default:
      ok = fill(t.int32_data(), [&](int64_t i, int32_t v) { std::memcpy(&bytes[size_t(i) * es], &v, es); });
    }
    if (!ok) {
      error = "tensor '" + t.name() + "' holds the wrong number of values for shape";
      return failure();
    }
    if (asResource) {
      auto blob = HeapAsmResourceBlob::allocateAndCopyWithAlign(
          ArrayRef<char>(reinterpret_cast<const char *>(bytes.data()), bytes.size()), 64);
      return cast<ElementsAttr>(DenseResourceElementsAttr::get(*type, t.name().empty() ? "weight" : t.name(), std::move(blob)));
    }
  }
  DenseElementsAttr attr = bytesToElements(*type, bytes);
  if (!attr) {
    error = "tensor '" + t.name() + "' data is malformed";
    return failure();
  }
  return cast<ElementsAttr>(attr);
}

FailureOr<Value> NodeImporter::lookup(const std::string &name) {
  FailureOr<Value> v = lookupAny(name);
  if (succeeded(v) && isSequence(*v))
    return fail("takes '" + name + "', a sequence, where it needs a tensor; that is not supported (sdc keeps " +
                "sequences only between the sequence ops, Identity and unrolled Loops)"),
           failure();
  return v;
}

FailureOr<Value> NodeImporter::lookupAny(const std::string &name) {
  if (name.empty()) return none();
  auto it = values.find(name);
  if (it != values.end()) return it->second;
  auto g = lazyGlobals.find(name);
  if (g != lazyGlobals.end()) {
    // First use of a weight: load it at the top of the entry so every use dominates.
    OpBuilder::InsertionGuard guard(builder);
    Block *block = builder.getInsertionBlock();
    builder.setInsertionPointToStart(block);
    std::string err;
    auto type = tensorTypeOf(builder, *g->second, err);
    if (failed(type)) return fail(err), failure();
    Value v = builder.create<GlobalLoadOp>(loc, *type, FlatSymbolRefAttr::get(builder.getContext(), name));
    values[name] = v;
    return v;
  }
  fail("uses '" + name + "', which no earlier node, input or initializer defines");
  return failure();
}

Value NodeImporter::none() { return builder.create<NoneOp>(loc, builder.getNoneType()); }

Value NodeImporter::constI64(ArrayRef<int64_t> vals, bool scalar) {
  auto type = RankedTensorType::get(scalar ? ArrayRef<int64_t>{} : ArrayRef<int64_t>{int64_t(vals.size())},
                                    builder.getI64Type());
  return builder.create<ConstantOp>(loc, type, DenseElementsAttr::get(type, vals));
}

Value NodeImporter::constScalarLike(double v, Type et) {
  auto type = RankedTensorType::get({}, et);
  Attribute a;
  if (isa<FloatType>(et)) a = DenseElementsAttr::get(type, builder.getFloatAttr(et, v));
  else a = DenseElementsAttr::get(type, builder.getIntegerAttr(et, int64_t(v)));
  return builder.create<ConstantOp>(loc, type, cast<ElementsAttr>(a));
}

FailureOr<SmallVector<NamedAttribute>> NodeImporter::convertAttributes(const onnx::NodeProto &node,
                                                                       ArrayRef<StringRef> skip) {
  SmallVector<NamedAttribute> out;
  for (const auto &a : node.attribute()) {
    if (llvm::is_contained(skip, StringRef(a.name()))) continue;
    Attribute v;
    switch (a.type()) {
    case onnx::AttributeProto::INT: v = builder.getI64IntegerAttr(a.i()); break;
    case onnx::AttributeProto::FLOAT: v = builder.getF32FloatAttr(a.f()); break;
    case onnx::AttributeProto::STRING: v = builder.getStringAttr(a.s()); break;
    case onnx::AttributeProto::INTS: {
      SmallVector<int64_t> xs(a.ints().begin(), a.ints().end());
      v = builder.getDenseI64ArrayAttr(xs);
      break;
    }
    case onnx::AttributeProto::FLOATS: {
      SmallVector<float> xs(a.floats().begin(), a.floats().end());
      v = builder.getDenseF32ArrayAttr(xs);
      break;
    }
    default:
      return fail("attribute '" + a.name() + "' has a kind (" + onnx::AttributeProto::AttributeType_Name(a.type()) +
                  ") this op does not accept"), failure();
    }
    out.push_back(builder.getNamedAttr(a.name(), v));
  }
  return out;
}

FailureOr<SmallVector<Value>> NodeImporter::operandsOf(const onnx::NodeProto &node, const OpSpec &spec) {
  SmallVector<Value> ops;
  for (const std::string &in : node.input()) {
    auto v = lookup(in);
    if (failed(v)) return failure();
    ops.push_back(*v);
  }
  if (spec.numOperands >= 0) {
    if (int(ops.size()) > spec.numOperands)
      return fail("has " + std::to_string(ops.size()) + " inputs, at most " + std::to_string(spec.numOperands) +
                  " are supported"), failure();
    while (int(ops.size()) < spec.numOperands) ops.push_back(none());
  }
  return ops;
}

FailureOr<Operation *> NodeImporter::buildOp(const OpSpec &spec, ArrayRef<Value> operands,
                                             ArrayRef<NamedAttribute> attrs, unsigned numResults) {
  std::string opName = std::string("sd.") + spec.mnemonic;
  OperationState state(loc, opName);
  auto info = state.name.getRegisteredInfo();
  if (!info) return fail("internal: op " + opName + " is not registered"), failure();
  for (const NamedAttribute &a : attrs)
    if (!llvm::is_contained(info->getAttributeNames(), a.getName()))
      return fail("attribute '" + a.getName().str() + "' is not supported"), failure();
  state.addOperands(operands);
  state.addAttributes(attrs);
  // Result types from the shared shape rules, using constant operand values.
  OpShapeQuery q =
      buildShapeQuery(ValueRange(operands), toAttrMap(DictionaryAttr::get(builder.getContext(), attrs)), numResults);
  Status s = inferShapes(spec.opType, *q.ctx);
  if (!s.isOk()) return fail(s.message()), failure();
  for (const TensorInfo &o : q.ctx->outputs) {
    Type t = toTensorType(builder.getContext(), o);
    if (!t) return fail(std::string("result type ") + dtypeName(o.dtype) + " is not supported"), failure();
    state.addTypes(t);
  }
  Operation *op = builder.create(state);
  // Collect the verifier's message instead of printing it.
  std::string diag;
  {
    ScopedDiagnosticHandler handler(builder.getContext(), [&](Diagnostic &d) {
      if (diag.empty()) diag = d.str();
      return success();
    });
    if (failed(verify(op))) {
      op->erase();
      return fail(diag.empty() ? "is invalid" : diag), failure();
    }
  }
  return op;
}

LogicalResult NodeImporter::bindResults(const onnx::NodeProto &node, Operation *op) {
  for (int i = 0; i < node.output_size(); ++i) {
    if (node.output(i).empty()) continue;
    if (unsigned(i) >= op->getNumResults())
      return fail("output " + std::to_string(i) + " ('" + node.output(i) + "') is not supported");
    values[node.output(i)] = op->getResult(unsigned(i));
  }
  return success();
}

namespace {

// Float initializers that set a result's shape: Resize's and Upsample's
// scales. They become constants, as integer shapes do, so shape inference
// reads them (the dynamo exporter writes interpolate's scales as an
// initializer, val_0 = [1, 1, 2, 2]).
void collectShapeFloats(const onnx::GraphProto &g, int64_t opset, std::unordered_set<std::string> &out) {
  for (const onnx::NodeProto &node : g.node()) {
    bool defaultDomain = node.domain().empty() || node.domain() == "ai.onnx";
    if (defaultDomain && node.op_type() == "Resize" && node.input_size() > (opset >= 11 ? 2 : 1))
      out.insert(node.input(opset >= 11 ? 2 : 1));
    if (defaultDomain && node.op_type() == "Upsample" && node.input_size() > 1) out.insert(node.input(1));
    for (const onnx::AttributeProto &a : node.attribute()) {
      if (a.has_g()) collectShapeFloats(a.g(), opset, out);
      for (const onnx::GraphProto &sub : a.graphs()) collectShapeFloats(sub, opset, out);
    }
  }
}

int64_t defaultOpset(const onnx::ModelProto &m) {
  for (const auto &o : m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") return o.version();
  return 1;
}

FailureOr<Type> valueType(Builder &b, const onnx::ValueInfoProto &vi, const ImportOptions &opts, std::string &error,
                          SmallVectorImpl<Attribute> &dimParams) {
  if (!vi.type().has_tensor_type()) {
    error = "input '" + vi.name() + "' is not a tensor";
    return failure();
  }
  const auto &tt = vi.type().tensor_type();
  if (!dtypeIsKnown(tt.elem_type())) {
    error = "input '" + vi.name() + "' has unsupported element type " + std::to_string(tt.elem_type());
    return failure();
  }
  Type et = toMlirType(b.getContext(), DType(tt.elem_type()));
  if (!tt.has_shape()) {
    auto rank = opts.inputRanks.find(vi.name());
    if (rank == opts.inputRanks.end()) {
      error = "input '" + vi.name() + "' has no shape in the model; give --shapes " + vi.name() + "=DxD";
      return failure();
    }
    dimParams.assign(size_t(rank->second), b.getStringAttr(""));
    return Type(RankedTensorType::get(SmallVector<int64_t>(size_t(rank->second), ShapedType::kDynamic), et));
  }
  SmallVector<int64_t> dims;
  auto known = opts.inputShapes.find(vi.name());
  if (known != opts.inputShapes.end() && known->second.size() != size_t(tt.shape().dim_size()))
    known = opts.inputShapes.end(); // sd-specialize names the rank mismatch
  for (const auto &d : tt.shape().dim()) {
    if (d.has_dim_value() && d.dim_value() > (int64_t(1) << 40)) {
      error = "input '" + vi.name() + "' has dim " + std::to_string(d.dim_value()) + ", more than 2^40";
      return failure();
    }
    int64_t dim = d.has_dim_value() && d.dim_value() >= 0 ? d.dim_value() : ShapedType::kDynamic;
    if (dim == ShapedType::kDynamic && known != opts.inputShapes.end()) dim = known->second[dims.size()];
    dims.push_back(dim);
    // "?" is how paddle2onnx and others write an unknown dim, not one name
    // every such dim shares (ONNX Runtime sizes them independently too).
    bool named = d.has_dim_param() && d.dim_param() != "?";
    dimParams.push_back(b.getStringAttr(named ? d.dim_param() : ""));
  }
  return Type(RankedTensorType::get(dims, et));
}

void foldNodeResults(NodeImporter &imp, const onnx::NodeProto &node) {
  ScopedDiagnosticHandler quiet(imp.builder.getContext(), [](Diagnostic &) { return success(); });
  for (const std::string &name : node.output()) {
    auto it = imp.values.find(name);
    if (name.empty() || it == imp.values.end()) continue;
    Operation *op = it->second.getDefiningOp();
    if (!op || !isa<ComputeOpInterface>(op)) continue;
    SmallVector<Value> made;
    if (failed(foldWithKernels(op, kImportFoldBytes, &made)) || made.empty()) continue;
    for (const std::string &out : node.output())
      if (auto o = imp.values.find(out); o != imp.values.end() && o->second.getDefiningOp() == op)
        o->second = made[cast<OpResult>(o->second).getResultNumber()];
  }
}

// Shape arithmetic over constants (Shape, Gather, Concat, ...) folds as it is
// imported, so the shape rules of later nodes, and If conditions and Loop trip
// counts, see the values. sd-propagate-shapes would fold the same later.
void foldOutputs(NodeImporter &imp, const onnx::NodeProto &node) {
  for (const std::string &name : node.output())
    if (auto it = imp.values.find(name); it != imp.values.end() && it->second.getDefiningOp())
      if (Value same = expandedToItsOwnShape(it->second.getDefiningOp())) {
        Operation *expand = it->second.getDefiningOp();
        it->second = same;
        if (expand->use_empty()) expand->erase();
      }
  if (llvm::any_of(node.input(), [&](const std::string &in) { return imp.countedNames.count(in) != 0; })) {
    imp.countedNames.insert(node.output().begin(), node.output().end());
    return;
  }
  foldNodeResults(imp, node);
  // A selection on values only known at run time (a bound and a count).
  for (const std::string &name : node.output())
    if (auto it = imp.values.find(name); it != imp.values.end() && it->second.getDefiningOp() &&
                                         countedResultsOf(it->second.getDefiningOp()))
      imp.countedNames.insert(name);
}

} // namespace

LogicalResult importNodes(NodeImporter &imp, const onnx::GraphProto &g) {
  MLIRContext *ctx = imp.builder.getContext();
  OpBuilder &b = imp.builder;
  for (const auto &vi : g.value_info()) {
    if (!vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) continue;
    std::vector<int64_t> &dims = imp.declaredDims[vi.name()];
    dims.clear();
    for (const auto &d : vi.type().tensor_type().shape().dim())
      dims.push_back(d.has_dim_value() && d.dim_value() >= 0 ? d.dim_value() : -1);
  }
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto &node = g.node(i);
    if (node.op_type() == "Identity" && node.output_size() == 1 && imp.untiedOutputs.count(node.output(0))) continue;
    std::string name = node.name();
    if (name.empty() && node.output_size() > 0) {
      // PyTorch names outputs "<node name>_output_<k>"; recover the node name.
      llvm::StringRef out = node.output(0);
      size_t at = out.rfind("_output_");
      if (at != llvm::StringRef::npos && out.starts_with("/")) name = out.substr(0, at).str();
    }
    if (name.empty()) name = node.op_type() + "_" + std::to_string(i);
    imp.loc = NameLoc::get(b.getStringAttr(name), FileLineColLoc::get(ctx, imp.modelPath, unsigned(i + 1), 0));
    if (std::string scope = torchModuleScope(node); !scope.empty())
      imp.loc = FusedLoc::get(ctx, {imp.loc}, b.getStringAttr(scope));
    imp.nodeName = name;
    imp.nodeDesc = imp.scope + ": node '" + name + "' (" + node.op_type() + ", opset " + std::to_string(imp.opset) + ")";
    // Of the preview domain, FlexAttention is imported (its handler checks the domain).
    bool preview = node.domain() == "ai.onnx.preview" && node.op_type() == "FlexAttention";
    if (node.domain() == "com.microsoft") { // onnxruntime's contrib ops (ContribHandler.cpp)
      OpHandler contrib = findContribHandler(node.op_type());
      if (!contrib)
        return imp.fail("contrib operator " + node.op_type() + " (domain com.microsoft) is not supported");
      if (failed(contrib(imp, node, OpSpec{"", 1, "", -1, -1, contrib}))) {
        if (imp.error.empty()) (void)imp.fail("import failed");
        return failure();
      }
      foldOutputs(imp, node);
      continue;
    }
    if (!node.domain().empty() && node.domain() != "ai.onnx" && !preview)
      return imp.fail("operator domain '" + node.domain() + "' is not supported");
    const OpSpec *spec = findOpSpec(node.op_type(), imp.opset);
    if (!spec)
      return imp.fail("unsupported operator " + node.op_type() + (isKnownOpType(node.op_type()) ? " at this opset" : ""));
    // Handlers may read input 0 directly; a node without inputs stops here.
    if (spec->numOperands != 0 && (node.input_size() == 0 || node.input(0).empty()))
      return imp.fail("node has no first input");
    if (failed(spec->handler(imp, node, *spec))) {
      if (imp.error.empty()) (void)imp.fail("import failed");
      return failure();
    }
    if (auto row = imp.paddingRows.find(node.name()); row != imp.paddingRows.end())
      if (auto gather = imp.values[node.output(0)].getDefiningOp<GatherOp>())
        gather->setAttr(kPaddingRowAttr, imp.builder.getI64IntegerAttr(row->second));
    foldOutputs(imp, node);
  }
  return success();
}

FailureOr<SmallVector<Value>> importSubgraph(NodeImporter &imp, const onnx::GraphProto &g, const std::string &what,
                                             ArrayRef<Value> inputs) {
  if (g.input_size() != int(inputs.size()))
    return imp.fail(what + " takes " + std::to_string(g.input_size()) + " inputs, the node gives " +
                    std::to_string(inputs.size())), failure();
  // Names bound inside stay inside: both branches of an If may reuse a name,
  // and each unrolled loop iteration binds the body's names again. Only the
  // names g binds are saved and put back (not the whole map: loops unroll
  // thousands of times in models with thousands of names).
  std::vector<std::pair<std::string, std::optional<Value>>> bound;
  auto scoped = [&](const std::string &name) {
    auto it = imp.values.find(name);
    bound.push_back({name, it == imp.values.end() ? std::nullopt : std::optional<Value>(it->second)});
  };
  for (const auto &in : g.input()) scoped(in.name());
  for (const onnx::TensorProto &t : g.initializer()) scoped(t.name());
  for (const onnx::NodeProto &node : g.node())
    for (const std::string &out : node.output())
      if (!out.empty()) scoped(out);
  std::string outerScope = imp.scope, outerDesc = imp.nodeDesc, outerName = imp.nodeName;
  Location outerLoc = imp.loc;
  auto restore = llvm::make_scope_exit([&] {
    for (auto &[name, outer] : llvm::reverse(bound)) {
      if (outer) imp.values[name] = *outer;
      else imp.values.erase(name);
    }
    imp.scope = outerScope, imp.nodeDesc = outerDesc, imp.nodeName = outerName, imp.loc = outerLoc;
  });
  for (auto [i, in] : llvm::enumerate(g.input())) imp.values[in.name()] = inputs[i];
  for (const onnx::TensorProto &t : g.initializer()) {
    std::string err;
    auto value = tensorToElements(imp.builder, t, /*asResource=*/false, err);
    if (failed(value)) return imp.fail(what + ": " + err), failure();
    imp.values[t.name()] = imp.builder.create<ConstantOp>(imp.loc, value->getType(), *value);
  }
  imp.scope = outerDesc + " " + what;
  if (failed(importNodes(imp, g))) return failure();
  SmallVector<Value> outs;
  for (const auto &out : g.output()) {
    auto v = imp.lookupAny(out.name()); // a Loop body may give back a sequence it carries
    if (failed(v)) return failure();
    outs.push_back(*v);
  }
  return outs;
}

// A frozen weight global named `name` holding `t`'s values, loaded on first
// use (NodeImporter::lazyGlobals): what initializers, untied merged
// parameters and a train-mode BatchNorm's own statistics all become. It
// reads the model's bytes in place, but for a tensor made during the import
// (`copied`), whose bytes it copies.
static FailureOr<GlobalOp> frozenWeight(OpBuilder &b, Location fileLoc, NodeImporter &imp, const std::string &name,
                                        const onnx::TensorProto &t, std::string &error, bool copied = false) {
  auto value = tensorToElements(b, t, /*asResource=*/!copied, error);
  if (failed(value)) return failure();
  auto global = b.create<GlobalOp>(NameLoc::get(b.getStringAttr(name), fileLoc), b.getStringAttr(name),
                                   TypeAttr::get(value->getType()), b.getStringAttr("frozen"), *value);
  imp.lazyGlobals[name] = &t;
  return global;
}

// BatchNormalizations a dynamo export traced in train mode normalize by the
// batch in training plans, as in PyTorch (importBatchNormTraining), and
// update their running statistics. Those must be weights of their own,
// named after PyTorch's buffers: the exporter's optimizer may have merged a
// fresh norm's running mean with its zero bias, which trains.
static LogicalResult trainModeStatistics(OpBuilder &b, Location fileLoc, const onnx::ModelProto &model,
                                  const std::unordered_map<std::string, const onnx::TensorProto *> &inits,
                                  NodeImporter &imp, std::string &error) {
  if (std::string folded = foldedTrainModeBatchNorm(model); !folded.empty()) return error = folded, failure();
  std::map<std::string, std::array<std::string, 2>> norms = trainModeBatchNorms(model);
  for (const onnx::NodeProto &n : model.graph().node()) {
    auto norm = norms.find(n.name());
    if (norm == norms.end() || n.input_size() < 5) continue;
    std::array<std::string, 2> statistics = {n.input(3), n.input(4)};
    for (size_t k = 0; k < 2; ++k) {
      const std::string &buffer = norm->second[k];
      auto source = inits.find(n.input(int(3 + k)));
      if (buffer.empty() || buffer == statistics[k] || source == inits.end() || !imp.lazyGlobals.count(source->first))
        continue;
      if (!imp.lazyGlobals.count(buffer)) {
        if (inits.count(buffer)) continue; // the name is taken by another initializer
        if (failed(frozenWeight(b, fileLoc, imp, buffer, *source->second, error))) return failure();
      }
      statistics[k] = buffer;
    }
    imp.trainModeNorms[n.name()] = statistics;
  }
  return success();
}

// Undoes what the dynamo exporter's optimizer merged (ExportRepairs): the
// graph's nodes, copied into `repaired` with the inputs they read rewired,
// a Transpose or Reshape node first for each refolded copy; the weights they
// read instead are made here (`made` holds restored biases' zeros, which
// NodeImporter::lazyGlobals points at until the nodes are imported).
static LogicalResult applyExportRepairs(OpBuilder &b, Location fileLoc, const onnx::GraphProto &g,
                                        const std::unordered_map<std::string, const onnx::TensorProto *> &inits,
                                        const ExportRepairs &repairs, NodeImporter &imp,
                                        std::deque<onnx::TensorProto> &made, onnx::GraphProto &repaired,
                                        std::string &error) {
  ExportRepairs applied; // what has its weight here
  for (const ExportRepairs::Refold &r : repairs.refolds) {
    auto copy = inits.find(r.copy);
    if (copy == inits.end()) continue;
    if (r.restored && !inits.count(r.parameter) && !imp.lazyGlobals.count(r.parameter)) {
      const onnx::TensorProto &param = made.emplace_back(restoredParameter(r, *copy->second));
      if (failed(frozenWeight(b, fileLoc, imp, r.parameter, param, error, /*copied=*/true))) return failure();
    }
    applied.refolds.push_back(r);
  }
  for (const ExportRepairs::Reread &r : repairs.rereads) {
    std::string name = rereadName(r);
    auto source = inits.find(r.source);
    if (inits.count(name) || source == inits.end() || !imp.lazyGlobals.count(r.source)) continue;
    if (!imp.lazyGlobals.count(name)) {
      FailureOr<GlobalOp> global = frozenWeight(b, fileLoc, imp, name, *source->second, error);
      if (failed(global)) return failure();
      if (r.weight.empty()) (*global)->setAttr(kNotParameterAttr, b.getUnitAttr());
    }
    applied.rereads.push_back(r);
  }
  for (const ExportRepairs::Unmerged &u : repairs.unmerged) {
    bool made = true;
    for (const auto &[slot, param] : u.params) {
      auto source = inits.find(g.node(u.node).input(slot));
      if (source == inits.end() || !imp.lazyGlobals.count(source->first)) made = false;
      else if (!inits.count(param) && !imp.lazyGlobals.count(param) &&
               failed(frozenWeight(b, fileLoc, imp, param, *source->second, error)))
        return failure();
    }
    if (made) applied.unmerged.push_back(u);
  }
  for (const ExportRepairs::RestoredBias &r : repairs.restoredBiases) {
    const onnx::NodeProto &n = g.node(r.node);
    auto weight = inits.find(n.input(1));
    if (inits.count(r.parameter) || imp.lazyGlobals.count(r.parameter) || weight == inits.end()) continue;
    std::optional<onnx::TensorProto> zeros = zeroBias(n, *weight->second, r.parameter);
    if (!zeros) continue;
    const onnx::TensorProto &bias = made.emplace_back(std::move(*zeros));
    if (failed(frozenWeight(b, fileLoc, imp, r.parameter, bias, error, /*copied=*/true))) return failure();
    applied.restoredBiases.push_back(r);
  }
  *repaired.mutable_node() = repairedNodes(g, applied);
  *repaired.mutable_input() = g.input();
  *repaired.mutable_output() = g.output();
  *repaired.mutable_value_info() = g.value_info();
  return success();
}

OwningOpRef<ModuleOp> importOnnxModel(MLIRContext *ctx, const onnx::ModelProto &model, const ImportOptions &opts,
                                      std::string &error) {
  ctx->loadDialect<SDDialect, func::FuncDialect>();
  Location fileLoc = FileLineColLoc::get(ctx, opts.modelPath, 0, 0);
  OwningOpRef<ModuleOp> module = ModuleOp::create(fileLoc);
  OpBuilder b(ctx);
  b.setInsertionPointToEnd(module->getBody());
  const onnx::GraphProto &g = model.graph();
  std::string what = opts.modelPath;

  // Weights become globals; small integer tensors and one-element floats
  // (scalars) become constants, but for the parameters of a training plan.
  std::unordered_map<std::string, const onnx::TensorProto *> inits;
  NodeImporter imp(b, opts.modelPath);
  imp.opset = defaultOpset(model);
  std::vector<std::pair<const onnx::TensorProto *, bool>> initKinds;
  std::unordered_set<std::string> shapeFloats;
  TorchParameters torchParams;
  ExportRepairs repairs;
  if (opts.training) {
    torchParams = torchParameters(model);
    repairs = exportRepairs(model, torchParams);
  }
  std::unordered_set<std::string> refolded; // copies derived from their parameter again
  for (const ExportRepairs::Refold &r : repairs.refolds) refolded.insert(r.copy);
  collectShapeFloats(g, imp.opset, shapeFloats);
  for (const onnx::TensorProto &t : g.initializer()) {
    if (t.name().empty()) return error = what + ": an initializer has no name", nullptr;
    if (inits.count(t.name())) return error = what + ": initializer '" + t.name() + "' is defined twice", nullptr;
    inits[t.name()] = &t;
    int64_t n = 1;
    for (int64_t d : t.dims()) n *= std::max<int64_t>(d, 0);
    bool isFloat = dtypeIsFloat(DType(t.data_type()));
    bool asConstant = isFloat ? (n <= 1 && !torchParams.scalarParameter(t.name())) || shapeFloats.count(t.name())
                              : n <= opts.maxConstantElements;
    initKinds.push_back({&t, asConstant});
  }
  for (auto [t, asConstant] : initKinds) {
    if (asConstant || refolded.count(t->name())) continue;
    FailureOr<GlobalOp> global = frozenWeight(b, fileLoc, imp, t->name(), *t, error);
    if (failed(global)) return error = what + ": " + error, nullptr;
    if (torchParams.notParameter(t->name())) (*global)->setAttr(kNotParameterAttr, b.getUnitAttr());
  }

  // A training import of a dynamo export reads the graph with what its
  // optimizer merged taken apart (applyExportRepairs).
  std::deque<onnx::TensorProto> madeTensors;
  onnx::GraphProto repaired;
  const onnx::GraphProto *graph = &g;
  if (opts.training) {
    // PyTorch's eval-mode exporter keeps one initializer per distinct value: a
    // parameter equal to an earlier one (fresh LayerNorm weights, zero biases)
    // is that initializer read through an Identity named after the parameter.
    // A training plan gives each such parameter a weight of its own, so each
    // trains on its own as in PyTorch. Ties keep their one initializer (the
    // exporter reads it directly in every node), and inference plans keep the
    // merge.
    std::set<std::string> graphOutputs;
    for (const auto &out : g.output()) graphOutputs.insert(out.name());
    std::unordered_set<const onnx::TensorProto *> asWeights;
    for (auto [t, asConstant] : initKinds)
      if (!asConstant) asWeights.insert(t);
    for (const onnx::NodeProto &node : g.node()) {
      if (node.op_type() != "Identity" || !node.domain().empty() || node.input_size() != 1 || node.output_size() != 1)
        continue;
      const std::string &out = node.output(0);
      auto source = inits.find(node.input(0));
      if (out.empty() || source == inits.end() || !asWeights.count(source->second) || inits.count(out) ||
          graphOutputs.count(out) || imp.untiedOutputs.count(out))
        continue;
      if (failed(frozenWeight(b, fileLoc, imp, out, *source->second, error))) return error = what + ": " + error, nullptr;
      imp.untiedOutputs.insert(out);
    }
    if (!repairs.rereads.empty() || !repairs.restoredBiases.empty() || !repairs.refolds.empty() ||
        !repairs.unmerged.empty()) {
      if (failed(applyExportRepairs(b, fileLoc, g, inits, repairs, imp, madeTensors, repaired, error)))
        return error = what + ": " + error, nullptr;
      graph = &repaired;
    }
    std::unordered_set<std::string> weightNames;
    for (const onnx::TensorProto *t : asWeights) weightNames.insert(t->name());
    imp.mergedStatistics = mergedStatistics(*graph, weightNames);
    if (failed(trainModeStatistics(b, fileLoc, model, inits, imp, error))) return error = what + ": " + error, nullptr;
    imp.paddingRows = embeddingPaddingRows(model);
    if (DictionaryAttr shared = sharedWeights(b, *graph, weightNames); !shared.empty())
      (*module)->setAttr("sd.shared_weights", shared);
    if (!repairs.foldedTogether.empty()) {
      SmallVector<NamedAttribute> folded;
      for (const auto &[copy, why] : repairs.foldedTogether)
        folded.push_back(b.getNamedAttr(copy, b.getStringAttr(why)));
      (*module)->setAttr("sd.folded_weights", b.getDictionaryAttr(folded));
    }
    if (!repairs.tiedNames.empty()) {
      SmallVector<NamedAttribute> tied;
      for (const auto &tie : repairs.tiedNames) {
        const std::string &param = tie.first;
        if (!weightNames.count(param) && llvm::none_of(repairs.refolds, [&](auto &r) { return r.parameter == param; }))
          continue;
        SmallVector<Attribute> list;
        for (const std::string &n : tie.second) list.push_back(b.getStringAttr(n));
        tied.push_back(b.getNamedAttr(param, b.getArrayAttr(list)));
      }
      if (!tied.empty()) (*module)->setAttr("sd.tied_names", b.getDictionaryAttr(tied));
    }
    auto nameList = [&](const std::vector<std::string> &list) {
      SmallVector<Attribute> names;
      for (const std::string &d : list) names.push_back(b.getStringAttr(d));
      return b.getArrayAttr(names);
    };
    if (!repairs.dropped.empty()) (*module)->setAttr("sd.dropped_parameters", nameList(repairs.dropped));
    if (std::vector<std::string> folded = foldedEvalBatchNorms(model); !folded.empty())
      (*module)->setAttr("sd.folded_norms", nameList(folded));
    if (!repairs.unread.empty()) (*module)->setAttr("sd.unread_parameters", nameList(repairs.unread));
  }

  // The entry: graph inputs that are not initializers.
  SmallVector<Type> argTypes;
  SmallVector<const onnx::ValueInfoProto *> args;
  SmallVector<SmallVector<Attribute>> argDimParams;
  std::set<std::string> bound;
  for (const auto &in : g.input()) {
    if (inits.count(in.name())) continue;
    if (auto it = opts.bindings.find(in.name()); it != opts.bindings.end()) {
      if (it->second->data_type() != in.type().tensor_type().elem_type())
        return error = what + ": --bind " + in.name() + " has element type " + std::to_string(it->second->data_type()) +
                       ", the input has " + std::to_string(in.type().tensor_type().elem_type()), nullptr;
      bound.insert(in.name());
      continue;
    }
    SmallVector<Attribute> params;
    auto t = valueType(b, in, opts, error, params);
    if (failed(t)) return error = what + ": " + error, nullptr;
    argTypes.push_back(*t);
    args.push_back(&in);
    argDimParams.push_back(params);
  }
  auto fn = b.create<func::FuncOp>(fileLoc, sd::abi::kInfer, b.getFunctionType(argTypes, {}));
  fn->setAttr("sd.entry", b.getStringAttr(sd::abi::kInfer));
  Block *entry = fn.addEntryBlock();
  for (auto [i, in] : llvm::enumerate(args)) {
    fn.setArgAttr(unsigned(i), "sd.name", b.getStringAttr(in->name()));
    if (!argDimParams[i].empty()) fn.setArgAttr(unsigned(i), "sd.dim_params", b.getArrayAttr(argDimParams[i]));
    imp.values[in->name()] = entry->getArgument(unsigned(i));
  }
  b.setInsertionPointToStart(entry);
  for (auto &[name, tensor] : opts.bindings) {
    if (!bound.count(name)) return error = what + ": --bind names '" + name + "', which is not a graph input", nullptr;
    auto value = tensorToElements(b, *tensor, /*asResource=*/false, error);
    if (failed(value)) return error = what + ": --bind " + name + ": " + error, nullptr;
    imp.values[name] = b.create<ConstantOp>(NameLoc::get(b.getStringAttr(name), fileLoc), value->getType(), *value);
  }
  for (auto [t, asConstant] : initKinds) {
    if (!asConstant || imp.values.count(t->name())) continue;
    auto value = tensorToElements(b, *t, /*asResource=*/false, error);
    if (failed(value)) return error = what + ": " + error, nullptr;
    imp.values[t->name()] = b.create<ConstantOp>(NameLoc::get(b.getStringAttr(t->name()), fileLoc),
                                                 value->getType(), *value);
  }

  imp.scope = what;
  imp.options = &opts;
  if (failed(importNodes(imp, *graph))) return error = imp.error.empty() ? what + ": import failed" : imp.error, nullptr;
  if (!imp.controlFlowNotes.empty()) {
    SmallVector<Attribute> notes;
    for (const std::string &n : imp.controlFlowNotes) notes.push_back(b.getStringAttr(n));
    (*module)->setAttr("sd.control_flow", b.getArrayAttr(notes));
  }

  SmallVector<Value> results;
  SmallVector<Attribute> outNames;
  imp.loc = fileLoc;
  imp.nodeDesc = what;
  for (const auto &out : g.output()) {
    auto v = imp.lookupAny(out.name());
    if (succeeded(v) && imp.isSequence(*v))
      return error = what + ": graph output '" + out.name() + "' is a sequence, which is not supported as a plan " +
                     "output (a plan's outputs are tensors)",
             nullptr;
    if (failed(v)) return error = what + ": graph output '" + out.name() + "' is never produced", nullptr;
    results.push_back(*v);
    outNames.push_back(b.getStringAttr(out.name()));
  }
  b.create<func::ReturnOp>(fileLoc, results);
  // Sequence tokens (SequenceHandler.h) only ever stood for lists.
  for (auto &[token, tensors] : imp.sequences)
    if (token.use_empty()) token.getDefiningOp()->erase();
  fn.setType(b.getFunctionType(argTypes, ValueRange(results).getTypes()));
  fn->setAttr("sd.output_names", b.getArrayAttr(outNames));
  std::string diag;
  ScopedDiagnosticHandler handler(ctx, [&](Diagnostic &d) {
    if (diag.empty()) diag = d.str();
    return success();
  });
  if (failed(verify(*module))) return error = what + ": imported module is invalid: " + diag, nullptr;
  return module;
}

} // namespace sd
