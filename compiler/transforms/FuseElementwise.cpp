// sd-fuse-elementwise: a chain of f32 elementwise steps (Add, Sub, Mul, Div,
// Neg, Relu, Sigmoid, Tanh, Exp, Gelu, GeluGrad, and Relu's gradient as its
// VJP writes it, Where(Greater(x, 0), dy, 0), with the Greater's mask) whose
// intermediates have no
// other reader becomes one sd.fused_elementwise, so the chain reads its
// operands and writes its result once instead of making a round trip through
// memory per step (a LoRA branch's scaling and sum, residual sums, a GELU
// after a LoRA-adapted Linear, gradient accumulation). Every operand must have the
// result's shape or be a single element. In autocast plans the chain also
// takes in the Casts around it: a bf16/f16 value widened to f32 becomes a
// half operand (widening is exact; a widening several chains read is taken
// into each, and so is arithmetic on at most two half values that only
// chains read: each computes it again), and a Cast of the result to bf16/f16
// becomes the step's result type (rounded as Cast rounds). Each backend runs
// every op with its unfused kernel's function, so the fused step computes the
// unfused steps' bits (sd/ops/fused_elementwise.h). Runs last among the
// model-level passes, after sd-fuse-gemm-epilogues has taken the GELUs a
// GEMM can apply.
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"
#include "sd/ops/fused_elementwise.h"
#include "llvm/ADT/SetVector.h"
#include <cmath>

namespace sd {
#define GEN_PASS_DEF_FUSEELEMENTWISE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// An f32 constant +0.0 (a -0.0 filler would make the fused step's zeros differ in sign).
bool isZeroScalar(Value v) {
  std::optional<double> z = sd::scalarValue(v);
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return z && *z == 0 && !std::signbit(*z) && t && t.getElementType().isF32();
}

// Relu's gradient, Where(Greater(x, 0), dy, 0), its mask read by this Where
// alone: one ReluGrad instruction on (dy, x), the mask never written.
bool isReluGrad(Operation *op) {
  auto where = dyn_cast<WhereOp>(op);
  if (!where || !isZeroScalar(where->getOperand(2))) return false;
  auto greater = where->getOperand(0).getDefiningOp<GreaterOp>();
  return greater && where->getOperand(0).hasOneUse() && isZeroScalar(greater->getOperand(1));
}

// The values an instruction reads: ReluGrad's (dy, x), else the op's operands.
SmallVector<Value> instructionOperands(Operation *op) {
  if (isReluGrad(op)) return {op->getOperand(1), op->getOperand(0).getDefiningOp()->getOperand(0)};
  return SmallVector<Value>(op->getOperands());
}

std::optional<sd::ElementwiseOpcode> opcodeOf(Operation *op) {
  using Op = sd::ElementwiseOpcode;
  if (isReluGrad(op)) return Op::ReluGrad;
  auto tanhForm = [&] {
    auto a = op->getAttrOfType<StringAttr>("approximate");
    return a && a.getValue() == "tanh";
  };
  if (isa<AddOp>(op)) return Op::Add;
  if (isa<SubOp>(op)) return Op::Sub;
  if (isa<MulOp>(op)) return Op::Mul;
  if (isa<DivOp>(op)) return Op::Div;
  if (isa<NegOp>(op)) return Op::Neg;
  if (isa<ReluOp>(op)) return Op::Relu;
  if (isa<SigmoidOp>(op)) return Op::Sigmoid;
  if (isa<TanhOp>(op)) return Op::Tanh;
  if (isa<ExpOp>(op)) return Op::Exp;
  if (isa<GeluOp>(op)) return tanhForm() ? Op::GeluTanh : Op::GeluErf;
  if (isa<GeluGradOp>(op)) return tanhForm() ? Op::GeluTanhGrad : Op::GeluErfGrad;
  return std::nullopt;
}

RankedTensorType staticTensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.hasStaticShape() ? t : RankedTensorType();
}

bool isF32Static(Value v) {
  RankedTensorType t = staticTensor(v);
  return t && t.getElementType().isF32();
}

bool isHalfStatic(Value v) {
  RankedTensorType t = staticTensor(v);
  return t && (t.getElementType().isBF16() || t.getElementType().isF16());
}

// An arithmetic op the fused step computes: f32, its operands the result's
// shape or one element.
bool isArithmetic(Operation *op) {
  if (!opcodeOf(op) || op->getNumResults() != 1 || !isF32Static(op->getResult(0))) return false;
  auto type = cast<RankedTensorType>(op->getResult(0).getType());
  for (Value v : instructionOperands(op)) {
    if (!isF32Static(v)) return false;
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getNumElements() != 1 && t.getShape() != type.getShape()) return false;
  }
  return true;
}

// A Cast from bf16/f16 to f32 (an operand loaded as half), or from f32 to
// bf16/f16 (the result stored as half).
bool isWidening(Operation *op) {
  auto c = dyn_cast<CastOp>(op);
  return c && isHalfStatic(c.getInput()) && isF32Static(c.getResult());
}
bool isNarrowing(Operation *op) {
  auto c = dyn_cast<CastOp>(op);
  return c && isF32Static(c.getInput()) && isHalfStatic(c.getResult());
}

// Whether each chain that reads `v` may compute it again instead: `v` is
// arithmetic on at most two half values (and single elements), so a reader
// loads no more bytes than the f32 value has, and every reader is a step a
// chain starts from, so the f32 value is never written (LoRA's sum of the
// base and the scaled adapter product, read by the forward's GELU and by its
// gradient in the backward). Each chain computes it with the same functions
// on the same operands: the same bits.
bool recomputedByEveryReader(Value v) {
  Operation *producer = v.getDefiningOp();
  if (!producer || !isArithmetic(producer)) return false;
  for (Operation *user : v.getUsers())
    if (user->getBlock() != producer->getBlock() || !(isArithmetic(user) || isNarrowing(user))) return false;
  SmallVector<Value> work{v};
  DenseSet<Value> halves;
  int ops = 0;
  while (!work.empty()) {
    Value x = work.pop_back_val();
    if (RankedTensorType t = staticTensor(x); t && t.getNumElements() == 1) continue;
    Operation *def = x.getDefiningOp();
    if (def && isWidening(def)) {
      halves.insert(def->getOperand(0));
      continue;
    }
    if (!def || !isArithmetic(def) || ++ops > 4) return false;
    for (Value operand : instructionOperands(def)) work.push_back(operand);
  }
  return halves.size() <= 2;
}

// Whether a global that `def` reads is stored between `def` and `root`: the
// fused step computes at `root`, where the load's buffer already holds the
// stored value (the optimizer's zeroed gradient, written in place).
bool storedBefore(Operation *def, Operation *root) {
  SmallVector<StringRef> globals;
  for (Value v : def->getOperands())
    if (auto load = v.getDefiningOp<GlobalLoadOp>()) globals.push_back(load.getGlobal());
  if (globals.empty()) return false;
  for (Operation *op = def->getNextNode(); op && op != root; op = op->getNextNode())
    if (auto store = dyn_cast<GlobalStoreOp>(op); store && llvm::is_contained(globals, store.getGlobal())) return true;
  return false;
}

struct FuseElementwisePass : sd::impl::FuseElementwiseBase<FuseElementwisePass> {
  void runOnOperation() override {
    SmallVector<Operation *> roots;
    getOperation().walk([&](Operation *op) {
      if (isArithmetic(op) || isNarrowing(op)) roots.push_back(op);
    });
    DenseSet<Operation *> absorbed;
    for (Operation *root : llvm::reverse(roots))
      if (!absorbed.contains(root) && !fuseFrom(root, absorbed, /*recompute=*/true)) fuseFrom(root, absorbed, false);
  }

  // Grows the chain that ends at `root` backwards through operands that only
  // the chain reads (or, with `recompute`, that every reader computes again),
  // then replaces it when it holds two steps or more. False when the chain
  // needs more operands than a fused step takes.
  bool fuseFrom(Operation *root, DenseSet<Operation *> &absorbed, bool recompute) {
    auto shape = cast<RankedTensorType>(root->getResult(0).getType()).getShape();
    llvm::SetVector<Operation *> chain;
    chain.insert(root);
    auto onlyChainReads = [&](Value v) { return llvm::all_of(v.getUsers(), [&](Operation *u) { return chain.contains(u); }); };
    // A widening cast joins even when other steps read it too: it is exact
    // and free where the chain loads the half value, so each chain widens
    // for itself and the f32 copy goes once nothing else reads it (a GELU
    // and, in the backward, its gradient read a bf16 product at 2 bytes an
    // element instead of a widened copy written and read at 4).
    auto joins = [&](Operation *def, Value v) {
      return def && !chain.contains(def) && !absorbed.contains(def) && def->getBlock() == root->getBlock() &&
             cast<RankedTensorType>(v.getType()).getShape() == shape && !storedBefore(def, root) &&
             (onlyChainReads(v) || isWidening(def) || (recompute && recomputedByEveryReader(v)));
    };
    for (size_t i = 0; i < chain.size() && chain.size() < size_t(sd::kMaxFusedInstructions); ++i) {
      if (isWidening(chain[i])) continue; // its operand is the half value itself
      for (Value v : instructionOperands(chain[i])) {
        Operation *def = v.getDefiningOp();
        // A narrowing root takes an arithmetic op; an arithmetic op takes
        // arithmetic ops and widening casts.
        bool fits = isNarrowing(chain[i]) ? def && isArithmetic(def) : def && (isArithmetic(def) || isWidening(def));
        if (fits && joins(def, v) && chain.size() < size_t(sd::kMaxFusedInstructions)) chain.insert(def);
      }
    }
    int64_t arithmetic = llvm::count_if(chain, [](Operation *op) { return opcodeOf(op).has_value(); });
    // A lone ReluGrad still saves its mask's round trip through memory.
    if ((chain.size() < 2 && !isReluGrad(root)) || arithmetic == 0) return true;
    SmallVector<Operation *> steps(chain.begin(), chain.end());
    llvm::sort(steps, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    // Operands from outside the chain in first-use order (a widening cast's
    // half operand stands for its f32 result), then the program.
    llvm::SetVector<Value> inputs;
    for (Operation *op : steps)
      if (opcodeOf(op) || isWidening(op))
        for (Value v : instructionOperands(op))
          if (!chain.contains(v.getDefiningOp())) inputs.insert(v);
    if (inputs.size() > size_t(sd::kMaxFusedInputs)) return false;
    DenseMap<Value, int64_t> valueIndex;
    for (auto [i, v] : llvm::enumerate(inputs)) valueIndex[v] = int64_t(i);
    SmallVector<int64_t> program;
    for (Operation *op : steps) {
      if (isWidening(op)) {
        valueIndex[op->getResult(0)] = valueIndex[op->getOperand(0)];
      } else if (auto code = opcodeOf(op)) {
        SmallVector<Value> reads = instructionOperands(op);
        int64_t lhs = valueIndex[reads[0]], rhs = reads.size() > 1 ? valueIndex[reads[1]] : lhs;
        program.append({int64_t(*code), lhs, rhs});
        valueIndex[op->getResult(0)] = int64_t(inputs.size()) + int64_t(program.size() / 3) - 1;
      }
    }
    OpBuilder b(root);
    SmallVector<Location> locs;
    for (Operation *op : steps) locs.push_back(op->getLoc());
    OperationState st(FusedLoc::get(b.getContext(), locs), FusedElementwiseOp::getOperationName());
    st.addOperands(inputs.getArrayRef());
    st.addAttribute("program", b.getDenseI64ArrayAttr(program));
    if (isNarrowing(root)) st.addAttribute("to", root->getAttr("to"));
    st.addTypes(root->getResult(0).getType());
    Operation *fused = b.create(st);
    root->getResult(0).replaceAllUsesWith(fused->getResult(0));
    for (Operation *op : llvm::reverse(steps)) {
      if (!op->use_empty()) continue; // a widening other steps still read; a later chain may take it too
      Operation *mask = isReluGrad(op) ? op->getOperand(0).getDefiningOp() : nullptr;
      absorbed.insert(op);
      op->erase();
      if (mask) {
        absorbed.insert(mask);
        mask->erase();
      }
    }
    return true;
  }
};

} // namespace
