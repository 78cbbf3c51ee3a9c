// sd-data-parallel: the gradient reduction that lets one training plan run
// data-parallel over N ranks. Before each GradScale (in apply and train_step)
// the counted tokens and the accumulated gradients are summed over the ranks
// by AllReduce steps, one per bucket of about `bucket-mb`, gradients in
// reverse parameter order (the last layer's are final first). Each reduced
// value is stored back into its global (the reduction runs in place once
// bufferized) and read again by GradScale and the optimizer. Every rank then
// scales by the global token count and clips by the global norm, so all
// ranks take the same step. Alone, AllReduce is the identity.
//
// Overlap (train_step, shard none or optimizer): the gradients are bucketed
// in the order the backward finishes them (sd-accumulate-where-produced put
// each accumulation there), and each bucket's AllReduce is placed right after
// its last gradient is final, marked `async`: the step starts the reduction
// and returns, the rest of the backward runs meanwhile, and one
// WaitCollectives step before GradScale completes them all (DDP's overlap,
// decided at compile time instead of by autograd hooks). The gradient
// globals are laid out in that (bucket) order, with or without overlap, so a
// bucket is one message.
//
// shard=optimizer (ZeRO-1 by parameter, as torch's ZeroRedundancyOptimizer
// partitions): each update step is tagged with its parameter (`shard_param`);
// the session gives every parameter an owner rank (largest first, to the
// least loaded rank), allocates its optimizer state only there, and runs its
// update only there (other ranks zero the gradient). Before returning, each
// updated parameter is broadcast from its owner. Ownership is decided at run
// time from the world size, so the plan still runs on any number of ranks.
// shard=grads (ZeRO-2 by parameter) also sends each micro-batch's gradient to
// its owner (ReduceToOwner), which alone keeps the gradient; GradScale then
// sums the ranks' partial squared norms. shard=params (rows of every weight)
// reduces gradients the same way, by rows; sd-shard-params builds the rest.
#include "sd/format/training_abi.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "llvm/ADT/StringMap.h"

namespace sd {
#define GEN_PASS_DEF_DATAPARALLEL
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

int64_t byteSize(Value v) { return sd::ir::storageBytes(cast<RankedTensorType>(v.getType())); }

struct DataParallelPass : sd::impl::DataParallelBase<DataParallelPass> {
  using DataParallelBase::DataParallelBase;

  void runOnOperation() override {
    if (bucketMb < 0) {
      getOperation().emitError() << "bucket size must be at least 0 MB, got " << bucketMb;
      return signalPassFailure();
    }
    if (shard != "none" && shard != "optimizer" && shard != "grads" && shard != "params") {
      getOperation().emitError() << "unknown shard mode '" << shard << "' (none, optimizer, grads, params)";
      return signalPassFailure();
    }
    if (shard == "grads")
      for (auto f : getOperation().getOps<func::FuncOp>())
        if (failed(reduceGradientsToOwners(f))) return signalPassFailure();
    readyOrder = gradientReadyOrder();
    // Buckets follow the ready order wherever gradients are all-reduced.
    if (shard != "grads" && shard != "params") layOutInReadyOrder();
    SmallVector<GradScaleOp> scales;
    getOperation().walk([&](GradScaleOp op) { scales.push_back(op); });
    for (GradScaleOp op : scales)
      if (failed(reduceBefore(op))) return signalPassFailure();
    if (shard == "optimizer" || shard == "grads")
      for (auto f : getOperation().getOps<func::FuncOp>())
        if (failed(shardUpdates(f))) return signalPassFailure();
  }

  // shard=grads: grad/<p> = grad/<p> + delta becomes grad/<p> + ReduceToOwner(delta):
  // each micro-batch's gradient is summed into the rank that keeps grad/<p>
  // (the session skips the accumulation elsewhere, where grad/<p> is not held).
  LogicalResult reduceGradientsToOwners(func::FuncOp f) {
    SmallVector<GlobalStoreOp> stores;
    f.walk([&](GlobalStoreOp s) {
      if (s.getGlobal().starts_with(sd::abi::kGradPrefix)) stores.push_back(s);
    });
    for (GlobalStoreOp s : stores) {
      auto add = s.getValue().getDefiningOp<AddOp>();
      auto old = add ? add.getOperand(0).getDefiningOp<GlobalLoadOp>() : GlobalLoadOp();
      if (!old || old.getGlobal() != s.getGlobal())
        continue; // not an accumulation (the optimizer's zeroed gradient)
      OpBuilder b(add);
      Value delta = add.getOperand(1);
      auto reduce = b.create<ReduceToOwnerOp>(NameLoc::get(b.getStringAttr("grad_to_owner")), TypeRange{delta.getType()},
                                              ValueRange{delta});
      reduce->setAttr("shard_param",
                      b.getStringAttr(s.getGlobal().drop_front(std::string_view(sd::abi::kGradPrefix).size())));
      add->setOperand(1, reduce.getResult(0));
    }
    return success();
  }

  // Tags each update with its parameter and broadcasts every updated
  // parameter from its owner just before the return.
  LogicalResult shardUpdates(func::FuncOp f) {
    SmallVector<GlobalLoadOp> params;
    for (Operation &op : f.getBody().front()) {
      if (!isa<AdamWOp, SGDOp>(op)) continue;
      auto load = op.getOperand(0).getDefiningOp<GlobalLoadOp>();
      if (!load) return op.emitError("optimizer update of a value that is not a parameter global: cannot shard it");
      op.setAttr("shard_param", load.getGlobalAttr().getAttr());
      params.push_back(load);
    }
    if (params.empty()) return success();
    Operation *ret = f.getBody().front().getTerminator();
    OpBuilder b(ret);
    for (GlobalLoadOp p : params) {
      Location loc = NameLoc::get(b.getStringAttr("shard_broadcast"));
      Value now = b.create<GlobalLoadOp>(loc, p.getType(), p.getGlobal()).getResult();
      auto send = b.create<BroadcastOp>(loc, TypeRange{p.getType()}, ValueRange{now}, IntegerAttr());
      send->setAttr("shard_param", p.getGlobalAttr().getAttr());
      b.create<GlobalStoreOp>(loc, p.getGlobal(), send.getResult(0));
    }
    return success();
  }

  // Each gradient's position in the order the backward finishes them: the
  // order of their accumulations in train_step, before its GradScale
  // (sd-accumulate-where-produced). Gradients the backward never stores come
  // after, last parameter first.
  llvm::StringMap<unsigned> readyOrder;

  llvm::StringMap<unsigned> gradientReadyOrder() {
    llvm::StringMap<unsigned> order;
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      auto entry = f->getAttrOfType<StringAttr>("sd.entry");
      if (!entry || entry.getValue() != sd::abi::kTrainStep) continue;
      for (Operation &op : f.getBody().front()) {
        if (isa<GradScaleOp>(op)) break;
        if (auto s = dyn_cast<GlobalStoreOp>(op); s && s.getGlobal().starts_with(sd::abi::kGradPrefix))
          order.try_emplace(s.getGlobal(), order.size());
      }
      break; // every bucket's train_step has the same backward
    }
    return order;
  }
  unsigned readyPosition(StringRef grad) const {
    auto it = readyOrder.find(grad);
    return it == readyOrder.end() ? ~0u : it->second;
  }

  // The gradient globals in ready order, so that a bucket of consecutive
  // gradients is one run of memory (one message).
  void layOutInReadyOrder() {
    SmallVector<std::pair<unsigned, GlobalOp>> grads;
    for (GlobalOp g : getOperation().getOps<GlobalOp>())
      if (auto it = readyOrder.find(g.getSymName()); it != readyOrder.end()) grads.push_back({it->second, g});
    if (grads.size() < 2) return;
    llvm::sort(grads, [](auto &a, auto &b) { return a.first < b.first; });
    Operation *after = grads.front().second;
    for (auto &[k, g] : llvm::drop_begin(grads)) {
      g->moveAfter(after);
      after = g;
    }
  }

  // The gradients of GradScale's operands in buckets of about bucket-mb, one
  // element type per bucket, in the given order.
  SmallVector<SmallVector<GlobalLoadOp>> bucketsOf(ArrayRef<GlobalLoadOp> loads) {
    const int64_t bucketBytes = int64_t(bucketMb * 1024 * 1024);
    SmallVector<SmallVector<GlobalLoadOp>> buckets;
    int64_t filled = 0;
    for (GlobalLoadOp load : loads) {
      Type elem = cast<RankedTensorType>(load.getType()).getElementType();
      bool fresh = buckets.empty() || filled >= bucketBytes ||
                   cast<RankedTensorType>(buckets.back().front().getType()).getElementType() != elem;
      if (fresh) buckets.emplace_back(), filled = 0;
      buckets.back().push_back(load);
      filled += byteSize(load.getResult());
    }
    return buckets;
  }

  // An OpT (a collective, in place once bufferized) over fresh loads of the
  // globals `loads` read, its results stored back into them, at b's
  // insertion point.
  template <class OpT> static OpT overGlobals(OpBuilder &b, Location loc, ArrayRef<GlobalLoadOp> loads) {
    SmallVector<Value> values;
    SmallVector<Type> types;
    for (GlobalLoadOp l : loads) {
      values.push_back(b.create<GlobalLoadOp>(loc, l.getType(), GlobalLoadOp(l).getGlobal()).getResult());
      types.push_back(l.getType());
    }
    auto op = b.create<OpT>(loc, types, values);
    for (auto [l, r] : llvm::zip(loads, op.getResults())) b.create<GlobalStoreOp>(loc, GlobalLoadOp(l).getGlobal(), r);
    return op;
  }

  // The last store to each global in `f`'s block before `limit`.
  static llvm::StringMap<GlobalStoreOp> finalStores(func::FuncOp f, Operation *limit) {
    llvm::StringMap<GlobalStoreOp> last;
    for (Operation &op : f.getBody().front()) {
      if (&op == limit) break;
      if (auto s = dyn_cast<GlobalStoreOp>(op)) last[s.getGlobal()] = s;
    }
    return last;
  }

  // train_step: each bucket's AllReduce (async) right after its last
  // gradient's final store, and one WaitCollectives before `before`. The
  // gradients it reduces are removed from `grads`; the rest (none when every
  // gradient has a store in the entry) stay for the blocking reduction.
  void reduceWhileBackwardRuns(func::FuncOp f, Operation *before, SmallVectorImpl<GlobalLoadOp> &grads) {
    SmallVector<std::pair<GlobalStoreOp, GlobalLoadOp>> ready;
    SmallVector<GlobalLoadOp> rest;
    llvm::StringMap<GlobalStoreOp> stores = finalStores(f, before);
    for (GlobalLoadOp l : grads) {
      if (GlobalStoreOp s = stores.lookup(l.getGlobal())) ready.push_back({s, l});
      else rest.push_back(l);
    }
    if (ready.empty()) return;
    llvm::sort(ready, [](auto &a, auto &b) { return a.first->isBeforeInBlock(b.first); });
    SmallVector<GlobalLoadOp> inOrder;
    llvm::DenseMap<Operation *, GlobalStoreOp> storeOf;
    for (auto &[s, l] : ready) inOrder.push_back(l), storeOf[l] = s;
    SmallVector<GlobalLoadOp> reduced;
    for (auto [k, bucket] : llvm::enumerate(bucketsOf(inOrder))) {
      OpBuilder b(f.getContext());
      b.setInsertionPointAfter(storeOf[bucket.back()]);
      Location loc = NameLoc::get(b.getStringAttr("grad_bucket_ready_" + std::to_string(k)));
      auto reduce = overGlobals<AllReduceOp>(b, loc, bucket);
      // Async only with work left to overlap: a nonblocking reduction waited
      // for at once is the slow path (bench/RESULTS.md); the last bucket,
      // final only at the backward's end, usually stays blocking.
      if (!workBetween(reduce, before)) continue;
      reduce->setAttr("async", b.getI64IntegerAttr(1));
      reduced.append(bucket.begin(), bucket.end());
    }
    grads.assign(rest.begin(), rest.end());
    if (reduced.empty()) return;
    // Every bucket complete before anything reads the gradients again.
    OpBuilder b(before);
    Location loc = NameLoc::get(b.getStringAttr("grad_buckets_done"));
    overGlobals<WaitCollectivesOp>(b, loc, reduced);
    for (GlobalLoadOp l : reduced) {
      Value fresh = b.create<GlobalLoadOp>(loc, l.getType(), l.getGlobal()).getResult();
      l.getResult().replaceAllUsesWith(fresh);
      l.erase();
    }
  }

  // True when an op that computes a tensor (not a global's load or store, a
  // constant, another reduction or scalar bookkeeping such as the token
  // count's sum) lies between `from` and `to`.
  static bool workBetween(Operation *from, Operation *to) {
    for (Operation *op = from->getNextNode(); op && op != to; op = op->getNextNode()) {
      if (isa<GlobalLoadOp, GlobalStoreOp, AllReduceOp, ConstantOp, NoneOp>(op)) continue;
      for (Type t : op->getResultTypes())
        if (auto r = dyn_cast<RankedTensorType>(t); r && r.hasStaticShape() && r.getNumElements() > 1) return true;
    }
    return false;
  }

  LogicalResult reduceBefore(GradScaleOp scale) {
    // The tokens first, then the gradients in ready order.
    SmallVector<GlobalLoadOp> loads, grads;
    auto addLoad = [&](Value v, SmallVectorImpl<GlobalLoadOp> &to) -> LogicalResult {
      auto load = v.getDefiningOp<GlobalLoadOp>();
      if (!load) return scale.emitError("GradScale operand is not a global's value: cannot reduce it across ranks");
      to.push_back(load);
      return success();
    };
    // fp16 (sd-optimizer): the tokens enter GradScale times the loss scale;
    // the count is what is summed, so the reductions go before that product.
    Operation *before = scale;
    Value tokens = scale.getTokens();
    if (auto scaled = tokens.getDefiningOp<MulOp>()) before = scaled, tokens = scaled->getOperand(0);
    if (failed(addLoad(tokens, loads))) return failure();
    // The gradients went to their owners (grads) or their rows' ranks
    // (params, sd-shard-params) micro-batch by micro-batch.
    if (shard == "grads" || shard == "params") {
      scale->setAttr("sharded_grads", OpBuilder(scale).getI64IntegerAttr(1));
    } else {
      // Ready order (the backward's); without a train_step, last parameter first.
      for (Value g : llvm::reverse(scale.getGrads()))
        if (failed(addLoad(g, grads))) return failure();
      llvm::stable_sort(grads, [&](GlobalLoadOp a, GlobalLoadOp b) {
        return readyPosition(a.getGlobal()) < readyPosition(b.getGlobal());
      });
      auto f = scale->getParentOfType<func::FuncOp>();
      auto entry = f->getAttrOfType<StringAttr>("sd.entry");
      if (overlap && entry && entry.getValue() == sd::abi::kTrainStep) reduceWhileBackwardRuns(f, before, grads);
      loads.append(grads.begin(), grads.end());
    }

    OpBuilder b(before);
    for (auto [k, bucket] : llvm::enumerate(bucketsOf(loads))) {
      Location loc = NameLoc::get(b.getStringAttr("grad_bucket_" + std::to_string(k)));
      SmallVector<Value> values;
      SmallVector<Type> types;
      for (GlobalLoadOp l : bucket) values.push_back(l.getResult()), types.push_back(l.getType());
      auto reduce = b.create<AllReduceOp>(loc, types, values);
      for (auto [l, reduced] : llvm::zip(bucket, reduce.getResults())) {
        b.create<GlobalStoreOp>(loc, l.getGlobal(), reduced);
        Value fresh = b.create<GlobalLoadOp>(loc, l.getType(), l.getGlobal()).getResult();
        l.getResult().replaceUsesWithIf(fresh, [&](OpOperand &use) { return use.getOwner() != reduce; });
      }
    }
    return success();
  }
};

} // namespace
