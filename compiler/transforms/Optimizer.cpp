// sd-optimizer: the apply entry (one optimizer step over the accumulated
// gradients) and train_step = accumulate followed by apply, per bucket.
#include "sd/format/training_abi.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/IRMapping.h"

namespace sd {
#define GEN_PASS_DEF_OPTIMIZER
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct OptimizerPass : sd::impl::OptimizerBase<OptimizerPass> {
  using OptimizerBase::OptimizerBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<func::FuncOp> accs;
    for (auto f : module.getOps<func::FuncOp>())
      if (sd::isEntry(f) && f->getAttrOfType<StringAttr>("sd.entry").getValue() == sd::abi::kAccumulate) accs.push_back(f);
    if (accs.empty()) return;
    if (optimizer != "adamw" && optimizer != "sgd") {
      module.emitError() << "unknown optimizer '" << optimizer << "' (adamw, sgd)";
      return signalPassFailure();
    }
    func::FuncOp apply = buildApply(module);
    if (!apply) return signalPassFailure();
    for (func::FuncOp acc : accs) buildTrainStep(acc, apply);
  }

  func::FuncOp buildApply(ModuleOp module) {
    MLIRContext *ctx = module.getContext();
    SmallVector<GlobalOp> params;
    for (GlobalOp g : module.getOps<GlobalOp>())
      if (g.getRole() == "trainable") params.push_back(g);
    auto scalarType = RankedTensorType::get({}, Float32Type::get(ctx));
    OpBuilder b(ctx);
    b.setInsertionPointToEnd(module.getBody());
    Location loc = NameLoc::get(b.getStringAttr("optimizer"));
    auto fn = b.create<func::FuncOp>(loc, sd::abi::kApply,
                                     b.getFunctionType({scalarType, scalarType, scalarType}, {scalarType}));
    fn->setAttr("sd.entry", b.getStringAttr(sd::abi::kApply));
    fn->setAttr("sd.bucket", b.getDictionaryAttr({}));
    fn->setAttr("sd.output_names", b.getStrArrayAttr({sd::abi::kGradNorm}));
    const char *argNames[] = {sd::abi::kLr, sd::abi::kWeightDecay, sd::abi::kMaxGradNorm};
    Block *body = fn.addEntryBlock();
    for (unsigned i = 0; i < 3; ++i) fn.setArgAttr(i, "sd.name", b.getStringAttr(argNames[i]));
    b.setInsertionPointToStart(body);
    Value lr = body->getArgument(0), wd = body->getArgument(1), maxNorm = body->getArgument(2);
    GradBuilder g(b, loc);
    auto load = [&](GlobalOp gl) { return b.create<GlobalLoadOp>(loc, gl.getType(), gl.getSymName()).getResult(); };
    auto store = [&](Value v, GlobalOp gl) { b.create<GlobalStoreOp>(loc, gl.getSymName(), v); };

    GlobalOp tokensSeen = sd::getOrCreateGlobal(module, sd::abi::kTokensSeen, scalarType, "scalar_state");
    GlobalOp step = sd::getOrCreateGlobal(module, sd::abi::kOptimizerStep, scalarType, "scalar_state");
    SmallVector<GlobalOp> gradGlobals;
    SmallVector<Value> gradValues = {load(tokensSeen), maxNorm};
    for (GlobalOp p : params) {
      gradGlobals.push_back(sd::getOrCreateGlobal(module, sd::abi::gradientOf(p.getSymName()), p.getType(), "gradient"));
      gradValues.push_back(load(gradGlobals.back()));
    }
    Operation *scale = g.op<GradScaleOp>(gradValues, {}, 2);
    Value newStep = g.add(load(step), g.scalar(b.getF32Type(), 1.0));
    if (!scale || g.failed()) return fn.erase(), func::FuncOp();
    store(newStep, step);
    for (auto [i, p] : llvm::enumerate(params)) {
      // Weights decay; biases and norm parameters (rank 1) do not, as in HF's Trainer.
      int64_t decay = cast<RankedTensorType>(p.getType()).getRank() >= 2;
      Value grad = gradValues[i + 2];
      if (optimizer == "adamw") {
        GlobalOp m = sd::getOrCreateGlobal(module, sd::abi::kAdamExpAvgPrefix + p.getSymName().str(), p.getType(), "optimizer_state");
        GlobalOp v = sd::getOrCreateGlobal(module, sd::abi::kAdamExpAvgSqPrefix + p.getSymName().str(), p.getType(), "optimizer_state");
        Operation *u = g.op<AdamWOp>(
            {load(p), grad, load(m), load(v), newStep, lr, wd, scale->getResult(0)},
            {b.getNamedAttr("beta1", b.getF64FloatAttr(beta1)), b.getNamedAttr("beta2", b.getF64FloatAttr(beta2)),
             b.getNamedAttr("epsilon", b.getF64FloatAttr(epsilon)), g.attr("decay", decay)},
            4);
        if (!u) return fn.erase(), func::FuncOp();
        store(u->getResult(0), p);
        store(u->getResult(1), m);
        store(u->getResult(2), v);
        store(u->getResult(3), gradGlobals[i]);
      } else {
        GlobalOp buf = sd::getOrCreateGlobal(module, sd::abi::kSgdMomentumPrefix + p.getSymName().str(), p.getType(), "optimizer_state");
        Operation *u = g.op<SGDOp>({load(p), grad, load(buf), newStep, lr, wd, scale->getResult(0)},
                                   {b.getNamedAttr("momentum", b.getF64FloatAttr(momentum)),
                                    g.attr("nesterov", int64_t(nesterov)), g.attr("decay", decay)},
                                   3);
        if (!u) return fn.erase(), func::FuncOp();
        store(u->getResult(0), p);
        store(u->getResult(1), buf);
        store(u->getResult(2), gradGlobals[i]);
      }
    }
    store(g.scalar(b.getF32Type(), 0.0), tokensSeen);
    b.create<func::ReturnOp>(loc, ValueRange{scale->getResult(1)});
    return fn;
  }

  // train_step(inputs..., lr, weight_decay, max_grad_norm) = accumulate; apply.
  void buildTrainStep(func::FuncOp acc, func::FuncOp apply) {
    OpBuilder b(acc);
    b.setInsertionPointAfter(acc);
    auto step = cast<func::FuncOp>(b.clone(*acc));
    step.setName(sd::abi::kTrainStep + acc.getName().substr(std::string_view(sd::abi::kAccumulate).size()).str());
    step->setAttr("sd.entry", b.getStringAttr(sd::abi::kTrainStep));
    Block &body = step.getBody().front();
    IRMapping map;
    unsigned first = step.getNumArguments();
    for (unsigned i = 0; i < apply.getNumArguments(); ++i) {
      step.insertArgument(first + i, apply.getArgument(i).getType(), apply.getArgAttrDict(i), apply.getLoc());
      map.map(apply.getArgument(i), step.getArgument(first + i));
    }
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    b.setInsertionPoint(ret);
    SmallVector<Value> results(ret.getOperands());
    for (Operation &op : apply.getBody().front()) {
      if (auto r = dyn_cast<func::ReturnOp>(op)) {
        for (Value v : r.getOperands()) results.push_back(map.lookup(v));
        continue;
      }
      b.clone(op, map);
    }
    b.create<func::ReturnOp>(ret.getLoc(), results);
    ret.erase();
    SmallVector<Type> types;
    for (Value v : results) types.push_back(v.getType());
    step.setType(FunctionType::get(step.getContext(), step.getArgumentTypes(), types));
    step->setAttr("sd.output_names", b.getStrArrayAttr({sd::abi::kLossSum, sd::abi::kTokens, sd::abi::kGradNorm}));
  }
};

} // namespace
