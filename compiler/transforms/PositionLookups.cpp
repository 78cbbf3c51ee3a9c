// Position-input rewrites shared by sd-pack-sequences and sd-kv-cache.
#include "PositionLookups.h"
#include "GlobalData.h"
#include "KernelFold.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace sd::ir;

bool sd::isArange(Value indices, int64_t seq) {
  auto c = indices.getDefiningOp<ConstantOp>();
  if (!c) return false;
  auto t = cast<RankedTensorType>(c.getType());
  // (A scalar index, such as one layer's slice of a table, is no position.)
  if (!t.getElementType().isInteger(64) || t.getRank() == 0 || t.getNumElements() != seq ||
      t.getDimSize(t.getRank() - 1) != seq)
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
  return foldFromFrozenWeights(v, /*maxWeightBytes=*/int64_t(1) << 16, kImportFoldBytes);
}
