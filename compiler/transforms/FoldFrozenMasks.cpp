// sd-fold-frozen-masks: a bool tensor computed only from constants and frozen
// weights becomes a constant. The case it is for: a causal mask registered as
// a buffer (GPT-2's `attn.bias`, nanoGPT's `mask`), exported as a weight and
// cut to the sequence length on every step (Slice, Slice, Equal 0). Folded,
// sd-fuse-attention's kernels see the mask's values when the plan is
// prepared: the CPU kernel skips the masked blocks, the CUDA kernel runs
// cuDNN's causal attention instead of reading a bias per step, and the
// masks of all layers share one constant. Float values are never folded
// (that would copy weights into the plan); only what ends in bools is. A
// weight nothing reads once its masks are folded leaves the plan.
// Runs once shapes are specialized, before sd-fuse-attention's second run.
#include "GlobalData.h"
#include "KernelFold.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/StringSet.h"

namespace sd {
#define GEN_PASS_DEF_FOLDFROZENMASKS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// The largest value one fold step may make (a 1024 x 1024 f32 mask cut from
// a larger buffer is 4 MiB); a larger one leaves the mask unfolded.
constexpr int64_t kMaxFoldBytes = int64_t(64) << 20;

bool isBoolTensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getElementType().isInteger(1) && t.hasStaticShape();
}

struct FoldFrozenMasksPass : sd::impl::FoldFrozenMasksBase<FoldFrozenMasksPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    for (auto f : module.getOps<func::FuncOp>())
      if (failed(foldIn(module, f))) return signalPassFailure();
    // A weight only its masks read leaves the plan with them (GPT-2's twelve
    // 1024 x 1024 f32 buffers: 48 MiB of weights file and device memory).
    for (GlobalOp g : llvm::make_early_inc_range(module.getOps<GlobalOp>()))
      if (readers.count(g.getSymName()) && SymbolTable::symbolKnownUseEmpty(g, module)) g.erase();
  }

  llvm::StringSet<> readers; // the weights a folded mask was computed from

  LogicalResult foldIn(ModuleOp module, func::FuncOp f) {
    if (f.getBody().empty()) return success();
    Block &body = f.getBody().front();
    // Values the compiler knows: constants, frozen weights with a value, and
    // results of region-free kernels over known operands.
    DenseSet<Value> known;
    for (Operation &op : body) {
      if (auto load = dyn_cast<GlobalLoadOp>(op)) {
        auto g = dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, load.getGlobal()));
        if (g && sd::hasFrozenValue(g)) known.insert(load.getResult());
      } else if (isa<ConstantOp, NoneOp>(op)) {
        known.insert(op.getResult(0));
      } else if (isa<ComputeOpInterface>(op) && !op.getNumRegions() && op.getNumOperands() &&
                 llvm::all_of(op.getOperands(), [&](Value v) { return known.contains(v); })) {
        for (Value r : op.getResults()) known.insert(r);
      }
    }
    // The bools where known values meet run-time ones: each is folded whole.
    SmallVector<Value> frontier;
    for (Operation &op : body) {
      if (isa<ConstantOp>(op)) continue;
      for (Value r : op.getResults())
        if (known.contains(r) && isBoolTensor(r) && llvm::any_of(r.getUsers(), [&](Operation *u) {
              return u->getNumResults() == 0 || !known.contains(u->getResult(0));
            }))
          frontier.push_back(r);
    }
    for (Value mask : frontier)
      if (failed(fold(module, mask, known))) return failure();
    // The original chains and the folds' intermediates, now unread.
    SmallVector<Operation *> ops;
    for (Operation &op : body) ops.push_back(&op);
    for (Operation *op : llvm::reverse(ops))
      if (isOpTriviallyDead(op) || (isa<GlobalLoadOp>(op) && op->use_empty() && readers.count(cast<GlobalLoadOp>(op).getGlobal())))
        op->erase();
    return success();
  }

  // Evaluates `mask` by running the CPU kernels of a copy of the ops it
  // depends on (its frozen weights read as constants) and replaces its uses
  // with the result. Leaves it as it was when some step does not fold.
  LogicalResult fold(ModuleOp module, Value mask, const DenseSet<Value> &known) {
    Operation *def = mask.getDefiningOp();
    SetVector<Operation *> slice;
    SmallVector<Operation *> work = {def};
    while (!work.empty()) {
      Operation *op = work.pop_back_val();
      if (!slice.insert(op)) continue;
      if (isa<GlobalLoadOp>(op)) continue;
      for (Value v : op->getOperands())
        if (Operation *d = v.getDefiningOp(); d && known.contains(v)) work.push_back(d);
    }
    SmallVector<Operation *> order(slice.begin(), slice.end());
    llvm::sort(order, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    OpBuilder b(def->getContext());
    b.setInsertionPointAfter(def);
    IRMapping values;
    for (Operation *op : order) {
      if (isa<ConstantOp, NoneOp>(op)) continue; // used as they are
      if (auto load = dyn_cast<GlobalLoadOp>(op)) {
        auto g = cast<GlobalOp>(SymbolTable::lookupSymbolIn(module, load.getGlobal()));
        auto value = cast<ElementsAttr>(*g.getInitialValue());
        values.map(load.getResult(), b.create<ConstantOp>(op->getLoc(), load.getType(), value).getResult());
        continue;
      }
      Operation *copy = b.clone(*op, values);
      SmallVector<Value> folded;
      if (failed(sd::foldWithKernels(copy, kMaxFoldBytes, &folded))) return failure();
      copy->erase();
      if (folded.size() != op->getNumResults()) return success(); // too large, or no kernel: stays as it is
      for (auto [r, c] : llvm::zip(op->getResults(), folded)) {
        if (c.getType() != r.getType()) return success();
        values.map(r, c);
      }
    }
    mask.replaceAllUsesWith(values.lookup(mask));
    for (Operation *op : order)
      if (auto load = dyn_cast<GlobalLoadOp>(op)) readers.insert(load.getGlobal());
    return success();
  }
};

} // namespace
