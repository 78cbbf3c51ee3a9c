// sd-training-dropout: dropout exists only while training. Entries that
// differentiate (accumulate; train_step is built from it later) keep their
// seeded_dropout and seeded_random ops and advance the dropout counter once
// per call, so each micro-batch draws fresh masks and the backward pass,
// reading the same [seed, counter] value, regenerates the forward's. In every
// other entry (eval_step, infer) dropout is the identity and is removed, and
// each random draw becomes its expectation: a Bernoulli mask Cast(Less(u, p))
// of a uniform u in [0, 1) becomes p, so Dropout2d's and drop path's
// mask / p is 1 there, as in PyTorch's eval().
#include "sd/format/training_abi.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include <algorithm>

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
      SmallVector<SeededRandomOp> draws;
      f.walk([&](SeededDropoutOp d) { drops.push_back(d); });
      f.walk([&](SeededRandomOp r) { draws.push_back(r); });
      if (drops.empty() && draws.empty()) continue;
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
      for (SeededRandomOp r : draws)
        if (failed(expectation(r))) return signalPassFailure();
    }
  }

  // `type` filled with v.
  static Value filled(GradBuilder &g, Type type, double v) {
    auto t = cast<RankedTensorType>(type);
    return g.make<ExpandOp>({g.scalar(t.getElementType(), v), g.ints(t.getShape())});
  }

  // Replaces draw r by its expectation, and each Bernoulli mask drawn from it
  // by its probability.
  LogicalResult expectation(SeededRandomOp r) {
    const bool normal = r.getNormal().value_or(0) != 0;
    const double a = r.getA() ? r.getA()->convertToDouble() : 0.0, b = r.getB() ? r.getB()->convertToDouble() : 1.0;
    SmallVector<Operation *> dead;
    for (Operation *user : llvm::make_early_inc_range(r->getUsers())) {
      auto less = dyn_cast<LessOp>(user);
      std::optional<double> p = less && less.getLhs() == r.getResult() ? sd::scalarValue(less.getRhs()) : std::nullopt;
      if (normal || a != 0.0 || b != 1.0 || !p) continue;
      for (Operation *mask : llvm::make_early_inc_range(less->getUsers()))
        if (auto cast = dyn_cast<CastOp>(mask); cast && isa<FloatType>(elementTypeOf(cast.getResult()))) {
          OpBuilder builder(cast);
          GradBuilder g(builder, cast.getLoc());
          Value probability = filled(g, cast.getResult().getType(), std::clamp(*p, 0.0, 1.0));
          if (g.failed()) return failure();
          cast.getResult().replaceAllUsesWith(probability);
          dead.push_back(cast);
        }
      dead.push_back(less);
    }
    for (Operation *op : dead)
      if (op->use_empty()) op->erase();
    Value state = r.getRng();
    if (!r->use_empty()) {
      OpBuilder builder(r);
      GradBuilder g(builder, r.getLoc());
      Value mean = filled(g, r.getResult().getType(), normal ? a : (a + b) / 2);
      if (g.failed()) return failure();
      r.getResult().replaceAllUsesWith(mean);
    }
    r.erase();
    if (Operation *load = state.getDefiningOp(); load && load->use_empty()) load->erase();
    return success();
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
