// sd-peft-bitfit: BitFit (Ben Zaken et al., 2022) trains only the model's
// bias terms, found by where the ops read them rather than by name.
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include <set>

namespace sd {
#define GEN_PASS_DEF_PEFTBITFIT
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct PeftBitfitPass : sd::impl::PeftBitfitBase<PeftBitfitPass> {
  using PeftBitfitBase::PeftBitfitBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // The bias operand of each op that has one: the layers' (Linear, Gemm's
    // C, convolutions) and the normalizations' shift.
    std::set<std::string> biases;
    auto note = [&](Value v) {
      if (!v) return;
      GlobalOp g = sd::frozenGlobalOf(v);
      auto t = g ? dyn_cast<RankedTensorType>(g.getType()) : RankedTensorType();
      if (t && isa<FloatType>(t.getElementType()) && t.getRank() == 1) biases.insert(g.getSymName().str());
    };
    module.walk([&](Operation *op) {
      if (auto l = dyn_cast<LinearOp>(op)) note(l.getBias());
      else if (auto g = dyn_cast<GemmOp>(op)) note(g.getC());
      else if (auto c = dyn_cast<ConvOp>(op)) note(c.getB());
      else if (auto c = dyn_cast<ConvTransposeOp>(op)) note(c.getB());
      else if (auto n = dyn_cast<LayerNormalizationOp>(op)) note(n.getBias());
      else if (auto n = dyn_cast<InstanceNormalizationOp>(op)) note(n.getBias());
      else if (auto n = dyn_cast<BatchNormalizationOp>(op)) note(n.getBias());
    });
    if (biases.empty()) {
      module.emitError() << "--peft bitfit: the model has no bias terms to train (no layer or normalization of it "
                            "adds a stored bias)";
      return signalPassFailure();
    }
    for (GlobalOp g : module.getOps<GlobalOp>()) {
      if (g.getRole() != "frozen" && g.getRole() != "trainable") continue;
      g.setRole(biases.count(g.getSymName().str()) ? "trainable" : "frozen");
    }
  }
};

} // namespace
