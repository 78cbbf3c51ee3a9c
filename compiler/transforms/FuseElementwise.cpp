// sd-fuse-elementwise: a chain of f32 Add, Sub, Mul, Div and Neg steps whose
// intermediates have no other reader becomes one sd.fused_elementwise, so
// the chain reads its operands and writes its result once instead of making
// a round trip through memory per step (a LoRA branch's scaling and sum,
// residual sums, gradient accumulation). Every operand must have the
// result's shape or be a single element. These operations round exactly, so
// the fused step computes the unfused steps' bits (sd/ops/fused_elementwise.h).
// Runs last among the model-level passes, on every entry.
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"
#include "sd/ops/fused_elementwise.h"
#include "llvm/ADT/SetVector.h"

namespace sd {
#define GEN_PASS_DEF_FUSEELEMENTWISE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

std::optional<sd::ElementwiseOpcode> opcodeOf(Operation *op) {
  if (isa<AddOp>(op)) return sd::ElementwiseOpcode::Add;
  if (isa<SubOp>(op)) return sd::ElementwiseOpcode::Sub;
  if (isa<MulOp>(op)) return sd::ElementwiseOpcode::Mul;
  if (isa<DivOp>(op)) return sd::ElementwiseOpcode::Div;
  if (isa<NegOp>(op)) return sd::ElementwiseOpcode::Neg;
  return std::nullopt;
}

bool isF32Static(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.hasStaticShape() && t.getElementType().isF32();
}

// An op the fused step can compute: its operands are the result's shape or one element.
bool fusable(Operation *op) {
  if (!opcodeOf(op) || op->getNumResults() != 1 || !isF32Static(op->getResult(0))) return false;
  auto type = cast<RankedTensorType>(op->getResult(0).getType());
  for (Value v : op->getOperands()) {
    if (!isF32Static(v)) return false;
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getNumElements() != 1 && t.getShape() != type.getShape()) return false;
  }
  return true;
}

struct FuseElementwisePass : sd::impl::FuseElementwiseBase<FuseElementwisePass> {
  void runOnOperation() override {
    SmallVector<Operation *> roots;
    getOperation().walk([&](Operation *op) {
      if (fusable(op)) roots.push_back(op);
    });
    DenseSet<Operation *> absorbed;
    for (Operation *root : llvm::reverse(roots))
      if (!absorbed.contains(root)) fuseFrom(root, absorbed);
  }

  // Grows the chain that ends at `root` backwards through operands that only
  // the chain reads, then replaces it when it holds two steps or more.
  void fuseFrom(Operation *root, DenseSet<Operation *> &absorbed) {
    auto shape = cast<RankedTensorType>(root->getResult(0).getType()).getShape();
    llvm::SetVector<Operation *> chain;
    chain.insert(root);
    for (size_t i = 0; i < chain.size() && chain.size() < size_t(sd::kMaxFusedInstructions); ++i) {
      for (Value v : chain[i]->getOperands()) {
        Operation *def = v.getDefiningOp();
        if (!def || chain.contains(def) || absorbed.contains(def) || def->getBlock() != root->getBlock() ||
            !fusable(def) || cast<RankedTensorType>(v.getType()).getShape() != shape)
          continue;
        if (!llvm::all_of(v.getUsers(), [&](Operation *u) { return chain.contains(u); })) continue;
        if (chain.size() < size_t(sd::kMaxFusedInstructions)) chain.insert(def);
      }
    }
    if (chain.size() < 2) return;
    SmallVector<Operation *> steps(chain.begin(), chain.end());
    llvm::sort(steps, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    // Operands from outside the chain, in first-use order, then the program.
    llvm::SetVector<Value> inputs;
    DenseMap<Operation *, int64_t> resultIndex;
    for (Operation *op : steps)
      for (Value v : op->getOperands())
        if (!chain.contains(v.getDefiningOp())) inputs.insert(v);
    if (inputs.size() > size_t(sd::kMaxFusedInputs)) return;
    SmallVector<int64_t> program;
    for (Operation *op : steps) {
      auto index = [&](Value v) -> int64_t {
        if (Operation *def = v.getDefiningOp(); def && chain.contains(def)) return resultIndex[def];
        return int64_t(llvm::find(inputs, v) - inputs.begin());
      };
      int64_t lhs = index(op->getOperand(0)), rhs = op->getNumOperands() > 1 ? index(op->getOperand(1)) : lhs;
      program.append({int64_t(*opcodeOf(op)), lhs, rhs});
      resultIndex[op] = int64_t(inputs.size()) + int64_t(program.size() / 3) - 1;
    }
    OpBuilder b(root);
    SmallVector<Location> locs;
    for (Operation *op : steps) locs.push_back(op->getLoc());
    OperationState st(FusedLoc::get(b.getContext(), locs), FusedElementwiseOp::getOperationName());
    st.addOperands(inputs.getArrayRef());
    st.addAttribute("program", b.getDenseI64ArrayAttr(program));
    st.addTypes(root->getResult(0).getType());
    Operation *fused = b.create(st);
    root->getResult(0).replaceAllUsesWith(fused->getResult(0));
    for (Operation *op : llvm::reverse(steps)) {
      absorbed.insert(op);
      op->erase();
    }
  }
};

} // namespace
