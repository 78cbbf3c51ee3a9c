// sd-fold-cast-round-trips: Cast(to T)(Cast(to W)(x)) with x of type T and W
// a float type that holds every T value exactly (bf16 or f16 widened to f32
// or f64, f32 to f64) is x itself: the widening is exact and narrowing an
// exactly representable value gives it back. Autocast plans are full of
// them: a half product is cast back to f32 after its op (autocast's rule),
// and to half again before the next product reads it (a LoRA branch, the
// backward's gradients), one memory pass each. NaNs keep their payload
// instead of the narrowing's canonical one. Repeated casts of one value to
// one type in one block become the first (autocast casts a LoRA-targeted
// input once for the base product and once for lora_A). Runs after
// autodiff, every entry.
#include "PassDetail.h"
#include "Passes.h"

namespace sd {
#define GEN_PASS_DEF_FOLDCASTROUNDTRIPS
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// Whether every value of `narrow` is exactly a value of `wide`.
bool widensExactly(Type narrow, Type wide) {
  if (narrow.isBF16() || narrow.isF16()) return wide.isF32() || wide.isF64();
  return narrow.isF32() && wide.isF64();
}

struct FoldCastRoundTripsPass : sd::impl::FoldCastRoundTripsBase<FoldCastRoundTripsPass> {
  void runOnOperation() override {
    SmallVector<CastOp> casts;
    getOperation().walk([&](CastOp c) { casts.push_back(c); });
    for (CastOp narrowing : casts) {
      auto widening = narrowing.getInput().getDefiningOp<CastOp>();
      if (!widening || widening.getInput().getType() != narrowing.getResult().getType()) continue;
      auto x = dyn_cast<RankedTensorType>(widening.getInput().getType());
      auto w = dyn_cast<RankedTensorType>(widening.getResult().getType());
      if (!x || !w || !widensExactly(x.getElementType(), w.getElementType())) continue;
      narrowing.getResult().replaceAllUsesWith(widening.getInput());
      // The casts nothing reads now go with sd-propagate-shapes.
    }
    mergeRepeatedCasts();
  }

  void mergeRepeatedCasts() {
    // Ops of a block are walked in order, so the first cast seen comes before its repeats.
    DenseMap<std::tuple<Value, Type, Block *, Attribute>, CastOp> first;
    SmallVector<std::pair<CastOp, CastOp>> repeats;
    getOperation().walk([&](CastOp c) {
      auto key = std::make_tuple(c.getInput(), c.getResult().getType(), c->getBlock(), Attribute(c->getAttrDictionary()));
      auto [it, inserted] = first.try_emplace(key, c);
      if (!inserted) repeats.push_back({c, it->second});
    });
    for (auto [repeat, kept] : repeats) {
      repeat.getResult().replaceAllUsesWith(kept.getResult());
      repeat->erase();
    }
  }
};

} // namespace
