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
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/StringSet.h"
#include <limits>

namespace sd {
#define GEN_PASS_DEF_FOLDFROZENMASKS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// The largest value one fold step may make (a 1024 x 1024 f32 mask cut from
// a larger buffer is 4 MiB); a larger one leaves the mask unfolded. The
// weight it is cut from may be any size (it is read, not copied).
constexpr int64_t kMaxFoldBytes = int64_t(64) << 20;
constexpr int64_t kAnyWeight = std::numeric_limits<int64_t>::max();

bool isBoolTensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getElementType().isInteger(1) && t.hasStaticShape();
}

struct FoldFrozenMasksPass : sd::impl::FoldFrozenMasksBase<FoldFrozenMasksPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    llvm::StringSet<> readers; // the weights only folded masks read
    for (auto f : module.getOps<func::FuncOp>())
      if (!f.getBody().empty()) foldIn(f.getBody().front(), readers);
    // A weight only its masks read leaves the plan with them (GPT-2's twelve
    // 1024 x 1024 f32 buffers: 48 MiB of weights file and device memory).
    for (GlobalOp g : llvm::make_early_inc_range(module.getOps<GlobalOp>()))
      if (readers.count(g.getSymName()) && SymbolTable::symbolKnownUseEmpty(g, module)) g.erase();
  }

  void foldIn(Block &body, llvm::StringSet<> &readers) {
    // Values the compiler knows: constants, frozen weights with a value, and
    // results of region-free kernels over known operands.
    DenseSet<Value> known;
    SmallVector<GlobalLoadOp> liveLoads;
    for (Operation &op : body) {
      if (auto load = dyn_cast<GlobalLoadOp>(op)) {
        if (sd::frozenGlobalOf(load.getResult())) known.insert(load.getResult());
        if (!load->use_empty()) liveLoads.push_back(load);
      } else if (isa<ConstantOp, NoneOp>(op)) {
        known.insert(op.getResult(0));
      } else if (isa<ComputeOpInterface>(op) && !op.getNumRegions() && op.getNumOperands() &&
                 llvm::all_of(op.getOperands(), [&](Value v) { return known.contains(v); })) {
        for (Value r : op.getResults()) known.insert(r);
      }
    }
    // The bools where known values meet run-time ones: each is folded whole
    // (left as it is when a step does not fold or is too large).
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
      if (DenseElementsAttr value = sd::foldFromFrozenWeights(mask, kAnyWeight, kMaxFoldBytes)) {
        OpBuilder b(mask.getContext());
        b.setInsertionPointAfterValue(mask);
        mask.replaceAllUsesWith(b.create<ConstantOp>(mask.getLoc(), mask.getType(), value).getResult());
      }
    // The original chains, now unread, and the weight loads only they read.
    SmallVector<Operation *> ops;
    for (Operation &op : body) ops.push_back(&op);
    for (Operation *op : llvm::reverse(ops))
      if (isOpTriviallyDead(op)) op->erase();
    for (GlobalLoadOp load : liveLoads)
      if (load->use_empty()) {
        readers.insert(load.getGlobal());
        load->erase();
      }
  }
};

} // namespace
