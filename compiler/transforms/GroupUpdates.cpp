// sd-group-updates: the AdamW updates of one optimizer step become
// GroupedAdamW steps, up to kMaxGroupedTensors tensors each.
//
// sd-optimizer emits one AdamW per trainable tensor, all reading the same
// step counter, lr, weight decay, gradient factor and skip flag. A LoRA plan
// has a hundred small tensors or so: as many launches on a GPU, each too
// small to fill it (PyTorch's AdamW groups them likewise, its foreach
// implementation). The grouped step updates every element as its AdamW
// would: the same bits.
//
// A run of AdamWs groups when nothing but the global loads that feed them
// and the stores of their results lies between them, and they share their
// scalar operands and hyper-parameters. The group takes the last update's
// place; the stores of the earlier ones move after it (no load between
// reads what they store). Updates tagged for sharding (shard_param) and
// plans with row-sharded state keep their own steps.
#include "PassDetail.h"
#include "Passes.h"
#include "sd/ops/math/optimizer.h"
#include "llvm/ADT/StringSet.h"

namespace sd {
#define GEN_PASS_DEF_GROUPUPDATES
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

bool isStaticF32(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.hasStaticShape() && t.getElementType().isF32();
}

// An update that may join a group: f32 tensors, no attribute beyond the
// hyper-parameters, every result only stored to a global of this block.
bool groupable(AdamWOp op) {
  for (NamedAttribute a : op->getAttrs())
    if (!llvm::is_contained({"beta1", "beta2", "epsilon", "decay"}, a.getName().getValue())) return false;
  for (unsigned i = 0; i < 4; ++i)
    if (!isStaticF32(op->getOperand(i))) return false;
  for (Value r : op->getResults())
    for (Operation *u : r.getUsers())
      if (!isa<GlobalStoreOp>(u) || u->getBlock() != op->getBlock()) return false;
  return true;
}

// Same scalar operands (step, lr, weight_decay, grad_scale, skip) and hyper-parameters.
bool sameStep(AdamWOp a, AdamWOp b) {
  if (a->getNumOperands() != b->getNumOperands()) return false;
  for (unsigned i = 4; i < a->getNumOperands(); ++i)
    if (a->getOperand(i) != b->getOperand(i)) return false;
  for (StringRef name : {"beta1", "beta2", "epsilon"})
    if (a->getAttr(name) != b->getAttr(name)) return false;
  return true;
}

struct GroupUpdatesPass : sd::impl::GroupUpdatesBase<GroupUpdatesPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (module->hasAttr("sd.row_sharded")) return;
    for (auto f : module.getOps<func::FuncOp>())
      if (sd::isEntry(f)) groupBlock(f.getBody().front());
  }

  void groupBlock(Block &block) {
    SmallVector<AdamWOp> run;
    llvm::StringSet<> stored; // globals the run's earlier updates store: no load between may read them
    auto flush = [&] {
      if (run.size() > 1) group(run);
      run.clear();
      stored.clear();
    };
    for (Operation &op : llvm::make_early_inc_range(block)) {
      if (auto u = dyn_cast<AdamWOp>(op); u && groupable(u)) {
        if (!run.empty() && (!sameStep(run.front(), u) || run.size() == sd::math::kMaxGroupedTensors)) flush();
        run.push_back(u);
        for (Value r : u->getResults())
          for (Operation *s : r.getUsers()) stored.insert(cast<GlobalStoreOp>(s).getGlobal());
        continue;
      }
      if (run.empty()) continue;
      if (auto load = dyn_cast<GlobalLoadOp>(op); load && !stored.contains(load.getGlobal())) continue;
      if (auto store = dyn_cast<GlobalStoreOp>(op))
        if (auto def = store.getValue().getDefiningOp<AdamWOp>(); def && llvm::is_contained(run, def)) continue;
      flush();
    }
    flush();
  }

  void group(ArrayRef<AdamWOp> run) {
    AdamWOp last = run.back();
    const size_t n = run.size();
    SmallVector<Value> operands(last->getOperands().drop_front(4));
    OpBuilder b(last);
    if (operands.size() == 4) operands.push_back(b.create<NoneOp>(last.getLoc(), b.getNoneType()));
    SmallVector<Type> types(4 * n);
    SmallVector<int64_t> decay;
    for (unsigned k = 0; k < 4; ++k) // params, grads, exp_avgs, exp_avg_sqs
      for (AdamWOp u : run) operands.push_back(u->getOperand(k));
    for (size_t i = 0; i < n; ++i) {
      AdamWOp u = run[i];
      for (unsigned k = 0; k < 4; ++k) types[k * n + i] = u->getResult(k).getType(); // params, m, v, grads
      decay.push_back(u.getDecay().value_or(1));
    }
    SmallVector<NamedAttribute> attrs;
    for (StringRef name : {"beta1", "beta2", "epsilon"})
      if (Attribute a = last->getAttr(name)) attrs.push_back(b.getNamedAttr(name, a));
    attrs.push_back(b.getNamedAttr("decay", b.getDenseI64ArrayAttr(decay)));
    auto grouped = b.create<GroupedAdamWOp>(last.getLoc(), types, operands, attrs);
    // The earlier updates' stores, in order, after the group.
    Operation *after = grouped;
    for (Operation *op = run.front(); op != grouped.getOperation(); op = op->getNextNode())
      if (auto s = dyn_cast<GlobalStoreOp>(op); s && s.getValue().getDefiningOp<AdamWOp>()) {
        op = op->getPrevNode();
        s->moveAfter(after);
        after = s;
      }
    for (size_t i = 0; i < n; ++i) {
      AdamWOp u = run[i];
      for (unsigned k = 0; k < 4; ++k) u->getResult(k).replaceAllUsesWith(grouped->getResult(k * n + i));
      u->erase();
    }
  }
};

} // namespace
