// sd-form-linear: MatMul/Gemm against a weight global (+ bias) -> sd.linear.
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_FORMLINEAR
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// PyTorch's eval-mode exporter keeps one initializer per distinct value and
// reads the duplicates through Identity nodes (all-zero biases, tied weights).
Value skipIdentities(Value v) {
  while (auto id = v.getDefiningOp<IdentityOp>()) v = id->getOperand(0);
  return v;
}

// A 2-D weight read straight from a global, possibly through a 2-D transpose.
struct WeightRef {
  Value weight; // the global_load result
  bool transposed = false;
  StringRef global;
};

std::optional<WeightRef> matchWeight(Value v) {
  WeightRef r;
  v = skipIdentities(v);
  if (auto t = v.getDefiningOp<TransposeOp>()) {
    auto perm = t.getPerm();
    if (perm && (perm->size() != 2 || (*perm)[0] != 1 || (*perm)[1] != 0)) return std::nullopt;
    r.transposed = true;
    v = skipIdentities(t.getInput());
  }
  auto load = v.getDefiningOp<GlobalLoadOp>();
  auto type = dyn_cast<RankedTensorType>(v.getType());
  if (!load || !type || type.getRank() != 2) return std::nullopt;
  r.weight = v;
  r.global = load.getGlobal();
  return r;
}

std::optional<Value> matchBias(Value v, int64_t n) {
  v = skipIdentities(v);
  auto load = v.getDefiningOp<GlobalLoadOp>();
  auto type = dyn_cast<RankedTensorType>(v.getType());
  if (!load || !type || type.getRank() != 1 || type.getDimSize(0) != n) return std::nullopt;
  return v;
}

// The module is the node scope when the exporter recorded one (the dynamo
// exporter's name_scopes metadata, or the TorchScript exporter's node name
// "/blocks.0/attn/qkv/MatMul" -> "blocks.0.attn.qkv"): that is the name PEFT
// matches, and it stays right for a tied weight ("wte.weight" used as "head")
// and for renamed initializers ("onnx::MatMul_123", "val_0"). Otherwise the
// weight's name without ".weight".
std::string moduleName(StringRef global, Operation *op) {
  if (std::string scope = sd::moduleScopeOf(op->getLoc()); !scope.empty()) return scope;
  std::string node = sd::nodeNameOf(op->getLoc());
  if (!node.empty() && node[0] == '/') {
    StringRef scope = StringRef(node).drop_front().rsplit('/').first;
    if (!scope.empty() && scope != StringRef(node).drop_front()) {
      std::string m = scope.str();
      std::replace(m.begin(), m.end(), '/', '.');
      return m;
    }
  }
  std::string g = global.str();
  for (const char *suffix : {".weight", "_weight", ".w"})
    if (StringRef(g).ends_with(suffix)) return g.substr(0, g.size() - strlen(suffix));
  return g;
}

struct FormLinearPass : sd::impl::FormLinearBase<FormLinearPass> {
  void runOnOperation() override {
    SmallVector<Operation *> candidates;
    getOperation().walk([&](Operation *op) {
      if (isa<MatMulOp, GemmOp>(op)) candidates.push_back(op);
    });
    for (Operation *op : candidates) {
      if (auto mm = dyn_cast<MatMulOp>(op)) rewriteMatMul(mm);
      else rewriteGemm(cast<GemmOp>(op));
    }
  }

  void rewriteMatMul(MatMulOp mm) {
    auto w = matchWeight(mm.getRhs());
    auto xType = dyn_cast<RankedTensorType>(mm.getLhs().getType());
    if (!w || !xType || xType.getRank() < 1) return;
    auto wType = cast<RankedTensorType>(w->weight.getType());
    int64_t n = w->transposed ? wType.getDimSize(0) : wType.getDimSize(1);
    Value bias;
    Operation *replaced = mm;
    // Fold a following bias add when the matmul feeds only it.
    if (mm->hasOneUse()) {
      if (auto add = dyn_cast<AddOp>(*mm->user_begin())) {
        Value other = add.getLhs() == mm.getResult() ? add.getRhs() : add.getLhs();
        if (auto b = matchBias(other, n); b && add.getType() == mm.getType()) {
          bias = *b;
          replaced = add;
        }
      }
    }
    build(mm, replaced, mm.getLhs(), *w, bias);
  }

  void rewriteGemm(GemmOp g) {
    if (g.getTransA().value_or(0) != 0) return;
    if (g.getAlpha() && g.getAlpha()->convertToDouble() != 1.0) return;
    if (g.getBeta() && g.getBeta()->convertToDouble() != 1.0) return;
    auto w = matchWeight(g.getB());
    if (!w) return;
    bool oi = g.getTransB().value_or(0) != 0;
    if (w->transposed) return; // Gemm of a transposed weight is rare; keep it
    w->transposed = oi;
    auto wType = cast<RankedTensorType>(w->weight.getType());
    int64_t n = oi ? wType.getDimSize(0) : wType.getDimSize(1);
    Value bias;
    if (!isa<NoneType>(g.getC().getType())) {
      auto b = matchBias(g.getC(), n);
      if (!b) return;
      bias = *b;
    }
    build(g, g, g.getA(), *w, bias);
  }

  void build(Operation *anchor, Operation *replaced, Value x, const WeightRef &w, Value bias) {
    OpBuilder b(replaced);
    if (!bias) bias = b.create<NoneOp>(anchor->getLoc(), b.getNoneType());
    std::string module = moduleName(w.global, anchor);
    auto linear = b.create<LinearOp>(
        anchor->getLoc(), replaced->getResult(0).getType(), x, w.weight, bias,
        b.getStringAttr(w.transposed ? "oi" : "io"), b.getStringAttr(module));
    replaced->getResult(0).replaceAllUsesWith(linear.getResult());
    if (replaced != anchor) replaced->erase();
    // Which ONNX node input reads the weight global (through any transpose or
    // identity): sdc merge rewires it when it unties a shared weight to fold
    // an adapter into this use only.
    Operation *consumer = anchor, *transpose = anchor->getOperand(1).getDefiningOp<TransposeOp>();
    int64_t input = 1;
    for (Operation *op = anchor->getOperand(1).getDefiningOp(); op && isa<TransposeOp, IdentityOp>(op);
         op = op->getOperand(0).getDefiningOp())
      consumer = op, input = 0;
    linear->setAttr("sd.weight_node", b.getStringAttr(sd::nodeNameOf(consumer->getLoc())));
    linear->setAttr("sd.weight_input", b.getI64IntegerAttr(input));
    anchor->erase();
    if (transpose && transpose->use_empty()) transpose->erase();
  }
};

} // namespace
