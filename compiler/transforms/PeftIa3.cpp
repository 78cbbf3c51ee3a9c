// sd-peft-ia3: (IA)³ on the sd.linear modules PEFT would match: a trained
// vector scales each adapted layer's result, or a feedforward layer's input.
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "llvm/Support/Regex.h"
#include <functional>
#include <memory>

namespace sd {
#define GEN_PASS_DEF_PEFTIA3
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct PeftIa3Pass : sd::impl::PeftIa3Base<PeftIa3Pass> {
  using PeftIa3Base::PeftIa3Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<LinearOp> linears;
    if (failed(sd::adapterTargets(module, targetModules, linears))) return signalPassFailure();
    std::function<bool(StringRef)> feedforward;
    if (failed(feedforwardRule(module, feedforward))) return signalPassFailure();
    Builder b(module.getContext());
    SmallVector<Attribute> names, feedforwardNames;
    bool allInOut = true; // PEFT's fan_in_fan_out: every adapted PyTorch weight is [in, out]
    for (LinearOp l : linears) {
      allInOut &= sd::storedInOut(l);
      bool inputSide = feedforward(l.getModule());
      if (failed(adapt(module, l, inputSide))) return signalPassFailure();
      names.push_back(b.getStringAttr(l.getModule()));
      if (inputSide) feedforwardNames.push_back(b.getStringAttr(l.getModule()));
    }
    if (!feedforwardModules.empty() && feedforwardNames.empty()) {
      module.emitError() << "--feedforward-modules '" << feedforwardModules << "' matches none of the adapted modules";
      return signalPassFailure();
    }
    module->setAttr("sd.peft", b.getDictionaryAttr({
                                   b.getNamedAttr("peft_type", b.getStringAttr("IA3")),
                                   b.getNamedAttr("fan_in_fan_out", b.getBoolAttr(allInOut && !linears.empty())),
                                   b.getNamedAttr("target_modules", b.getStringAttr(targetModules)),
                                   b.getNamedAttr("feedforward_modules", b.getStringAttr(feedforwardModules)),
                                   b.getNamedAttr("modules", b.getArrayAttr(names)),
                                   b.getNamedAttr("feedforward", b.getArrayAttr(feedforwardNames)),
                               }));
  }

  // PEFT's IA3 test of a feedforward module: a regex it matches whole, or a
  // list entry its name ends with (a plain suffix, not at a dot: PEFT's rule).
  LogicalResult feedforwardRule(ModuleOp module, std::function<bool(StringRef)> &out) {
    StringRef text(feedforwardModules);
    if (text.find_first_of("*+?[](){}|^$\\") != StringRef::npos) {
      std::unique_ptr<llvm::Regex> made;
      std::string err;
      if (!sd::fullMatchRegex(feedforwardModules, made, err))
        return module.emitError() << "--feedforward-modules " << err;
      std::shared_ptr<llvm::Regex> re(std::move(made)); // std::function copies what it holds
      out = [re](StringRef m) { return re->match(m); };
      return success();
    }
    SmallVector<StringRef> parts;
    text.split(parts, ',', -1, false);
    std::vector<std::string> endings;
    for (StringRef p : parts)
      if (!p.trim().empty()) endings.push_back(p.trim().str());
    out = [endings](StringRef m) { return llvm::any_of(endings, [&](const std::string &e) { return m.ends_with(e); }); };
    return success();
  }

  // y = linear(x, W, b) * l, or y = linear(x * l, W, b) on the input side;
  // l starts as ones, so the layer starts as it was.
  LogicalResult adapt(ModuleOp module, LinearOp l, bool inputSide) {
    if (!cast<RankedTensorType>(l.getWeight().getType()).getElementType().isF32())
      return l.emitError("IA3 on non-f32 weights is not supported yet");
    auto [in, out] = sd::linearInOut(l);
    int64_t n = inputSide ? in : out;
    std::vector<float> ones(size_t(n), 1.0f);
    SmallVector<int64_t> shape = inputSide ? SmallVector<int64_t>{1, n} : SmallVector<int64_t>{n, 1};
    GlobalOp g = sd::createFloatGlobal(module, l.getModule().str() + ".ia3_l", shape, "trainable", &ones);
    OpBuilder b(l); // the input side's product goes before the layer, the output side's after it
    if (!inputSide) b.setInsertionPointAfter(l);
    GradBuilder gb(b, l.getLoc());
    Value v = gb.reshape(b.create<GlobalLoadOp>(l.getLoc(), g.getType(), g.getSymName()), {n});
    if (inputSide) {
      Value scaled = gb.mul(l.getInput(), v);
      if (gb.failed()) return failure();
      l.getInputMutable().assign(scaled);
      return success();
    }
    SmallVector<OpOperand *> readers = sd::usesOf(l.getOutput());
    Value scaled = gb.mul(l.getOutput(), v);
    if (gb.failed()) return failure();
    for (OpOperand *u : readers) u->set(scaled);
    return success();
  }
};

} // namespace
