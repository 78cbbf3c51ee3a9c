// MLIR <-> op library conversions.
#include "OpLibraryBridge.h"
#include "SDDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "mlir/IR/BuiltinDialect.h"

using namespace mlir;

namespace sd::ir {

std::optional<DType> toDType(Type t) {
  if (t.isF32()) return DType::F32;
  if (t.isF64()) return DType::F64;
  if (t.isF16()) return DType::F16;
  if (t.isBF16()) return DType::BF16;
  if (t.isFloat8E4M3FN()) return DType::F8E4M3FN;
  if (t.isFloat8E4M3FNUZ()) return DType::F8E4M3FNUZ;
  if (t.isFloat8E5M2()) return DType::F8E5M2;
  if (t.isFloat8E5M2FNUZ()) return DType::F8E5M2FNUZ;
  if (isa<Float4E2M1Type>(t)) return DType::F4E2M1;
  if (isa<Float8E8M0Type>(t)) return DType::F8E8M0;
  if (auto it = dyn_cast<IntegerType>(t)) {
    bool u = it.isUnsigned();
    switch (it.getWidth()) {
    case 1: return DType::Bool;
    case 2: return u ? DType::U2 : DType::I2;
    case 4: return u ? DType::U4 : DType::I4;
    case 8: return u ? DType::U8 : DType::I8;
    case 16: return u ? DType::U16 : DType::I16;
    case 32: return u ? DType::U32 : DType::I32;
    case 64: return u ? DType::U64 : DType::I64;
    }
  }
  return std::nullopt;
}

Type toMlirType(MLIRContext *ctx, DType dt) {
  Builder b(ctx);
  switch (dt) {
  case DType::F32: return b.getF32Type();
  case DType::F64: return b.getF64Type();
  case DType::F16: return b.getF16Type();
  case DType::BF16: return b.getBF16Type();
  case DType::Bool: return b.getI1Type();
  case DType::I8: return b.getIntegerType(8);
  case DType::I16: return b.getIntegerType(16);
  case DType::I32: return b.getIntegerType(32);
  case DType::I64: return b.getIntegerType(64);
  case DType::U8: return b.getIntegerType(8, false);
  case DType::U16: return b.getIntegerType(16, false);
  case DType::U32: return b.getIntegerType(32, false);
  case DType::U64: return b.getIntegerType(64, false);
  case DType::F8E4M3FN: return b.getFloat8E4M3FNType();
  case DType::F8E4M3FNUZ: return b.getFloat8E4M3FNUZType();
  case DType::F8E5M2: return b.getFloat8E5M2Type();
  case DType::F8E5M2FNUZ: return b.getFloat8E5M2FNUZType();
  case DType::I4: return b.getIntegerType(4);
  case DType::U4: return b.getIntegerType(4, false);
  case DType::I2: return b.getIntegerType(2);
  case DType::U2: return b.getIntegerType(2, false);
  case DType::F4E2M1: return Float4E2M1Type::get(ctx);
  case DType::F8E8M0: return Float8E8M0Type::get(ctx);
  default: return {};
  }
}

int64_t storageBytes(ShapedType type) {
  std::optional<DType> dt = toDType(type.getElementType());
  return type.getNumElements() * int64_t(dt ? dtypeSize(*dt) : 0);
}

TensorInfo toTensorInfo(Type type) {
  TensorInfo t;
  if (auto st = dyn_cast<ShapedType>(type)) {
    t.dtype = toDType(st.getElementType()).value_or(DType::Undefined);
    if (!st.hasRank()) {
      t.rankKnown = false;
      return t;
    }
    for (int64_t d : st.getShape()) t.dims.push_back(ShapedType::isDynamic(d) ? kUnknownDim : d);
  }
  return t;
}

Type toTensorType(MLIRContext *ctx, const TensorInfo &info) {
  Type et = toMlirType(ctx, info.dtype);
  if (!et) return {};
  if (!info.rankKnown) return UnrankedTensorType::get(et);
  SmallVector<int64_t> dims;
  for (int64_t d : info.dims) dims.push_back(d < 0 ? ShapedType::kDynamic : d);
  return RankedTensorType::get(dims, et);
}

AttrMap toAttrMap(DictionaryAttr dict) {
  AttrMap m;
  for (NamedAttribute na : dict) {
    std::string n = na.getName().str();
    if (StringRef(n).starts_with("sd.")) continue; // compiler annotations, not kernel parameters
    Attribute a = na.getValue();
    if (auto i = dyn_cast<IntegerAttr>(a)) m.setInt(n, i.getValue().getSExtValue());
    else if (auto f = dyn_cast<FloatAttr>(a)) m.setFloat(n, f.getValueAsDouble());
    else if (auto s = dyn_cast<StringAttr>(a)) m.setString(n, s.str());
    else if (auto v = dyn_cast<DenseI64ArrayAttr>(a)) m.setInts(n, std::vector<int64_t>(v.asArrayRef().begin(), v.asArrayRef().end()));
    else if (auto v = dyn_cast<DenseF32ArrayAttr>(a)) m.setFloats(n, std::vector<double>(v.asArrayRef().begin(), v.asArrayRef().end()));
  }
  return m;
}

AttrMap toAttrMap(Operation *op) { return toAttrMap(op->getAttrDictionary()); }

DictionaryAttr toDictionary(MLIRContext *ctx, const AttrMap &attrs) {
  Builder b(ctx);
  SmallVector<NamedAttribute> out;
  for (auto &[name, a] : attrs.entries()) {
    Attribute v;
    switch (a.kind) {
    case Attr::Kind::Int: v = b.getI64IntegerAttr(a.i); break;
    case Attr::Kind::Float: v = b.getF64FloatAttr(a.f); break;
    case Attr::Kind::String: v = b.getStringAttr(a.s); break;
    case Attr::Kind::Ints: v = b.getDenseI64ArrayAttr(a.ints); break;
    case Attr::Kind::Floats: {
      SmallVector<float> fs(a.floats.begin(), a.floats.end());
      v = b.getDenseF32ArrayAttr(fs);
      break;
    }
    }
    out.push_back(b.getNamedAttr(name, v));
  }
  return b.getDictionaryAttr(out);
}

bool elementsToBytes(ElementsAttr attr, std::vector<uint8_t> &out) {
  auto type = cast<ShapedType>(attr.getType());
  auto dt = toDType(type.getElementType());
  if (!dt || !type.hasStaticShape()) return false;
  size_t es = dtypeSize(*dt), n = size_t(type.getNumElements());
  out.assign(n * es, 0);
  if (auto res = dyn_cast<DenseResourceElementsAttr>(attr)) {
    AsmResourceBlob *blob = res.getRawHandle().getBlob();
    if (!blob) return false;
    ArrayRef<char> data = blob->getData();
    if (data.size() != out.size()) return false;
    if (!data.empty()) std::memcpy(out.data(), data.data(), data.size()); // an empty vector's data() may be null
    return true;
  }
  auto dense = dyn_cast<DenseElementsAttr>(attr);
  if (!dense) return false;
  if (*dt == DType::Bool) {
    size_t i = 0;
    for (bool v : dense.getValues<bool>()) out[i++] = v;
    return true;
  }
  ArrayRef<char> raw = dense.getRawData();
  if (dense.isSplat()) {
    for (size_t i = 0; i < n; ++i) std::memcpy(out.data() + i * es, raw.data(), es);
  } else {
    if (raw.size() != out.size()) return false;
    if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());
  }
  return true;
}

DenseElementsAttr bytesToElements(ShapedType type, const std::vector<uint8_t> &bytes) {
  // sd's own element types (float4, E8M0) have no dense attribute form.
  if (!type.getElementType().isIntOrFloat()) return {};
  if (type.getElementType().isInteger(1)) {
    SmallVector<bool> bits(bytes.begin(), bytes.end());
    return DenseElementsAttr::get(type, bits);
  }
  ArrayRef<char> raw(reinterpret_cast<const char *>(bytes.data()), bytes.size());
  bool splat = false;
  if (!DenseElementsAttr::isValidRawBuffer(type, raw, splat)) return {};
  return DenseElementsAttr::getFromRawBuffer(type, raw);
}

ElementsAttr constantValue(Value v) {
  if (auto c = v.getDefiningOp<ConstantOp>()) return c.getValue();
  return {};
}

OpShapeQuery buildShapeQuery(ValueRange operands, AttrMap attrs, unsigned numResults) {
  OpShapeQuery q;
  q.attrs = std::move(attrs);
  q.ctx = std::make_unique<ShapeContext>(ShapeContext{q.attrs, {}, {}, {}, numResults});
  size_t n = operands.size();
  q.storage.resize(n);
  q.views.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Value v = operands[i];
    TensorInfo info = toTensorInfo(v.getType());
    q.ctx->inputs.push_back(info);
    const TensorView *cv = nullptr;
    if (ElementsAttr c = constantValue(v)) {
      if (elementsToBytes(c, q.storage[i])) {
        q.views[i] = TensorView{q.storage[i].data(), info.dtype, info.dims};
        cv = &q.views[i];
      }
    }
    q.ctx->constInputs.push_back(cv);
  }
  return q;
}

OpShapeQuery buildShapeQuery(Operation *op) {
  return buildShapeQuery(op->getOperands(), toAttrMap(op), op->getNumResults());
}

LogicalResult verifyAgainstShapeRule(Operation *op) {
  auto compute = dyn_cast<ComputeOpInterface>(op);
  if (!compute) return success();
  for (Value v : op->getOperands())
    if (isa<ShapedType>(v.getType()) && !toDType(cast<ShapedType>(v.getType()).getElementType()))
      return op->emitOpError("operand element type ") << cast<ShapedType>(v.getType()).getElementType()
                                                     << " is not supported";
  OpShapeQuery q = buildShapeQuery(op);
  Status s = inferShapes(compute.getContractName().str(), *q.ctx);
  if (!s.isOk()) return op->emitOpError(s.message());
  for (unsigned i = 0; i < op->getNumResults(); ++i) {
    TensorInfo want = q.ctx->outputs[i], have = toTensorInfo(op->getResult(i).getType());
    // A rule that cannot know a result (a Loop's scan outputs, typed by its
    // body) leaves it undefined.
    if (want.dtype == DType::Undefined && !want.rankKnown) continue;
    if (want.dtype != have.dtype)
      return op->emitOpError("result ") << i << " has element type " << dtypeName(have.dtype)
                                        << ", expected " << dtypeName(want.dtype);
    if (!want.rankKnown || !have.rankKnown) continue;
    if (want.rank() != have.rank())
      return op->emitOpError("result ") << i << " has rank " << have.rank() << ", expected " << want.rank();
    for (size_t d = 0; d < want.dims.size(); ++d)
      if (want.dims[d] >= 0 && have.dims[d] >= 0 && want.dims[d] != have.dims[d])
        return op->emitOpError("result ") << i << " has shape " << formatDims(have.dims) << ", expected "
                                          << formatDims(want.dims);
  }
  return success();
}

Operation *buildComputeOp(OpBuilder &b, Location loc, StringRef opName, StringRef contract, ValueRange operands,
                          ArrayRef<NamedAttribute> attrs, unsigned numResults) {
  DictionaryAttr dict = b.getDictionaryAttr(attrs);
  OpShapeQuery q = buildShapeQuery(operands, toAttrMap(dict), numResults);
  Status st = inferShapes(contract.str(), *q.ctx);
  if (!st.isOk()) {
    emitError(loc) << contract << ": " << st.message();
    return nullptr;
  }
  OperationState state(loc, opName);
  state.addOperands(operands);
  state.addAttributes(attrs);
  for (unsigned i = 0; i < numResults && i < q.ctx->outputs.size(); ++i)
    state.addTypes(toTensorType(b.getContext(), q.ctx->outputs[i]));
  return b.create(state);
}

} // namespace sd::ir
