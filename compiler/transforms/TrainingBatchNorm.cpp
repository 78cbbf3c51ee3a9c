// sd-training-batch-norm: a BatchNormalization exported in train mode
// (training_mode=1) normalizes by its batch's statistics only while training,
// as PyTorch's module does between train() and eval(). The importer computes
// the batch's mean and variance and tags the node with its running-statistics
// weights (kRunningStatisticsAttr). Here, after autodiff:
//   - accumulate (train_step is built from it later) keeps the batch's
//     statistics and writes running * momentum + batch * (1 - momentum) back
//     into each running weight before returning, once per micro-batch, as
//     PyTorch updates its buffers on every training forward (a node traced
//     from PyTorch takes the batch's unbiased variance, as PyTorch does;
//     ONNX's training_mode takes the biased one). The batch is
//     every data-parallel rank's (PyTorch's SyncBatchNorm): the mean, the
//     variance and the two means the backward needs (batchNormVJP's
//     kCrossRankMeanAttr) are averaged over ranks by an AllReduce of
//     [mean..., 1] (the sum of ones counts the ranks; one rank: the identity),
//     so N ranks train as one rank of N times the batch;
//   - every other entry (eval_step, infer) normalizes by the running weights;
//     the batch's statistics, now unread, are erased.
// The running weights become `statistics` globals: mutable, checkpointed and
// saved with the trained weights, never optimized.
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/SymbolTable.h"

namespace sd {
#define GEN_PASS_DEF_TRAININGBATCHNORM
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct RunningStatistics {
  GlobalOp mean, var;
  double momentum = 0.9;
  // PyTorch's rule: the running variance takes the batch's unbiased
  // variance, over every rank's batch of this many elements per channel
  // each; 0: ONNX's rule, the biased variance.
  int64_t unbiasedCount = 0;
};

// `v` converted to `type`'s element type (a running weight and the batch's
// statistics may differ in precision); v itself when they agree.
Value castTo(GradBuilder &g, Value v, Type type) {
  Type want = cast<RankedTensorType>(type).getElementType();
  if (cast<RankedTensorType>(v.getType()).getElementType() == want) return v;
  return g.make<CastOp>({v}, {g.attr("to", int64_t(*sd::ir::toDType(want)))});
}

struct TrainingBatchNormPass : sd::impl::TrainingBatchNormBase<TrainingBatchNormPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable globals(module);
    for (auto f : module.getOps<func::FuncOp>()) {
      if (!sd::isEntry(f)) continue;
      SmallVector<BatchNormalizationOp> tagged;
      f.walk([&](BatchNormalizationOp bn) {
        if (bn->hasAttr(kRunningStatisticsAttr)) tagged.push_back(bn);
      });
      bool training = f->getAttrOfType<StringAttr>("sd.entry").getValue() == sd::abi::kAccumulate;
      for (BatchNormalizationOp bn : tagged) {
        std::optional<RunningStatistics> stats = statisticsOf(bn, globals);
        if (!stats) return signalPassFailure();
        stats->mean.setRole("statistics");
        stats->var.setRole("statistics");
        Value ranks;
        if (training && (failed(averageOverRanks(bn.getInputMean())) || failed(averageOverRanks(bn.getInputVar(), &ranks))))
          return signalPassFailure();
        if (failed(training ? writeBack(f, bn, *stats, ranks) : normalizeByRunning(bn, *stats)))
          return signalPassFailure();
      }
      if (!training) continue;
      SmallVector<Value> backwardMeans; // batchNormVJP's, in accumulate only
      f.walk([&](Operation *op) {
        if (op->hasAttr(kCrossRankMeanAttr)) backwardMeans.push_back(op->getResult(0));
      });
      for (Value means : backwardMeans)
        if (failed(averageOverRanks(means))) return signalPassFailure();
    }
    module.walk([](Operation *op) {
      op->removeAttr(kRunningStatisticsAttr);
      op->removeAttr(kCrossRankMeanAttr);
    });
  }

  // Every reader of the per-channel `local` [C] reads its average over the
  // data-parallel ranks instead: AllReduce([local..., 1]) = [sum..., ranks],
  // then sum / ranks. The AllReduce reduces the Concat's fresh buffer in place.
  // `ranks`, when asked for, is the count of ranks, a [1] vector.
  LogicalResult averageOverRanks(Value local, Value *ranks = nullptr) {
    auto type = dyn_cast<RankedTensorType>(local.getType());
    Operation *def = local.getDefiningOp();
    if (!type || type.getRank() != 1 || !def)
      return emitError(local.getLoc(), "a batch statistic to average over ranks must be a computed [C] vector");
    OpBuilder b(def->getContext());
    b.setInsertionPointAfter(def);
    GradBuilder g(b, local.getLoc());
    int64_t channels = type.getDimSize(0);
    Value one = g.reshape(g.scalar(type.getElementType(), 1.0), {1});
    Operation *packed = g.op<ConcatOp>({local, one}, {g.attr("axis", 0)});
    if (!packed) return emitError(local.getLoc(), "cannot pack a batch statistic for AllReduce");
    auto reduce = b.create<AllReduceOp>(local.getLoc(), TypeRange{packed->getResult(0).getType()},
                                        ValueRange{packed->getResult(0)});
    auto part = [&](int64_t begin, int64_t end) {
      return g.make<SliceOp>({reduce.getResult(0), g.ints({begin}), g.ints({end}), g.ints({0}), g.none()});
    };
    Value count = part(channels, channels + 1);
    Value average = g.div(part(0, channels), count);
    if (g.failed()) return emitError(local.getLoc(), "cannot average a batch statistic over ranks");
    if (ranks) *ranks = count;
    local.replaceUsesWithIf(average, [&](OpOperand &use) { return use.getOwner() != packed; });
    return success();
  }

  std::optional<RunningStatistics> statisticsOf(BatchNormalizationOp bn, SymbolTable &globals) {
    auto tag = bn->getAttrOfType<ArrayAttr>(kRunningStatisticsAttr);
    RunningStatistics s;
    if (tag && tag.size() == 4) {
      auto mean = dyn_cast<FlatSymbolRefAttr>(tag[0]), var = dyn_cast<FlatSymbolRefAttr>(tag[1]);
      auto momentum = dyn_cast<FloatAttr>(tag[2]);
      auto count = dyn_cast<IntegerAttr>(tag[3]);
      s.mean = mean ? globals.lookup<GlobalOp>(mean.getValue()) : GlobalOp();
      s.var = var ? globals.lookup<GlobalOp>(var.getValue()) : GlobalOp();
      if (momentum) s.momentum = momentum.getValueAsDouble();
      if (count) s.unbiasedCount = count.getInt();
      if (s.mean && s.var && momentum && count && s.unbiasedCount >= 0) return s;
    }
    bn.emitError("malformed ") << kRunningStatisticsAttr
                               << " (want [@running_mean, @running_var, momentum, unbiased count])";
    return std::nullopt;
  }

  // Before the return: running = running * momentum + batch * (1 - momentum),
  // the variance by PyTorch's rule scaled by N / (N - 1), N = ranks * count.
  LogicalResult writeBack(func::FuncOp f, BatchNormalizationOp bn, const RunningStatistics &s, Value ranks) {
    OpBuilder b(f.getBody().front().getTerminator());
    GradBuilder g(b, bn.getLoc());
    for (auto [global, batchStatistic] : {std::pair{s.mean, bn.getInputMean()}, std::pair{s.var, bn.getInputVar()}}) {
      Value running = b.create<GlobalLoadOp>(bn.getLoc(), global.getType(), global.getSymName());
      Type et = elementTypeOf(running);
      Value batch = batchStatistic;
      if (global == s.var && s.unbiasedCount > 0 && ranks) {
        Value n = g.scale(ranks, double(s.unbiasedCount));
        batch = g.mul(batch, g.div(n, g.sub(n, g.scalar(elementTypeOf(ranks), 1.0))));
      }
      Value next = g.add(g.mul(running, g.scalar(et, s.momentum)),
                         g.mul(castTo(g, batch, global.getType()), g.scalar(et, 1.0 - s.momentum)));
      if (g.failed()) return bn.emitError("running statistics @") << global.getSymName() << " do not fit the batch's";
      b.create<GlobalStoreOp>(bn.getLoc(), global.getSymName(), next);
    }
    return success();
  }

  LogicalResult normalizeByRunning(BatchNormalizationOp bn, const RunningStatistics &s) {
    OpBuilder b(bn);
    GradBuilder g(b, bn.getLoc());
    for (auto [index, global] : {std::pair{3u, s.mean}, std::pair{4u, s.var}}) {
      Value batch = bn->getOperand(index);
      Value running = b.create<GlobalLoadOp>(bn.getLoc(), global.getType(), global.getSymName());
      running = castTo(g, running, batch.getType());
      if (g.failed() || running.getType() != batch.getType())
        return bn.emitError("running statistics @") << global.getSymName() << " do not fit the batch's";
      bn->setOperand(index, running);
      sd::eraseIfUnread(batch);
    }
    return success();
  }
};

} // namespace
