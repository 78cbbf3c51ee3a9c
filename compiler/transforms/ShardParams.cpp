// sd-shard-params (sdc compile --shard params): FSDP-style training, weights
// held as rows split over the ranks (sd::rowBlock, FSDP2's Shard(0)).
//
// Sharded: every float weight that trains (with its gradient and optimizer
// state), and every frozen float weight of two rows or more. Scalars cannot
// be split by rows; a trainable one is refused. A preference recipe's
// reference copy of a sharded parameter (`reference/<name>`) is split as the
// parameter is, so the reference model costs each rank its rows only.
//
// Where the shard is read as it is, the op works on this rank's rows only:
// the optimizer updates (every operand a sharded global of the same rows),
// GradScale (partial squared norms, summed over the ranks: sd-data-parallel
// marks it sharded_grads), and the accumulation of a micro-batch's gradient,
// grad/<p> + delta, which becomes ReduceScatterRows(grad/<p>, delta). Any
// other op gets the whole weight from an AllGatherRows step just before it,
// one per op that reads it: the arena frees the copy after that op, and the
// backward gathers again where it needs the weight, as FSDP does.
//
// The sharded globals are recorded in sd.row_sharded (the plan config's
// row_sharded), so the session allocates rows, not tensors, for them.
#include "PassDetail.h"
#include "Passes.h"
#include "sd/format/row_shard.h"
#include "sd/format/training_abi.h"
#include "llvm/ADT/StringSet.h"

namespace sd {
#define GEN_PASS_DEF_SHARDPARAMS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

bool isFloat(Type t) { return isa<Float32Type, Float16Type, BFloat16Type>(t); }

// True when `user` reads operand `index` as this rank's rows.
bool readsRows(Operation *user, unsigned index) {
  if (isa<AdamWOp>(user)) return index < 4; // param, grad, exp_avg, exp_avg_sq
  if (isa<SGDOp>(user)) return index < 3;   // param, grad, momentum buffer
  if (isa<GradScaleOp>(user)) return index >= 2;
  if (isa<ReduceScatterRowsOp>(user)) return index == 0;
  return false;
}

struct ShardParamsPass : sd::impl::ShardParamsBase<ShardParamsPass> {
  using ShardParamsBase::ShardParamsBase;

  llvm::StringSet<> sharded;

  bool isSharded(Value v) {
    auto load = v.getDefiningOp<GlobalLoadOp>();
    return load && sharded.contains(load.getGlobal());
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<Attribute> names;
    for (GlobalOp g : module.getOps<GlobalOp>()) {
      auto t = dyn_cast<RankedTensorType>(g.getType());
      const bool trainable = g.getRole() == "trainable";
      if (!t || !isFloat(t.getElementType()) || (!trainable && g.getRole() != "frozen")) continue;
      if (trainable && t.getRank() == 0) {
        g.emitError() << "--shard params splits weights by rows, and trainable scalar '" << g.getSymName()
                      << "' has none (use --shard grads)";
        return signalPassFailure();
      }
      if (!trainable && (t.getRank() == 0 || t.getDimSize(0) < 2)) continue;
      SmallVector<std::string> family = {g.getSymName().str()};
      if (trainable)
        for (const char *prefix : {sd::abi::kGradPrefix, sd::abi::kAdamExpAvgPrefix, sd::abi::kAdamExpAvgSqPrefix,
                                   sd::abi::kSgdMomentumPrefix})
          if (SymbolTable::lookupSymbolIn(module, prefix + g.getSymName().str())) family.push_back(prefix + g.getSymName().str());
      for (const std::string &n : family) {
        sharded.insert(n);
        names.push_back(StringAttr::get(module.getContext(), n));
      }
    }
    for (GlobalOp g : module.getOps<GlobalOp>()) {
      StringRef name = g.getSymName();
      if (g.getRole() == "scalar_state" && name.starts_with(sd::abi::kReferencePrefix) &&
          sharded.contains(name.drop_front(StringRef(sd::abi::kReferencePrefix).size()))) {
        sharded.insert(name);
        names.push_back(StringAttr::get(module.getContext(), name));
      }
    }
    for (auto f : module.getOps<func::FuncOp>())
      if (failed(scatterGradients(f)) || failed(gatherReads(f)) || failed(checkUpdates(f))) return signalPassFailure();
    module->setAttr("sd.row_sharded", ArrayAttr::get(module.getContext(), names));
  }

  // grad/<p> = grad/<p> + delta  ->  grad/<p> = ReduceScatterRows(grad/<p>, delta).
  LogicalResult scatterGradients(func::FuncOp f) {
    SmallVector<GlobalStoreOp> stores;
    f.walk([&](GlobalStoreOp s) {
      if (sharded.contains(s.getGlobal()) && s.getGlobal().starts_with(sd::abi::kGradPrefix)) stores.push_back(s);
    });
    for (GlobalStoreOp s : stores) {
      auto add = s.getValue().getDefiningOp<AddOp>();
      if (!add) continue; // the optimizer's zeroed gradient, checked below
      auto isOld = [&](Value v) {
        auto l = v.getDefiningOp<GlobalLoadOp>();
        return l && l.getGlobal() == s.getGlobal();
      };
      unsigned old = isOld(add.getOperand(0)) ? 0 : isOld(add.getOperand(1)) ? 1 : 2;
      if (old == 2) return s.emitError() << "'" << s.getGlobal() << "' is stored a sum that is not an accumulation";
      OpBuilder b(add);
      auto rs = b.create<ReduceScatterRowsOp>(NameLoc::get(b.getStringAttr("grad_reduce_scatter")),
                                              TypeRange{add.getType()},
                                              ValueRange{add.getOperand(old), add.getOperand(1 - old)});
      s.getValueMutable().assign(rs.getResult());
      if (add->use_empty()) add->erase();
    }
    return success();
  }

  // Each op that needs a sharded global whole gets it from a gather just before it.
  LogicalResult gatherReads(func::FuncOp f) {
    SmallVector<GlobalLoadOp> loads;
    f.walk([&](GlobalLoadOp l) {
      if (sharded.contains(l.getGlobal())) loads.push_back(l);
    });
    for (GlobalLoadOp l : loads) {
      SmallVector<OpOperand *> uses;
      for (OpOperand &u : l->getUses()) uses.push_back(&u);
      llvm::DenseMap<Operation *, Value> gathered;
      for (OpOperand *u : uses) {
        Operation *user = u->getOwner();
        if (readsRows(user, u->getOperandNumber())) continue;
        if (isa<GlobalStoreOp>(user))
          return user->emitError() << "row-sharded '" << l.getGlobal() << "' is copied into another global";
        Value &whole = gathered[user];
        if (!whole) {
          OpBuilder b(user);
          whole = b.create<AllGatherRowsOp>(NameLoc::get(b.getStringAttr("gather/" + l.getGlobal().str())),
                                            TypeRange{l.getType()}, ValueRange{l.getResult()})
                      .getResult();
        }
        u->set(whole);
      }
    }
    return success();
  }

  // Whatever reads or writes rows must be a shard-aware op over rows of the same split.
  LogicalResult checkUpdates(func::FuncOp f) {
    LogicalResult ok = success();
    f.walk([&](Operation *op) {
      if (isa<AdamWOp, SGDOp>(op) && isSharded(op->getOperand(0))) {
        unsigned rows = isa<AdamWOp>(op) ? 4 : 3;
        for (unsigned i = 0; i < rows; ++i)
          if (!isSharded(op->getOperand(i))) {
            ok = op->emitError("optimizer update of a row-sharded parameter with an operand that is not sharded alike");
            return;
          }
      }
      if (auto s = dyn_cast<GlobalStoreOp>(op); s && sharded.contains(s.getGlobal())) {
        Operation *def = s.getValue().getDefiningOp();
        if (!isa_and_nonnull<AdamWOp, SGDOp, ReduceScatterRowsOp>(def)) {
          ok = s.emitError() << "row-sharded '" << s.getGlobal() << "' is written by "
                             << (def ? def->getName().getStringRef() : StringRef("a block argument"))
                             << ", which works on whole tensors";
          return;
        }
      }
    });
    return ok;
  }
};

} // namespace
