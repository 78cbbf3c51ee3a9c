// sd-data-parallel: the gradient reduction that lets one training plan run
// data-parallel over N ranks. Before each GradScale (in apply and train_step)
// the counted tokens and the accumulated gradients are summed over the ranks
// by AllReduce steps, one per bucket of about `bucket-mb`, gradients in
// reverse parameter order (the last layer's are final first). Each reduced
// value is stored back into its global (the reduction runs in place once
// bufferized) and read again by GradScale and the optimizer. Every rank then
// scales by the global token count and clips by the global norm, so all
// ranks take the same step. Alone, AllReduce is the identity.
#include "PassDetail.h"
#include "Passes.h"

namespace sd {
#define GEN_PASS_DEF_DATAPARALLEL
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

int64_t byteSize(Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  return t.getNumElements() * std::max<int64_t>(1, t.getElementTypeBitWidth() / 8);
}

struct DataParallelPass : sd::impl::DataParallelBase<DataParallelPass> {
  using DataParallelBase::DataParallelBase;

  void runOnOperation() override {
    if (bucketMb < 0) {
      getOperation().emitError() << "bucket size must be at least 0 MB, got " << bucketMb;
      return signalPassFailure();
    }
    SmallVector<GradScaleOp> scales;
    getOperation().walk([&](GradScaleOp op) { scales.push_back(op); });
    for (GradScaleOp op : scales)
      if (failed(reduceBefore(op))) return signalPassFailure();
  }

  LogicalResult reduceBefore(GradScaleOp scale) {
    // The tokens first, then the gradients last to first.
    SmallVector<GlobalLoadOp> loads;
    auto addLoad = [&](Value v) -> LogicalResult {
      auto load = v.getDefiningOp<GlobalLoadOp>();
      if (!load) return scale.emitError("GradScale operand is not a global's value: cannot reduce it across ranks");
      loads.push_back(load);
      return success();
    };
    if (failed(addLoad(scale.getTokens()))) return failure();
    for (Value g : llvm::reverse(scale.getGrads()))
      if (failed(addLoad(g))) return failure();

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

    OpBuilder b(scale);
    for (auto [k, bucket] : llvm::enumerate(buckets)) {
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
