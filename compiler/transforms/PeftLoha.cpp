// sd-peft-loha: LoHa (low-rank Hadamard product) adapters on the sd.linear
// modules PEFT would match: y = linear(x, W, b) + x ΔWᵀ with
// ΔW = (w1_a w1_b) ⊙ (w2_a w2_b) · alpha / r, rebuilt from the factors
// each step (PEFT's LoHa computes the same ΔW in its forward).
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include <cmath>
#include <random>

namespace sd {
#define GEN_PASS_DEF_PEFTLOHA
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct PeftLohaPass : sd::impl::PeftLohaBase<PeftLohaPass> {
  using PeftLohaBase::PeftLohaBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (rank < 1) {
      module.emitError() << "--lora-r (LoHa's r) must be at least 1, got " << rank;
      return signalPassFailure();
    }
    SmallVector<LinearOp> linears;
    if (failed(sd::adapterTargets(module, targetModules, linears))) return signalPassFailure();
    std::mt19937_64 rng{static_cast<uint64_t>(seed)};
    Builder b(module.getContext());
    SmallVector<Attribute> names;
    for (LinearOp l : linears) {
      if (failed(adapt(module, l, rng))) return signalPassFailure();
      names.push_back(b.getStringAttr(l.getModule()));
    }
    module->setAttr("sd.peft", b.getDictionaryAttr({
                                   b.getNamedAttr("peft_type", b.getStringAttr("LOHA")),
                                   b.getNamedAttr("r", b.getI64IntegerAttr(rank)),
                                   b.getNamedAttr("alpha", b.getF64FloatAttr(alpha)),
                                   b.getNamedAttr("target_modules", b.getStringAttr(targetModules)),
                                   b.getNamedAttr("modules", b.getArrayAttr(names)),
                               }));
  }


  LogicalResult adapt(ModuleOp module, LinearOp l, std::mt19937_64 &rng) {
    auto wt = cast<RankedTensorType>(l.getWeight().getType());
    if (!wt.getElementType().isF32()) return l.emitError("LoHa on non-f32 weights is not supported yet");
    auto [in, out] = sd::linearInOut(l);
    std::string m = l.getModule().str();
    std::vector<float> w1a = sd::kaimingUniform(out, rank, rng), w1b = sd::kaimingUniform(rank, in, rng),
                       w2a = sd::kaimingUniform(out, rank, rng);
    GlobalOp g1a = sd::createFloatGlobal(module, m + ".hada_w1_a", {out, rank}, "trainable", &w1a);
    GlobalOp g1b = sd::createFloatGlobal(module, m + ".hada_w1_b", {rank, in}, "trainable", &w1b);
    GlobalOp g2a = sd::createFloatGlobal(module, m + ".hada_w2_a", {out, rank}, "trainable", &w2a);
    GlobalOp g2b = sd::createFloatGlobal(module, m + ".hada_w2_b", {rank, in}, "trainable", nullptr);
    SmallVector<OpOperand *> readers = sd::usesOf(l.getOutput());
    OpBuilder b(l);
    b.setInsertionPointAfter(l);
    GradBuilder g(b, l.getLoc());
    auto load = [&](GlobalOp gl) { return b.create<GlobalLoadOp>(l.getLoc(), gl.getType(), gl.getSymName()).getResult(); };
    // w_a [out, r] times w_b [r, in]: "io" reads w_b as [K, N].
    Value p1 = sd::adapterLinear(g, load(g1a), load(g1b), "io", m + ".hada_w1");
    Value p2 = sd::adapterLinear(g, load(g2a), load(g2b), "io", m + ".hada_w2");
    Value delta = g.scale(g.mul(p1, p2), alpha / double(rank));
    Value sum = g.add(l.getOutput(), sd::adapterLinear(g, l.getInput(), delta, "oi", m + ".hada"));
    if (g.failed()) return failure();
    for (OpOperand *u : readers) u->set(sum);
    return success();
  }
};

} // namespace
