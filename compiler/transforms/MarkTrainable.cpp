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
      if (!re->match(g.getSymName())) continue;
      g.setRole("trainable");
      ++matched;
    }
    if (!matched) {
      module.emitError() << "--trainable '" << pattern << "' matches no floating-point weight";
      return signalPassFailure();
    }
  }
};

} // namespace
