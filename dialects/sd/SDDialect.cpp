// sd dialect registration and the verifiers and folders of its non-compute ops.
#include "SDDialect.h"
#include "OpLibraryBridge.h"
#include "vjp/GradBuilder.h"
#include "sd/format/plan_format.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace sd::ir;

#include "SDDialect.cpp.inc"
#include "SDInterfaces.cpp.inc"
#define GET_TYPEDEF_CLASSES
#include "SDTypes.cpp.inc"

void SDDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "SDTypes.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "SDOps.cpp.inc"
      >();
  attachConvVJPs(getContext());
  attachElementwiseVJPs(getContext());
  attachActivationVJPs(getContext());
  attachReductionVJPs(getContext());
  attachLossVJPs(getContext());
  attachLinalgVJPs(getContext());
  attachMovementVJPs(getContext());
  attachNormalizationVJPs(getContext());
  attachOsftVJPs(getContext());
  attachRecurrentVJPs(getContext());
  attachRotaryVJPs(getContext());
  attachIndexingVJPs(getContext());
  attachTrigonometricVJPs(getContext());
  attachSamplingVJPs(getContext());
  attachClassicNormVJPs(getContext());
}

Operation *SDDialect::materializeConstant(OpBuilder &builder, Attribute value, Type type, Location loc) {
  if (auto e = dyn_cast<ElementsAttr>(value)) return builder.create<ConstantOp>(loc, type, e);
  return nullptr;
}

LogicalResult GlobalOp::verify() {
  if (!sd::parseGlobalRole(getRole())) return emitOpError("unknown role '") << getRole() << "'";
  auto type = dyn_cast<RankedTensorType>(getType());
  if (!type || !type.hasStaticShape()) return emitOpError("type must be a statically shaped tensor");
  if (!toDType(type.getElementType())) return emitOpError("element type ") << type.getElementType() << " is not supported";
  if (auto init = getInitialValueAttr())
    if (init.getType() != type) return emitOpError("initial value type ") << init.getType() << " differs from " << type;
  return success();
}

static LogicalResult verifyGlobalUse(Operation *op, StringRef name, Type valueType, SymbolTableCollection &tables) {
  auto global = tables.lookupNearestSymbolFrom<GlobalOp>(op, StringAttr::get(op->getContext(), name));
  if (!global) return op->emitOpError("refers to unknown global @") << name;
  if (global.getType() != valueType)
    return op->emitOpError("type ") << valueType << " differs from global @" << name << " type " << global.getType();
  return success();
}

LogicalResult GlobalLoadOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyGlobalUse(*this, getGlobal(), getResult().getType(), tables);
}

LogicalResult GlobalStoreOp::verifySymbolUses(SymbolTableCollection &tables) {
  auto global = tables.lookupNearestSymbolFrom<GlobalOp>(*this, getGlobalAttr());
  if (global && (global.getRole() == "frozen" || global.getRole() == "constant"))
    return emitOpError("cannot write ") << global.getRole() << " global @" << getGlobal();
  return verifyGlobalUse(*this, getGlobal(), getValue().getType(), tables);
}

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

ParseResult ConstantOp::parse(OpAsmParser &parser, OperationState &result) {
  Attribute value;
  if (parser.parseOptionalAttrDict(result.attributes) || parser.parseAttribute(value, "value", result.attributes))
    return failure();
  auto elements = dyn_cast<ElementsAttr>(value);
  if (!elements) return parser.emitError(parser.getNameLoc(), "expected an elements attribute");
  result.addTypes(elements.getType());
  return success();
}

void ConstantOp::print(OpAsmPrinter &p) {
  p.printOptionalAttrDict((*this)->getAttrs(), {"value"});
  p << ' ';
  p.printAttribute(getValue());
}

LogicalResult ViewOp::verify() {
  auto src = cast<MemRefType>(getSource().getType()), dst = cast<MemRefType>(getResult().getType());
  if (src.getElementType() != dst.getElementType()) return emitOpError("changes the element type");
  if (src.getNumElements() != dst.getNumElements())
    return emitOpError("changes the element count from ") << src.getNumElements() << " to " << dst.getNumElements();
  return success();
}

#define GET_OP_CLASSES
#include "SDOps.cpp.inc"
