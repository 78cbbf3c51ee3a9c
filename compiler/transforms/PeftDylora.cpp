// sd-peft-dylora: DyLoRA (Valipour et al., 2023) as LyCORIS's DyLoraModule
// trains it. A LoRA pair of rank r is cut into r / block_size blocks of
// ranks; each training forward draws a block b per module, uniformly:
//   ΔW x = alpha / (b + 1) · B[:, ≤b] A[≤b, :] x
// where blocks below b are read detached (they compute but do not learn)
// and only block b trains. So the first k blocks alone make a working
// adapter for every k, and the rank can be chosen after training.
//
// The tensors are PEFT's LoRA ones (lora_A [r, in], lora_B [out, r]): at k
// blocks the adapter is exactly a PEFT LoRA of rank k·block_size with
// lora_alpha = alpha·block_size, so the saved file is one, and the first
// ranks of it are one too.
//
// A block's parameters take an optimizer step only when a micro-batch of
// that step drew it (LyCORIS keeps blocks as separate parameters, and
// PyTorch's optimizers skip one without a gradient): A and B carry
// sd.block_updates naming the module's drawn-blocks flags and per-block step
// counts, which sd-optimizer reads. sd-dylora-draws records the draws in
// training entries and sets the blocks in play elsewhere.
#include "sd/format/training_abi.h"
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include <random>
#include <set>

namespace sd {
#define GEN_PASS_DEF_PEFTDYLORA
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct PeftDyloraPass : sd::impl::PeftDyloraBase<PeftDyloraPass> {
  using PeftDyloraBase::PeftDyloraBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // Option<int64_t> values are streamed as int64_t: a Diagnostic would print the option as a char.
    if (rank < 1) return module.emitError() << "--lora-r must be at least 1, got " << int64_t(rank), signalPassFailure();
    if (blockSize < 1 || rank % blockSize != 0)
      return module.emitError() << "--dylora-block-size must divide --lora-r (" << int64_t(rank) << "), got "
                                << int64_t(blockSize),
             signalPassFailure();
    if (!(alpha > 0)) return module.emitError() << "--lora-alpha must be positive, got " << alpha, signalPassFailure();
    SmallVector<LinearOp> linears;
    if (failed(sd::adapterTargets(module, targetModules, linears))) return signalPassFailure();
    std::mt19937_64 rng{static_cast<uint64_t>(seed)};
    std::vector<float> allBlocks = {float(rank / blockSize)};
    sd::createFloatGlobal(module, sd::abi::kDyloraEvalBlocks, {}, "scalar_state", &allBlocks);
    std::set<std::string> adapted;
    bool allInOut = true; // PEFT's fan_in_fan_out: every adapted PyTorch weight is [in, out]
    for (auto [site, l] : llvm::enumerate(linears)) {
      allInOut &= sd::storedInOut(l);
      if (failed(adapt(module, l, int64_t(site), rng))) return signalPassFailure();
      adapted.insert(l.getModule().str());
    }
    Builder b(module.getContext());
    SmallVector<Attribute> names;
    for (const std::string &m : adapted) names.push_back(b.getStringAttr(m));
    module->setAttr("sd.peft", b.getDictionaryAttr({
                                   b.getNamedAttr("peft_type", b.getStringAttr("DYLORA")),
                                   b.getNamedAttr("r", b.getI64IntegerAttr(rank)),
                                   b.getNamedAttr("alpha", b.getF64FloatAttr(alpha)),
                                   b.getNamedAttr("block_size", b.getI64IntegerAttr(blockSize)),
                                   b.getNamedAttr("fan_in_fan_out", b.getBoolAttr(allInOut && !adapted.empty())),
                                   b.getNamedAttr("target_modules", b.getStringAttr(targetModules)),
                                   b.getNamedAttr("modules", b.getArrayAttr(names)),
                               }));
  }

  LogicalResult adapt(ModuleOp module, LinearOp l, int64_t site, std::mt19937_64 &rng) {
    auto [in, out] = sd::linearInOut(l);
    std::string m = l.getModule().str();
    Type f32 = Float32Type::get(module.getContext());
    if (cast<RankedTensorType>(l.getWeight().getType()).getElementType() != f32)
      return l.emitError("DyLoRA on non-f32 weights is not supported yet");
    const int64_t blocks = rank / blockSize;
    // LyCORIS: each down block kaiming_uniform_(a=sqrt(5)) over its `in` columns (so A's rows, in order), up zeros.
    std::vector<float> a = sd::kaimingUniform(rank, in, rng);
    GlobalOp ga = sd::createFloatGlobal(module, m + ".lora_A.weight", {rank, in}, "trainable", &a);
    GlobalOp gb = sd::createFloatGlobal(module, m + ".lora_B.weight", {out, rank}, "trainable", nullptr);
    GlobalOp drawn = sd::createFloatGlobal(module, sd::abi::kDyloraDrawnPrefix + m, {blocks}, "scalar_state", nullptr);
    GlobalOp steps = sd::createFloatGlobal(module, sd::abi::kDyloraStepsPrefix + m, {blocks}, "optimizer_state", nullptr);
    OpBuilder b(l);
    b.setInsertionPointAfter(l);
    Location loc = l.getLoc();
    for (auto [g, axis] : {std::pair{ga, 0}, std::pair{gb, 1}})
      g->setAttr(sd::kBlockUpdatesAttr,
                 b.getDictionaryAttr({b.getNamedAttr("axis", b.getI64IntegerAttr(axis)),
                                      b.getNamedAttr("size", b.getI64IntegerAttr(blockSize)),
                                      b.getNamedAttr("drawn", b.getStringAttr(drawn.getSymName())),
                                      b.getNamedAttr("steps", b.getStringAttr(steps.getSymName()))}));
    GradBuilder g(b, loc);
    auto load = [&](GlobalOp gl, bool detached) {
      auto v = b.create<GlobalLoadOp>(loc, gl.getType(), gl.getSymName());
      if (detached) v->setAttr(sd::kDetachedAttr, b.getUnitAttr());
      return v.getResult();
    };
    // The block: floor of a uniform draw in [0, blocks) from [seed, counter]
    // alone (not the row offset), so every data-parallel rank draws the same.
    Value seedCounter = g.sliceAxis(sd::loadRandomState(module, b, loc), 0, 0, 2);
    Operation *draw = g.op<SeededRandomOp>(
        {g.scalar(f32, 0.0), seedCounter},
        {b.getNamedAttr("a", b.getF32FloatAttr(0.0f)), b.getNamedAttr("b", b.getF32FloatAttr(float(blocks))),
         g.attr("stream", sd::kDyloraStream + site)});
    if (!draw) return failure();
    draw->setAttr(sd::kDyloraDrawAttr, b.getStringAttr(drawn.getSymName()));
    Value block = sd::dyloraBlock(g, draw->getResult(0), blocks);
    // Each rank's block, as a float: trains where it is the drawn one, is read detached below it.
    std::vector<int64_t> blockOf;
    for (int64_t i = 0; i < rank; ++i) blockOf.push_back(i / blockSize);
    Value ranks = g.castTo(g.ints({rank}, blockOf), f32);
    Value trains = g.castTo(g.make<EqualOp>({ranks, block}), f32);
    Value below = g.castTo(g.make<LessOp>({ranks, block}), f32);
    auto inPlay = [&](GlobalOp gl, Value trainMask, Value belowMask) {
      return g.add(g.mul(load(gl, false), trainMask), g.mul(load(gl, true), belowMask));
    };
    Value av = inPlay(ga, g.reshape(trains, {rank, 1}), g.reshape(below, {rank, 1}));
    Value bv = inPlay(gb, trains, below);
    SmallVector<OpOperand *> readers = sd::usesOf(l.getOutput()); // before the adapter reads it too
    Value down = sd::adapterLinear(g, l.getInput(), av, "oi", m + ".lora_A");
    Value up = sd::adapterLinear(g, down, bv, "oi", m + ".lora_B");
    Value scale = g.div(g.scalar(f32, alpha), g.add(block, g.scalar(f32, 1.0)));
    Value sum = g.add(l.getOutput(), g.mul(up, scale));
    if (g.failed()) return failure();
    for (OpOperand *u : readers) u->set(sum);
    return success();
  }
};

} // namespace
