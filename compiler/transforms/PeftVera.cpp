// sd-peft-vera: VeRA on the sd.linear modules PEFT would match: one frozen
// random pair of projections shared by every adapted layer, and two trained
// scaling vectors per layer.
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include <cmath>
#include <random>

namespace sd {
#define GEN_PASS_DEF_PEFTVERA
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct PeftVeraPass : sd::impl::PeftVeraBase<PeftVeraPass> {
  using PeftVeraBase::PeftVeraBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (rank < 1) {
      module.emitError() << "--lora-r (VeRA's r) must be at least 1, got " << rank;
      return signalPassFailure();
    }
    if (!(dropout >= 0.0 && dropout < 1.0)) {
      module.emitError() << "--lora-dropout (VeRA's vera_dropout) must be in [0, 1), got " << dropout;
      return signalPassFailure();
    }
    SmallVector<LinearOp> linears;
    if (failed(sd::adapterTargets(module, targetModules, linears))) return signalPassFailure();
    // PEFT's _find_dim: the projections cover the largest in and out of the adapted layers.
    int64_t maxIn = 0, maxOut = 0;
    bool allInOut = true;
    for (LinearOp l : linears) {
      auto [in, out] = sd::linearInOut(l);
      maxIn = std::max(maxIn, in);
      maxOut = std::max(maxOut, out);
      allInOut &= sd::storedInOut(l);
      if (!cast<RankedTensorType>(l.getWeight().getType()).getElementType().isF32()) {
        l.emitError("VeRA on non-f32 weights is not supported yet");
        return signalPassFailure();
      }
    }
    // _kaiming_init: U(±sqrt(6 / fan_in)), fan_in a 2-D tensor's second dim; A first, then B.
    std::mt19937 gen(static_cast<uint32_t>(projectionKey));
    std::vector<float> a = sd::torchUniformFloats(size_t(rank * maxIn), std::sqrt(6.0 / double(maxIn)), gen);
    std::vector<float> bv = sd::torchUniformFloats(size_t(maxOut * rank), std::sqrt(6.0 / double(rank)), gen);
    GlobalOp ga = sd::createFloatGlobal(module, "vera_A", {rank, maxIn}, "frozen", &a);
    GlobalOp gb = sd::createFloatGlobal(module, "vera_B", {maxOut, rank}, "frozen", &bv);
    Builder b(module.getContext());
    SmallVector<Attribute> names;
    for (auto [stream, l] : llvm::enumerate(linears)) {
      if (failed(adapt(module, l, ga, gb, int64_t(stream)))) return signalPassFailure();
      names.push_back(b.getStringAttr(l.getModule()));
    }
    module->setAttr("sd.peft", b.getDictionaryAttr({
                                   b.getNamedAttr("peft_type", b.getStringAttr("VERA")),
                                   b.getNamedAttr("r", b.getI64IntegerAttr(rank)),
                                   b.getNamedAttr("projection_prng_key", b.getI64IntegerAttr(projectionKey)),
                                   b.getNamedAttr("d_initial", b.getF64FloatAttr(dInitial)),
                                   b.getNamedAttr("vera_dropout", b.getF64FloatAttr(dropout)),
                                   b.getNamedAttr("fan_in_fan_out", b.getBoolAttr(allInOut && !linears.empty())),
                                   b.getNamedAttr("target_modules", b.getStringAttr(targetModules)),
                                   b.getNamedAttr("modules", b.getArrayAttr(names)),
                               }));
  }

  LogicalResult adapt(ModuleOp module, LinearOp l, GlobalOp ga, GlobalOp gb, int64_t stream) {
    auto [in, out] = sd::linearInOut(l);
    std::string m = l.getModule().str();
    std::vector<float> d(static_cast<size_t>(rank), static_cast<float>(dInitial));
    GlobalOp gd = sd::createFloatGlobal(module, m + ".vera_lambda_d", {rank}, "trainable", &d);
    GlobalOp glb = sd::createFloatGlobal(module, m + ".vera_lambda_b", {out}, "trainable", nullptr);
    SmallVector<OpOperand *> readers = sd::usesOf(l.getOutput());
    OpBuilder b(l);
    b.setInsertionPointAfter(l);
    GradBuilder g(b, l.getLoc());
    auto load = [&](GlobalOp gl) { return b.create<GlobalLoadOp>(l.getLoc(), gl.getType(), gl.getSymName()).getResult(); };
    Value a = g.sliceAxis(load(ga), 1, 0, in);   // [r, in]
    Value bm = g.sliceAxis(load(gb), 0, 0, out); // [out, r]
    Value x = dropout > 0 ? sd::adapterDropout(module, g, l.getInput(), dropout, stream) : l.getInput();
    Value down = g.mul(sd::adapterLinear(g, x, a, "oi", m + ".vera_A"), load(gd));
    Value up = g.mul(sd::adapterLinear(g, down, bm, "oi", m + ".vera_B"), load(glb));
    Value sum = g.add(l.getOutput(), up);
    if (g.failed()) return failure();
    for (OpOperand *u : readers) u->set(sum);
    return success();
  }
};

} // namespace
