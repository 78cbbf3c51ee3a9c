// sd-mark-trainable: full fine-tuning selects the float weights to train.
#include "PassDetail.h"
#include "Passes.h"

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

// Whether `g`'s values can carry a gradient: some float value computed from
// it reaches a function's results (or an op with regions or a store, which
// this walk does not follow). A weight that only ever becomes bools (a causal
// mask registered as a buffer: Slice, then Equal 0) cannot, so it stays
// frozen, and sd-fold-frozen-masks may fold the mask into a constant.
bool carriesGradient(ModuleOp module, GlobalOp g) {
  SmallVector<Value> work;
  DenseSet<Value> seen;
  module.walk([&](GlobalLoadOp load) {
    if (load.getGlobal() == g.getSymName()) work.push_back(load.getResult());
  });
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
    std::unique_ptr<llvm::Regex> re;
    std::string err;
    if (!sd::fullMatchRegex(pattern, re, err)) {
      module.emitError() << "--trainable " << err;
      return signalPassFailure();
    }
    int matched = 0;
    for (GlobalOp g : module.getOps<GlobalOp>()) {
      auto type = cast<RankedTensorType>(g.getType());
      if (g.getRole() != "frozen" || !isa<FloatType>(type.getElementType())) continue;
      if (!re->match(g.getSymName()) || !carriesGradient(module, g)) continue;
      g.setRole("trainable");
      ++matched;
    }
    if (!matched) {
      module.emitError() << "--trainable '" << pattern << "' matches no floating-point weight that a gradient can reach";
      return signalPassFailure();
    }
  }
};

} // namespace
