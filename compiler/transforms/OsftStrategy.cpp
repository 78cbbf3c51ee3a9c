// sd-osft-strategy: per sd.osft_linear, once shapes are static, the cheaper
// of two ways to compute it. Factored: the op as it is (two GEMM chains
// through the factors, never forming W). Dense: W rebuilt from its factors
// once per step (sd.osft_compose) and one sd.linear on it, whose weight
// gradient passes to the low factors (sd.osft_compose_grad); it wins when a
// step carries many tokens through a small W. Costs are multiply-adds of a
// training step (forward and backward) in eval_step, of the forward in infer.
// The choice is recorded per module in the module's `sd.peft` ("strategies").
#include "sd/format/training_abi.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"

namespace sd {
#define GEN_PASS_DEF_OSFTSTRATEGY
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct OsftCost {
  double factored, dense;
};

// rows: tokens through the layer; out x in: W; k, r: high and low ranks.
OsftCost osftCost(double rows, double out, double in, double k, double r, bool training) {
  double rank = k + r;
  if (!training) return {rows * rank * (out + in), out * in * rank + rows * out * in};
  // Forward through both halves, then the input gradient (both halves) and
  // the low factors' gradients from the recomputed projections.
  double factored = rows * rank * (out + in) + rows * (rank * out + rank * in + 2 * r * in + r * out);
  // Rebuild W, three GEMMs on it (forward, input and weight gradients), and
  // the weight gradient mapped to the low factors.
  double dense = out * in * rank + 3 * rows * out * in + 2 * out * in * r;
  return {factored, dense};
}

struct OsftStrategyPass : sd::impl::OsftStrategyBase<OsftStrategyPass> {
  using OsftStrategyBase::OsftStrategyBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (strategy != "auto" && strategy != "factored" && strategy != "dense") {
      module.emitError() << "--osft-strategy takes auto, factored or dense, got '" << strategy << "'";
      return signalPassFailure();
    }
    std::map<std::string, std::string> chosen;
    for (auto f : module.getOps<func::FuncOp>()) {
      if (!sd::isEntry(f)) continue;
      bool training = f->getAttrOfType<StringAttr>("sd.entry").getValue() == sd::abi::kEvalStep;
      SmallVector<OsftLinearOp> ops;
      f.walk([&](OsftLinearOp op) { ops.push_back(op); });
      for (OsftLinearOp op : ops) {
        ArrayRef<int64_t> xs = shapeOf(op.getInput()), us = shapeOf(op->getOperand(1)), ls = shapeOf(op->getOperand(4));
        double rows = 1;
        for (size_t i = 0; i + 1 < xs.size(); ++i) rows *= double(xs[i]);
        OsftCost c = osftCost(rows, double(us[0]), double(xs.back()), double(us[1]), double(ls[1]), training);
        bool dense = strategy == "dense" || (strategy == "auto" && c.dense < c.factored);
        std::string &note = chosen[op.getModule().str()];
        if (training || note.empty()) note = dense ? "dense" : "factored";
        if (dense && failed(rewriteDense(op))) return signalPassFailure();
      }
    }
    auto dict = module->getAttrOfType<DictionaryAttr>("sd.peft");
    auto mods = dict ? dict.getAs<ArrayAttr>("modules") : ArrayAttr();
    if (!mods) return;
    Builder b(module.getContext());
    SmallVector<Attribute> strategies;
    for (Attribute m : mods) {
      auto it = chosen.find(cast<StringAttr>(m).str());
      strategies.push_back(b.getStringAttr(it == chosen.end() ? "unused" : it->second));
    }
    NamedAttrList attrs(dict);
    attrs.set("strategies", b.getArrayAttr(strategies));
    module->setAttr("sd.peft", attrs.getDictionary(module.getContext()));
  }

  LogicalResult rewriteDense(OsftLinearOp op) {
    OpBuilder b(op);
    GradBuilder g(b, op.getLoc());
    SmallVector<Value> factors;
    for (unsigned i = 1; i <= 6; ++i) factors.push_back(op->getOperand(i));
    Value w = g.make<OsftComposeOp>(factors);
    Value bias = op->getNumOperands() > 7 ? op->getOperand(7) : g.none();
    Value y = g.make<LinearOp>({op.getInput(), w, bias}, {b.getNamedAttr("layout", b.getStringAttr("oi")),
                                                         b.getNamedAttr("module", op.getModuleAttr())});
    if (g.failed()) return op.emitError("the dense OSFT strategy does not fit module '") << op.getModule() << "'";
    op.getOutput().replaceAllUsesWith(y);
    op.erase();
    return success();
  }
};

} // namespace
