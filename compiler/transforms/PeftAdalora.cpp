// sd-peft-adalora: PEFT's AdaLoRA adapters (SVD form, lora_A, lora_E,
// lora_B) on the sd.linear modules PEFT would match. The orthogonality
// penalty is the recipes' (RecipeLoss) and the rank allocation sd-optimizer's
// (AdaloraAllocation), both read from the `sd.peft` this pass records.
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include <random>

namespace sd {
#define GEN_PASS_DEF_PEFTADALORA
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

constexpr int64_t kMaxTotalStep = 1000000; // an 8 MB schedule table

struct PeftAdaloraPass : sd::impl::PeftAdaloraBase<PeftAdaloraPass> {
  using PeftAdaloraBase::PeftAdaloraBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(checkOptions(module))) return signalPassFailure();
    SmallVector<LinearOp> linears;
    if (failed(sd::adapterTargets(module, targetModules, linears))) return signalPassFailure();
    std::mt19937_64 rng{static_cast<uint64_t>(seed)};
    std::set<std::string> adapted;
    bool allInOut = true; // PEFT's fan_in_fan_out (GPT-2's Conv1D): how merging reads the weights
    for (LinearOp l : linears) {
      allInOut &= sd::storedInOut(l);
      if (failed(adapt(module, l, rng))) return signalPassFailure();
      adapted.insert(l.getModule().str());
    }
    Builder b(module.getContext());
    SmallVector<Attribute> names;
    for (const std::string &m : adapted) names.push_back(b.getStringAttr(m));
    module->setAttr("sd.peft", b.getDictionaryAttr({
                                   b.getNamedAttr("peft_type", b.getStringAttr("ADALORA")),
                                   b.getNamedAttr("init_r", b.getI64IntegerAttr(rank)),
                                   b.getNamedAttr("target_r", b.getI64IntegerAttr(targetRank)),
                                   b.getNamedAttr("lora_alpha", b.getF64FloatAttr(alpha)),
                                   b.getNamedAttr("tinit", b.getI64IntegerAttr(tinit)),
                                   b.getNamedAttr("tfinal", b.getI64IntegerAttr(tfinal)),
                                   b.getNamedAttr("deltaT", b.getI64IntegerAttr(deltaT)),
                                   b.getNamedAttr("beta1", b.getF64FloatAttr(beta1)),
                                   b.getNamedAttr("beta2", b.getF64FloatAttr(beta2)),
                                   b.getNamedAttr("orth_reg_weight", b.getF64FloatAttr(orthRegWeight)),
                                   b.getNamedAttr("total_step", b.getI64IntegerAttr(totalStep)),
                                   b.getNamedAttr("target_modules", b.getStringAttr(targetModules)),
                                   b.getNamedAttr("modules", b.getArrayAttr(names)),
                                   b.getNamedAttr("fan_in_fan_out", b.getBoolAttr(allInOut && !adapted.empty())),
                               }));
  }

  // AdaLoraConfig's own checks, as one-line errors.
  LogicalResult checkOptions(ModuleOp module) {
    // Option<int64_t> values are streamed as int64_t: a Diagnostic would print the option as a char.
    if (rank < 1) return module.emitError() << "--lora-r (AdaLoRA's init_r) must be at least 1, got " << int64_t(rank);
    if (targetRank < 1 || targetRank > rank)
      return module.emitError() << "--target-r must be from 1 to --lora-r (" << int64_t(rank) << "), got " << int64_t(targetRank);
    if (totalStep < 1) return module.emitError() << "AdaLoRA needs --total-step N, the optimizer steps the schedule spans";
    // The budget schedule is a constant table with an entry per step (AdaloraAllocation.cpp).
    if (totalStep > kMaxTotalStep)
      return module.emitError() << "--total-step must be at most " << kMaxTotalStep << " (the budget schedule holds an "
                                << "entry per step in the plan), got " << int64_t(totalStep);
    if (tinit < 0 || tfinal < 0 || deltaT < 1)
      return module.emitError() << "--tinit and --tfinal must be at least 0 and --delta-t at least 1";
    if (tinit >= totalStep - tfinal)
      return module.emitError() << "--tinit (" << int64_t(tinit) << ") must be below --total-step minus --tfinal ("
                                << int64_t(totalStep - tfinal) << "): the budget would never shrink";
    if (!(beta1 > 0 && beta1 < 1 && beta2 > 0 && beta2 < 1))
      return module.emitError() << "--adalora-beta1 and --adalora-beta2 must be in (0, 1)";
    if (!(orthRegWeight >= 0)) return module.emitError() << "--orth-reg-weight must be at least 0";
    return success();
  }

  LogicalResult adapt(ModuleOp module, LinearOp l, std::mt19937_64 &rng) {
    auto [in, out] = sd::linearInOut(l);
    std::string m = l.getModule().str();
    if (cast<RankedTensorType>(l.getWeight().getType()).getElementType() != Float32Type::get(module.getContext()))
      return l.emitError("AdaLoRA on non-f32 weights is not supported yet");
    // PEFT's reset_lora_parameters: A, B ~ N(0, 0.02), E zeros.
    std::normal_distribution<double> normal(0.0, 0.02);
    std::vector<float> a(size_t(rank * in)), bw(size_t(out * rank));
    for (float &v : a) v = float(normal(rng));
    for (float &v : bw) v = float(normal(rng));
    GlobalOp ga = sd::createFloatGlobal(module, m + ".lora_A", {rank, in}, "trainable", &a);
    GlobalOp ge = sd::createFloatGlobal(module, m + ".lora_E", {rank, 1}, "trainable", nullptr);
    GlobalOp gb = sd::createFloatGlobal(module, m + ".lora_B", {out, rank}, "trainable", &bw);
    OpBuilder b(l);
    b.setInsertionPointAfter(l);
    GradBuilder g(b, l.getLoc());
    auto load = [&](GlobalOp gl) { return b.create<GlobalLoadOp>(l.getLoc(), gl.getType(), gl.getSymName()).getResult(); };
    SmallVector<OpOperand *> readers = sd::usesOf(l.getOutput());
    Value scaledA = g.mul(load(ga), load(ge));
    Value down = sd::adapterLinear(g, l.getInput(), scaledA, "oi", m + ".lora_A");
    Value up = sd::adapterLinear(g, down, load(gb), "oi", m + ".lora_B");
    // PEFT divides by ranknum + 1e-5 in float32.
    Value sum = g.add(l.getOutput(), g.scale(up, double(float(alpha) / (float(rank) + 1e-5f))));
    if (g.failed()) return failure();
    for (OpOperand *u : readers) u->set(sum);
    return success();
  }
};

} // namespace
