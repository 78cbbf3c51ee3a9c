// sd-mark-trainable: full fine-tuning selects the float weights to train.
#include "PassDetail.h"
#include "Passes.h"
#include "llvm/ADT/StringMap.h"

namespace sd {
#define GEN_PASS_DEF_MARKTRAINABLE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

bool isFloatTensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && isa<FloatType>(t.getElementType());
}

// Whether a weight's values (its `loads`) can carry a gradient: some float
// value computed from them reaches a function's results (or an op with
// regions or a store, which this walk does not follow). A weight that only ever becomes bools (a causal
// mask registered as a buffer: Slice, then Equal 0) cannot, so it stays
// frozen, and sd-fold-frozen-masks may fold the mask into a constant.
bool carriesGradient(ArrayRef<Value> loads) {
  SmallVector<Value> work(loads.begin(), loads.end());
  DenseSet<Value> seen;
  while (!work.empty()) {
    Value v = work.pop_back_val();
    if (!seen.insert(v).second) continue;
    for (Operation *user : v.getUsers()) {
      if (user->hasTrait<OpTrait::IsTerminator>() || user->getNumRegions() || isa<GlobalStoreOp>(user)) return true;
      for (Value r : user->getResults())
        if (isFloatTensor(r)) work.push_back(r);
    }
  }
  return false;
}

struct MarkTrainablePass : sd::impl::MarkTrainableBase<MarkTrainablePass> {
  using MarkTrainableBase::MarkTrainableBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    std::unique_ptr<llvm::Regex> re, frozen;
    std::string err;
    if (!sd::fullMatchRegex(pattern, re, err)) {
      module.emitError() << "--trainable " << err;
      return signalPassFailure();
    }
    if (!freeze.empty() && !sd::fullMatchRegex(freeze, frozen, err)) {
      module.emitError() << "--freeze " << err;
      return signalPassFailure();
    }
    int kept = 0; // weights --freeze kept frozen
    llvm::StringMap<SmallVector<Value>> loads;
    module.walk([&](GlobalLoadOp load) { loads[load.getGlobal()].push_back(load.getResult()); });
    int matched = 0;
    for (GlobalOp g : module.getOps<GlobalOp>()) {
      auto type = cast<RankedTensorType>(g.getType());
      if (g.getRole() != "frozen" || !isa<FloatType>(type.getElementType()) || g->hasAttr(kNotParameterAttr)) continue;
      if (!re->match(g.getSymName()) || !carriesGradient(loads.lookup(g.getSymName()))) continue;
      if (frozen && frozen->match(g.getSymName())) {
        ++kept;
        continue;
      }
      g.setRole("trainable");
      ++matched;
    }
    if (frozen && !kept) {
      module.emitError() << "--freeze '" << freeze << "' matches no floating-point weight that would train";
      return signalPassFailure();
    }
    if (!matched) {
      module.emitError() << "--trainable '" << pattern << "' matches no floating-point weight that a gradient can reach";
      return signalPassFailure();
    }
  }
};

} // namespace
