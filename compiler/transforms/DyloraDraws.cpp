// sd-dylora-draws: what a DyLoRA block draw (sd-peft-dylora) becomes in
// each entry, after autodiff:
//   - accumulate (train_step is built from it later) keeps the draw and marks
//     the drawn block in its module's `dylora.drawn/` flags before returning,
//     so sd-optimizer steps exactly the blocks some micro-batch trained;
//   - every other entry (eval_step, infer, the generation entries) reads no
//     random number: its block is dylora.eval_blocks - 1, so the blocks in
//     play are the ones the runtime chose (all of them unless told fewer).
// Runs before sd-training-dropout, which then sees the training entries'
// draws only (and advances their counter).
#include "sd/format/training_abi.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"

namespace sd {
#define GEN_PASS_DEF_DYLORADRAWS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct DyloraDrawsPass : sd::impl::DyloraDrawsBase<DyloraDrawsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    for (auto f : module.getOps<func::FuncOp>()) {
      if (!sd::isEntry(f)) continue;
      SmallVector<SeededRandomOp> draws;
      f.walk([&](SeededRandomOp r) {
        if (r->hasAttr(sd::kDyloraDrawAttr)) draws.push_back(r);
      });
      const bool training = f->getAttrOfType<StringAttr>("sd.entry").getValue() == sd::abi::kAccumulate;
      for (SeededRandomOp r : draws)
        if (failed(training ? record(module, f, r) : chosen(module, r))) return signalPassFailure();
    }
  }

  // drawn = max(drawn, one-hot of the block), just before the return.
  LogicalResult record(ModuleOp module, func::FuncOp f, SeededRandomOp r) {
    auto name = r->getAttrOfType<StringAttr>(sd::kDyloraDrawAttr);
    auto drawn = dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, name.getValue()));
    auto type = drawn ? dyn_cast<RankedTensorType>(drawn.getType()) : RankedTensorType();
    if (!type || type.getRank() != 1) return r.emitError() << "DyLoRA draw without its flags global '" << name.getValue() << "'";
    Operation *ret = f.getBody().front().getTerminator();
    OpBuilder b(ret);
    GradBuilder g(b, r.getLoc());
    const int64_t blocks = type.getDimSize(0);
    Type f32 = type.getElementType();
    Value block = sd::dyloraBlock(g, r.getResult(), blocks);
    std::vector<int64_t> ids;
    for (int64_t k = 0; k < blocks; ++k) ids.push_back(k);
    Value hit = g.castTo(g.make<EqualOp>({g.castTo(g.ints({blocks}, ids), f32), block}), f32);
    Value old = b.create<GlobalLoadOp>(r.getLoc(), drawn.getType(), drawn.getSymName());
    Value marked = g.make<MaxOp>({old, hit});
    if (g.failed()) return failure();
    b.create<GlobalStoreOp>(r.getLoc(), drawn.getSymName(), marked);
    return success();
  }

  // The draw becomes eval_blocks - 1 (a whole number, which the floor keeps).
  LogicalResult chosen(ModuleOp module, SeededRandomOp r) {
    auto eval = dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, sd::abi::kDyloraEvalBlocks));
    if (!eval) return r.emitError() << "DyLoRA draw without the " << sd::abi::kDyloraEvalBlocks << " global";
    OpBuilder b(r);
    GradBuilder g(b, r.getLoc());
    Value blocks = b.create<GlobalLoadOp>(r.getLoc(), eval.getType(), eval.getSymName());
    Value last = g.sub(blocks, g.scalar(cast<RankedTensorType>(eval.getType()).getElementType(), 1.0));
    if (g.failed()) return failure();
    r.getResult().replaceAllUsesWith(last);
    sd::eraseIfUnread(r.getResult()); // the draw, then the rng slice and load that only it read
    return success();
  }
};

} // namespace
