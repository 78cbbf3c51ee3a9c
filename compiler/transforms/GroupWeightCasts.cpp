// sd-group-weight-casts: the half copies an entry makes of its small
// weights become one GroupedCast step at the entry's start.
//
// Under autocast every trainable weight a product reads is rounded from its
// f32 master copy to bf16 (or f16) where the forward first needs it. LoRA's
// factors are small (r x d): a LoRA plan of a 12-layer model makes about a
// hundred such Casts per step, each one launch on a GPU moving a few
// kilobytes. Made at the entry's start in one step they cost one launch;
// each result is what its Cast gave, bit for bit.
//
// Taken: a Cast (no saturate or round_mode) of a global load to bf16 or f16,
// f32 in, at most kSmallElements elements, when no store to that global
// comes before it in the entry (the value at the start is the value it
// read). Larger weights keep their Cast where it is: their copies would
// live longer, and their launch is not what costs.
#include "PassDetail.h"
#include "Passes.h"
#include "sd/ops/math/optimizer.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringSet.h"

namespace sd {
#define GEN_PASS_DEF_GROUPWEIGHTCASTS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

constexpr int64_t kSmallElements = int64_t(1) << 16;

// The global a plain f32 -> half Cast of a small loaded global reads, else null.
GlobalLoadOp smallWeightCast(CastOp cast) {
  if (cast->hasAttr("saturate") || cast->hasAttr("round_mode")) return {};
  auto in = dyn_cast<RankedTensorType>(cast->getOperand(0).getType());
  auto out = dyn_cast<RankedTensorType>(cast->getResult(0).getType());
  if (!in || !out || !in.hasStaticShape() || !in.getElementType().isF32() || in.getNumElements() > kSmallElements ||
      !isa<BFloat16Type, Float16Type>(out.getElementType()))
    return {};
  return cast->getOperand(0).getDefiningOp<GlobalLoadOp>();
}

struct GroupWeightCastsPass : sd::impl::GroupWeightCastsBase<GroupWeightCastsPass> {
  void runOnOperation() override {
    for (auto f : getOperation().getOps<func::FuncOp>())
      if (sd::isEntry(f)) groupEntry(f.getBody().front());
  }

  void groupEntry(Block &block) {
    // Per half type, the casts of each global, in the order first met.
    std::map<int64_t, llvm::MapVector<StringAttr, SmallVector<CastOp>>> casts;
    llvm::StringSet<> stored;
    for (Operation &op : block) {
      op.walk([&](GlobalStoreOp s) { stored.insert(s.getGlobal()); }); // stores in a Loop's or If's body too
      auto cast = dyn_cast<CastOp>(op);
      GlobalLoadOp load = cast ? smallWeightCast(cast) : GlobalLoadOp();
      if (load && !stored.contains(load.getGlobal())) casts[cast.getTo()][load.getGlobalAttr().getAttr()].push_back(cast);
    }
    for (auto &[to, byGlobal] : casts) {
      auto list = byGlobal.takeVector();
      for (size_t at = 0; at < list.size(); at += sd::math::kMaxGroupedTensors)
        group(block, to, ArrayRef(list).slice(at, std::min<size_t>(sd::math::kMaxGroupedTensors, list.size() - at)));
    }
  }

  void group(Block &block, int64_t to, ArrayRef<std::pair<StringAttr, SmallVector<CastOp>>> weights) {
    if (weights.size() < 2) return;
    OpBuilder b = OpBuilder::atBlockBegin(&block);
    Location loc = NameLoc::get(b.getStringAttr("weight_casts"));
    SmallVector<Value> loads;
    SmallVector<Type> types;
    for (auto &[global, list] : weights) {
      CastOp first = list.front();
      loads.push_back(b.create<GlobalLoadOp>(loc, first->getOperand(0).getType(), global.getValue()));
      types.push_back(first->getResult(0).getType());
    }
    auto grouped = b.create<GroupedCastOp>(loc, types, loads, b.getNamedAttr("to", b.getI64IntegerAttr(to)));
    for (auto [i, weight] : llvm::enumerate(weights))
      for (CastOp cast : weight.second) {
        Operation *load = cast->getOperand(0).getDefiningOp();
        cast->getResult(0).replaceAllUsesWith(grouped->getResult(i));
        cast->erase();
        if (load->use_empty()) load->erase();
      }
  }
};

} // namespace
