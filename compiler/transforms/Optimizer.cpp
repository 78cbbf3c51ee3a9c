// sd-optimizer: the apply entry (one optimizer step over the accumulated
// gradients) and train_step = accumulate followed by apply, per bucket.
//
// fp16 (a `loss_scale` global, made by sd-autodiff): the gradients hold
// scale x the true ones, so GradScale divides by tokens x scale (unscaled
// before clipping, as GradScaler.unscale_ then clip_grad_norm_). An Inf or
// NaN gradient makes the global norm non-finite; then the step is skipped:
// parameters, moments and the step counter keep their bits (the found-Inf
// flag is the updates' `skip` operand, so they write nothing but the zeroed
// gradients; a select keeps the step counter), and the scale halves.
// After sd.loss_scale_window clean steps (sd-autocast) it doubles.
#include "sd/format/training_abi.h"
#include "AdaloraAllocation.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/IRMapping.h"
#include <map>

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
    auto lossScale = dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, sd::abi::kLossScale));
    if (lossScale) gradValues[0] = g.mul(gradValues[0], load(lossScale)); // unscale with the token count
    Operation *scale = g.op<GradScaleOp>(gradValues, {}, 2);
    Value oldStep = load(step);
    Value newStep = g.add(oldStep, g.scalar(b.getF32Type(), 1.0));
    if (!scale || g.failed()) return fn.erase(), func::FuncOp();
    // fp16: `skip` is true when the norm is Inf or NaN (norm - norm is NaN exactly then).
    Value skip = lossScale ? g.make<IsNaNOp>({g.sub(scale->getResult(1), scale->getResult(1))}) : Value();
    store(skip ? g.make<WhereOp>({skip, oldStep, newStep}) : newStep, step);
    Value skipOperand = skip ? skip : g.none();
    if (lossScale && failed(updateLossScale(module, g, skip, lossScale, load, store))) return fn.erase(), func::FuncOp();
    BlockSteps blockSteps;
    for (auto [i, p] : llvm::enumerate(params)) {
      // Weights decay; biases and norm parameters (rank 1) do not, as in HF's Trainer.
      int64_t decay = cast<RankedTensorType>(p.getType()).getRank() >= 2;
      SmallVector<GlobalOp> state; // the moments, or the momentum buffer
      for (const char *prefix : optimizer == "adamw" ? SmallVector<const char *>{sd::abi::kAdamExpAvgPrefix, sd::abi::kAdamExpAvgSqPrefix}
                                                     : SmallVector<const char *>{sd::abi::kSgdMomentumPrefix})
        state.push_back(sd::getOrCreateGlobal(module, prefix + p.getSymName().str(), p.getType(), "optimizer_state"));
      SmallVector<Value> tensors = {load(p), gradValues[i + 2]};
      for (GlobalOp s : state) tensors.push_back(load(s));
      // The updated parameter, state and zeroed gradient.
      SmallVector<Value> updated;
      if (auto blocks = p->getAttrOfType<DictionaryAttr>(sd::kBlockUpdatesAttr))
        updated = updateBlocks(module, g, blocks, tensors, blockSteps, load, store, skip, lr, wd, scale->getResult(0), decay);
      else
        updated = update(g, tensors, newStep, lr, wd, scale->getResult(0), skipOperand, decay);
      if (updated.empty()) return fn.erase(), func::FuncOp();
      store(updated[0], p);
      for (auto [k, s] : llvm::enumerate(state)) store(updated[k + 1], s);
      store(updated.back(), gradGlobals[i]);
    }
    for (auto &[name, flags] : blockSteps.flags) { // the drawn flags, read by every update above, cleared
      auto global = cast<GlobalOp>(SymbolTable::lookupSymbolIn(module, name));
      store(g.zeros(global.getType()), global);
    }
    store(g.scalar(b.getF32Type(), 0.0), tokensSeen);
    if (g.failed()) return fn.erase(), func::FuncOp();
    b.create<func::ReturnOp>(loc, ValueRange{scale->getResult(1)});
    // AdaLoRA: the rank allocation follows each step, in train_step too.
    if (sd::trainsAdalora(module) && failed(sd::appendRankAllocation(module, fn, newStep))) return fn.erase(), func::FuncOp();
    return fn;
  }

  // One AdamW or SGD step of `tensors` (param, grad, then the state), or null.
  SmallVector<Value> update(GradBuilder &g, ArrayRef<Value> tensors, Value step, Value lr, Value wd, Value gradScale,
                            Value skip, int64_t decay) {
    OpBuilder &b = g.builder();
    Operation *u =
        optimizer == "adamw"
            ? g.op<AdamWOp>({tensors[0], tensors[1], tensors[2], tensors[3], step, lr, wd, gradScale, skip},
                            {b.getNamedAttr("beta1", b.getF64FloatAttr(beta1)),
                             b.getNamedAttr("beta2", b.getF64FloatAttr(beta2)),
                             b.getNamedAttr("epsilon", b.getF64FloatAttr(epsilon)), g.attr("decay", decay)},
                            4)
            : g.op<SGDOp>({tensors[0], tensors[1], tensors[2], step, lr, wd, gradScale, skip},
                          {b.getNamedAttr("momentum", b.getF64FloatAttr(momentum)),
                           g.attr("nesterov", int64_t(nesterov)), g.attr("decay", decay)},
                          3);
    if (!u) return {};
    return SmallVector<Value>(u->getResults());
  }

  // Per module of block-updated parameters (sd.block_updates): the drawn
  // flags and the step counts after this step, computed once for its A and B.
  struct BlockSteps {
    std::map<std::string, Value> flags, steps;
  };

  // A block-updated parameter (DyLoRA's): block k steps only when a
  // micro-batch drew it, with its own step count, as PyTorch steps a
  // parameter only when it has a gradient (LyCORIS keeps blocks as separate
  // parameters); a block not drawn keeps its values and moments bit for bit.
  template <class Load, class Store>
  SmallVector<Value> updateBlocks(ModuleOp module, GradBuilder &g, DictionaryAttr blocks, ArrayRef<Value> tensors,
                                  BlockSteps &blockSteps, Load &&load, Store &&store, Value skip, Value lr, Value wd,
                                  Value gradScale, int64_t decay) {
    auto axis = blocks.getAs<IntegerAttr>("axis"), size = blocks.getAs<IntegerAttr>("size");
    auto drawnName = blocks.getAs<StringAttr>("drawn"), stepsName = blocks.getAs<StringAttr>("steps");
    auto drawn = drawnName ? dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, drawnName)) : GlobalOp();
    auto steps = stepsName ? dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, stepsName)) : GlobalOp();
    auto shape = cast<RankedTensorType>(tensors[0].getType()).getShape();
    if (!axis || !size || !drawn || !steps || axis.getInt() < 0 || axis.getInt() >= int64_t(shape.size()) ||
        size.getInt() < 1 || shape[axis.getInt()] % size.getInt() != 0) {
      module.emitError() << "malformed " << sd::kBlockUpdatesAttr << " on a trainable global";
      return {};
    }
    const int64_t dim = axis.getInt(), width = size.getInt(), count = shape[dim] / width;
    Type f32 = g.builder().getF32Type();
    Value &flags = blockSteps.flags[drawnName.str()];
    Value &counts = blockSteps.steps[stepsName.str()];
    if (!flags) {
      flags = load(drawn);
      // A block steps when drawn (and the whole step is not skipped, fp16).
      Value stepping = skip ? g.mul(flags, g.sub(g.scalar(f32, 1.0), g.castTo(skip, f32))) : flags;
      counts = g.add(load(steps), stepping);
      store(counts, steps);
    }
    SmallVector<SmallVector<Value>> pieces(tensors.size()); // one result per operand tensor
    for (int64_t k = 0; k < count; ++k) {
      SmallVector<Value> slices;
      for (Value t : tensors) slices.push_back(g.sliceAxis(t, dim, k * width, (k + 1) * width));
      Value drawnK = g.reshape(g.sliceAxis(flags, 0, k, k + 1), {});
      Value notDrawn = g.make<EqualOp>({drawnK, g.scalar(f32, 0.0)});
      Value skipK = skip ? g.make<OrOp>({skip, notDrawn}) : notDrawn;
      // A skipped block's step operand is unread: count + 1 would do as well as the kept count.
      Value stepK = g.reshape(g.sliceAxis(counts, 0, k, k + 1), {});
      SmallVector<Value> u = update(g, slices, stepK, lr, wd, gradScale, skipK, decay);
      if (u.empty() || g.failed()) return {};
      for (auto [j, v] : llvm::enumerate(u)) pieces[j].push_back(v);
    }
    SmallVector<Value> whole;
    for (auto &p : pieces) whole.push_back(g.make<ConcatOp>(p, {g.attr("axis", dim)}));
    if (g.failed()) return {};
    return whole;
  }

  // GradScaler's update: on a skipped step scale x0.5 and the tracker back to
  // 0; otherwise tracker + 1, and at the growth interval scale x2 and 0.
  template <class Load, class Store>
  LogicalResult updateLossScale(ModuleOp module, GradBuilder &g, Value skip, GlobalOp lossScale, Load &&load,
                                Store &&store) {
    auto scalarType = RankedTensorType::get({}, Float32Type::get(module.getContext()));
    auto window = module->getAttrOfType<IntegerAttr>("sd.loss_scale_window");
    if (!window) return module.emitError("a loss_scale global without sd.loss_scale_window (made by sd-autocast)");
    GlobalOp tracker = sd::getOrCreateGlobal(module, sd::abi::kLossScaleGrowth, scalarType, "scalar_state");
    Type f32 = scalarType.getElementType();
    Value scale = load(lossScale), zero = g.scalar(f32, 0.0);
    Value counted = g.make<WhereOp>({skip, zero, g.add(load(tracker), g.scalar(f32, 1.0))});
    Value grow = g.make<EqualOp>({counted, g.scalar(f32, double(window.getInt()))});
    Value grown = g.make<WhereOp>({grow, g.scale(scale, 2.0), scale});
    store(g.make<WhereOp>({skip, g.scale(scale, 0.5), grown}), lossScale);
    store(g.make<WhereOp>({grow, zero, counted}), tracker);
    return failure(g.failed());
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
