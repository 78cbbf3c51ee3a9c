// sd-training-dropout: dropout exists only while training. Entries that
// differentiate (accumulate; train_step is built from it later) keep their
// seeded_dropout ops and advance the dropout counter once per call, so each
// micro-batch draws fresh masks and the backward pass, reading the same
// [seed, counter] value, regenerates the forward's. In every other entry
// (eval_step, infer) dropout is the identity and is removed.
#include "sd/format/training_abi.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"

namespace sd {
#define GEN_PASS_DEF_TRAININGDROPOUT
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct TrainingDropoutPass : sd::impl::TrainingDropoutBase<TrainingDropoutPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    for (auto f : module.getOps<func::FuncOp>()) {
      if (!sd::isEntry(f)) continue;
      SmallVector<SeededDropoutOp> drops;
      f.walk([&](SeededDropoutOp d) { drops.push_back(d); });
      if (drops.empty()) continue;
      if (f->getAttrOfType<StringAttr>("sd.entry").getValue() == sd::abi::kAccumulate) {
        if (failed(advanceCounter(module, f))) return signalPassFailure();
        continue;
      }
      for (SeededDropoutOp d : drops) {
        Value state = d.getRng();
        d.getResult().replaceAllUsesWith(d.getX());
        d.erase();
        if (Operation *load = state.getDefiningOp(); load && load->use_empty()) load->erase();
      }
    }
  }

  // dropout_rng[1] += 1 just before the return, after every read of it (the
  // seed and the row offset stay).
  LogicalResult advanceCounter(ModuleOp module, func::FuncOp f) {
    auto global = dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, sd::abi::kDropoutRng));
    if (!global) return f.emitError("seeded_dropout without the ") << sd::abi::kDropoutRng << " state global";
    Operation *ret = f.getBody().front().getTerminator();
    OpBuilder b(ret);
    GradBuilder g(b, f.getLoc());
    Value old = b.create<GlobalLoadOp>(f.getLoc(), global.getType(), global.getSymName());
    SmallVector<int64_t> step(size_t(cast<RankedTensorType>(global.getType()).getNumElements()), 0);
    if (step.size() < 2) return f.emitError() << sd::abi::kDropoutRng << " must hold at least [seed, counter]";
    step[1] = 1;
    Value next = g.add(old, g.ints(step));
    if (g.failed()) return failure();
    b.create<GlobalStoreOp>(f.getLoc(), global.getSymName(), next);
    return success();
  }
};

} // namespace
