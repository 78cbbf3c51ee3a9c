// sd-autodiff: reverse-mode differentiation of each eval_step into an
// accumulate entry that adds the loss gradient into per-parameter gradient
// globals. Rules come from the ops' DifferentiableOpInterface models.
#include "sd/format/training_abi.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "llvm/ADT/MapVector.h"

namespace sd {
#define GEN_PASS_DEF_AUTODIFF
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {


struct AutodiffPass : sd::impl::AutodiffBase<AutodiffPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<func::FuncOp> evals;
    for (auto f : module.getOps<func::FuncOp>())
      if (sd::isEntry(f) && f->getAttrOfType<StringAttr>("sd.entry").getValue() == sd::abi::kEvalStep) evals.push_back(f);
    if (evals.empty()) return;
    for (func::FuncOp eval : evals) {
      OpBuilder b(module.getContext());
      b.setInsertionPointAfter(eval);
      auto acc = cast<func::FuncOp>(b.clone(*eval));
      std::string name = eval.getName().str();
      acc.setName(sd::abi::kAccumulate + name.substr(std::string_view(sd::abi::kEvalStep).size()));
      acc->setAttr("sd.entry", b.getStringAttr(sd::abi::kAccumulate));
      if (failed(differentiate(module, acc))) return signalPassFailure();
    }
    // Trainable globals no gradient reaches (a registered causal mask, an
    // unused embedding) are not parameters of this loss: keep them frozen so
    // the optimizer neither allocates state for them nor decays them.
    for (GlobalOp g : module.getOps<GlobalOp>())
      if (g.getRole() == "trainable" && !withGradient.count(g.getSymName().str())) g.setRole("frozen");
  }

  GlobalOp globalNamed(ModuleOp module, StringRef name) {
    return dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, name));
  }

  LogicalResult differentiate(ModuleOp module, func::FuncOp f) {
    Block &body = f.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    Value loss = ret.getOperand(0), tokens = ret.getOperand(1);
    SmallVector<Operation *> ops;
    for (Operation &op : body.without_terminator()) ops.push_back(&op);

    // Activity: varied (depends on a trainable global) and useful (reaches the loss).
    DenseSet<Value> varied, useful{loss};
    for (Operation *op : ops) {
      bool in = false;
      if (auto load = dyn_cast<GlobalLoadOp>(op)) {
        GlobalOp g = globalNamed(module, load.getGlobal());
        in = g && g.getRole() == "trainable" && !load->hasAttr(sd::kDetachedAttr);
      } else if (!op->hasAttr(sd::kDetachedAttr)) { // a detached op's results carry no gradient (a stop-gradient)
        for (Value v : op->getOperands()) in = in || varied.contains(v);
      }
      if (!in) continue;
      for (Value r : op->getResults())
        if (auto t = dyn_cast<RankedTensorType>(r.getType()); t && isa<FloatType>(t.getElementType())) varied.insert(r);
    }
    for (Operation *op : llvm::reverse(ops)) {
      bool reaches = llvm::any_of(op->getResults(), [&](Value r) { return useful.contains(r); });
      if (reaches)
        for (Value v : op->getOperands()) useful.insert(v);
    }
    auto active = [&](Value v) { return varied.contains(v) && useful.contains(v); };
    if (!active(loss)) return f.emitError("the loss does not depend on any trainable parameter");

    OpBuilder b(ret);
    GradBuilder seed(b, f.getLoc());
    DenseMap<Value, Value> grads;
    grads[loss] = seed.scalar(cast<ShapedType>(loss.getType()).getElementType(), 1.0);
    // fp16 (sd-autocast): the backward starts from the loss scale, so small
    // gradients stay above fp16's smallest values; sd-optimizer unscales.
    if (auto init = module->getAttrOfType<FloatAttr>("sd.loss_scale_init")) {
      auto scalarType = RankedTensorType::get({}, b.getF32Type());
      auto value = DenseElementsAttr::get(scalarType, float(init.getValueAsDouble()));
      GlobalOp scale = sd::getOrCreateGlobal(module, sd::abi::kLossScale, scalarType, "scalar_state", value);
      if (loss.getType() != scalarType) return f.emitError("fp16 loss scaling needs an f32 scalar loss");
      grads[loss] = b.create<GlobalLoadOp>(f.getLoc(), scalarType, scale.getSymName());
    }
    llvm::MapVector<StringRef, Value> globalGrads;
    for (Operation *op : llvm::reverse(ops)) {
      SmallVector<Value> dys;
      bool any = false;
      for (Value r : op->getResults()) {
        dys.push_back(grads.lookup(r));
        any = any || dys.back();
      }
      if (!any) continue;
      if (auto load = dyn_cast<GlobalLoadOp>(op)) {
        Value &acc = globalGrads[load.getGlobal()];
        GradBuilder g(b, op->getLoc());
        acc = acc ? g.add(acc, dys[0]) : dys[0];
        if (g.failed()) return failure();
        continue;
      }
      auto rule = dyn_cast<DifferentiableOpInterface>(op);
      if (!rule)
        return op->emitError() << sd::describeNode(op)
                               << " is not differentiable, and it lies between a trainable parameter and the loss"
                               << (isa<LoopOp>(op) ? " (a loop step: raise --max-unroll to unroll the loop)" : "");
      SmallVector<bool> needed;
      for (Value v : op->getOperands()) needed.push_back(active(v));
      if (llvm::none_of(needed, [](bool n) { return n; })) continue;
      SmallVector<Value> dxs;
      if (failed(rule.buildVJP(b, dys, needed, dxs))) return failure();
      for (auto [i, v] : llvm::enumerate(op->getOperands())) {
        if (!needed[i] || !dxs[i]) continue;
        Value &acc = grads[v];
        GradBuilder g(b, op->getLoc());
        acc = acc ? g.add(acc, dxs[i]) : dxs[i];
        if (g.failed()) return failure();
      }
    }

    // grad/<name> += d loss_sum / d <name>; tokens_seen += tokens.
    auto accumulateInto = [&](GlobalOp g, Value delta) {
      GradBuilder gb(b, f.getLoc());
      Value old = b.create<GlobalLoadOp>(f.getLoc(), g.getType(), g.getSymName());
      Value sum = gb.add(old, delta);
      if (gb.failed()) return failure();
      b.create<GlobalStoreOp>(f.getLoc(), g.getSymName(), sum);
      return success();
    };
    for (auto &[name, g] : globalGrads) {
      GlobalOp param = globalNamed(module, name);
      GlobalOp grad = sd::getOrCreateGlobal(module, sd::abi::gradientOf(name), param.getType(), "gradient");
      if (failed(accumulateInto(grad, g))) return failure();
      withGradient.insert(name.str());
    }
    GlobalOp seen = sd::getOrCreateGlobal(module, sd::abi::kTokensSeen, tokens.getType(), "scalar_state");
    if (seen.getType() != tokens.getType()) return f.emitError("token count must be a float scalar");
    return accumulateInto(seen, tokens);
  }

  std::set<std::string> withGradient;
};

} // namespace
