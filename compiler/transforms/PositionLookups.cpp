// Position-input rewrites shared by sd-pack-sequences and sd-kv-cache.
#include "PositionLookups.h"
#include "GlobalData.h"
#include "KernelFold.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/SetVector.h"

using namespace mlir;
using namespace sd::ir;

bool sd::isArange(Value indices, int64_t seq) {
  auto c = indices.getDefiningOp<ConstantOp>();
  if (!c) return false;
  auto t = cast<RankedTensorType>(c.getType());
  if (!t.getElementType().isInteger(64) || t.getNumElements() != seq || t.getDimSize(t.getRank() - 1) != seq)
    return false;
  auto values = dyn_cast<DenseIntElementsAttr>(c.getValue());
  if (!values) return false;
  int64_t expect = 0;
  for (const APInt &v : values.getValues<APInt>())
    if (v.getSExtValue() != expect++) return false;
  return true;
}

LogicalResult sd::replacePositionLookups(func::FuncOp f, Value positions, int64_t seq, StringRef flag, int &found) {
  SmallVector<GatherOp> lookups;
  f.walk([&](GatherOp g) {
    if (isArange(g.getRhs(), seq) && g.getAxis().value_or(0) == 0) lookups.push_back(g);
  });
  found += int(lookups.size());
  for (GatherOp g : lookups) {
    auto table = cast<RankedTensorType>(g.getLhs().getType());
    SmallVector<int64_t> shape = {cast<RankedTensorType>(positions.getType()).getDimSize(0), seq};
    shape.append(table.getShape().begin() + 1, table.getShape().end());
    auto type = RankedTensorType::get(shape, table.getElementType());
    for (Operation *user : g->getUsers())
      if (!isa<AddOp>(user) || cast<RankedTensorType>(user->getResult(0).getType()).getShape() != type.getShape())
        return user->emitError() << flag << ": the position embedding feeds " << sd::describeNode(user)
                                 << ", which does not add it to a " << type << " activation";
    OpBuilder b(g);
    auto perToken = b.create<GatherOp>(g.getLoc(), type, g.getLhs(), positions, g.getAxisAttr());
    g.getResult().replaceAllUsesWith(perToken.getResult());
    Operation *indices = g.getRhs().getDefiningOp();
    g.erase();
    if (indices->use_empty()) indices->erase();
  }
  return success();
}

mlir::DenseElementsAttr sd::foldPositionFree(Value v) {
  constexpr int64_t kMaxWeightBytes = int64_t(1) << 16;
  if (auto dense = dyn_cast_or_null<DenseElementsAttr>(constantValue(v))) return dense;
  // The ops v depends on; any block argument (an input) or mutable state ends the attempt.
  llvm::SetVector<Operation *> slice;
  SmallVector<Value> work = {v};
  while (!work.empty()) {
    Value x = work.pop_back_val();
    Operation *def = x.getDefiningOp();
    if (!def || def->getNumRegions()) return {};
    if (!slice.insert(def)) continue;
    if (auto load = dyn_cast<GlobalLoadOp>(def)) {
      auto g = SymbolTable::lookupNearestSymbolFrom<GlobalOp>(def, load.getGlobalAttr());
      auto type = g ? dyn_cast<RankedTensorType>(g.getType()) : RankedTensorType();
      if (!g || !sd::hasFrozenValue(g) || !type ||
          type.getNumElements() * int64_t(type.getElementTypeBitWidth() / 8) > kMaxWeightBytes)
        return {};
      continue;
    }
    for (Value operand : def->getOperands()) work.push_back(operand);
  }
  SmallVector<Operation *> ordered(slice.begin(), slice.end());
  llvm::sort(ordered, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  auto module = v.getParentRegion()->getParentOfType<ModuleOp>();
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  auto fn = b.create<func::FuncOp>(v.getLoc(), "__fold_position_free", b.getFunctionType({}, {v.getType()}));
  b.setInsertionPointToStart(fn.addEntryBlock());
  IRMapping map;
  for (Operation *op : ordered) {
    if (auto load = dyn_cast<GlobalLoadOp>(op)) {
      auto g = SymbolTable::lookupNearestSymbolFrom<GlobalOp>(op, load.getGlobalAttr());
      map.map(load.getResult(), b.create<ConstantOp>(op->getLoc(), load.getType(), g.getInitialValueAttr()));
      continue;
    }
    b.clone(*op, map);
  }
  b.create<func::ReturnOp>(v.getLoc(), map.lookup(v));
  DenseElementsAttr out;
  if (succeeded(sd::propagateShapes(fn, kImportFoldBytes))) {
    Value folded = fn.getBody().front().getTerminator()->getOperand(0);
    out = dyn_cast_or_null<DenseElementsAttr>(constantValue(folded));
  }
  fn.erase();
  return out;
}
