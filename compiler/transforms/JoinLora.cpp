// sd-join-lora: LoRA adapters on the parts of one fused projection (the q, k
// and v, or gate and up, that sd-fuse-projections joined) become one adapter
// on the whole projection, added before its Split:
//   y = x W + s (x [A_1; ...; A_n]ᵀ) Bᵀ,  B = the block diagonal of the B_i,
// each B_i in its part's rows and its rank's columns, zeros elsewhere (a part
// without an adapter: zero rows), made each step from the trained B_i.
// Per part, each adapter added its own two products to its own slice after
// the Split: 2n small products where two do (each launch-bound on a GPU),
// and the Split's parts were no longer what the attention (or SwiGLU) reads,
// so sd-qkv-attention and sd-pack-swiglu left the Split's copies (and the
// backward's Concat) in. The A_i and B_i stay the trained tensors (the
// adapter file is unchanged); their gradients are slices of the joined ones.
// The zeros cost the joined rank's multiply-adds per output where one part's
// rank did: a few percent of the projection's at ranks 8-64. Each output
// sums the same nonzero terms in the same order (a zero product adds
// nothing); only x's gradient, one product over the joined rank instead of
// one per part added up, rounds differently. Runs before sd-qkv-attention.
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/Builders.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/SetVector.h"

namespace sd {
#define GEN_PASS_DEF_JOINLORA
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

bool hasNoBias(LinearOp l) { return isa<NoneType>(l.getBias().getType()); }

// A trainable global read where `v` is, or none.
GlobalLoadOp trainableLoad(Value v) {
  auto load = v.getDefiningOp<GlobalLoadOp>();
  if (!load) return {};
  auto g = SymbolTable::lookupNearestSymbolFrom<GlobalOp>(load, load.getGlobalAttr());
  return g && g.getRole() == "trainable" ? load : GlobalLoadOp();
}

// One part's adapter: part + s * Linear(Linear(x, A), B), each step read
// only by the next, A [r, in] and B [out, r] trainable ("oi", no bias).
struct Adapter {
  AddOp sum;
  MulOp scaled;
  LinearOp down, up;
  GlobalLoadOp a, b;
  double scale = 0;
  int64_t rank = 0;
};

std::optional<Adapter> adapterOn(Value part, Value x) {
  Adapter ad;
  ad.sum = dyn_cast_or_null<AddOp>(sd::soleUser(part));
  if (!ad.sum || ad.sum.getType() != part.getType()) return std::nullopt;
  Value other = sd::otherOperand(ad.sum, part);
  ad.scaled = other ? other.getDefiningOp<MulOp>() : MulOp();
  if (!ad.scaled || !other.hasOneUse()) return std::nullopt;
  for (Value operand : ad.scaled->getOperands())
    if (auto l = operand.getDefiningOp<LinearOp>()) ad.up = l;
  std::optional<double> s = ad.up ? sd::scalarValue(sd::otherOperand(ad.scaled, ad.up.getOutput())) : std::nullopt;
  if (!s || !ad.up.getOutput().hasOneUse() || ad.up.getOutput().getType() != part.getType()) return std::nullopt;
  ad.scale = *s;
  ad.down = ad.up.getInput().getDefiningOp<LinearOp>();
  if (!ad.down || !ad.down.getOutput().hasOneUse() || ad.down.getInput() != x) return std::nullopt;
  for (LinearOp l : {ad.up, ad.down})
    if (l.getLayout() != "oi" || !hasNoBias(l)) return std::nullopt;
  ad.a = trainableLoad(ad.down.getWeight()), ad.b = trainableLoad(ad.up.getWeight());
  auto at = ad.a ? dyn_cast<RankedTensorType>(ad.a.getType()) : RankedTensorType();
  auto bt = ad.b ? dyn_cast<RankedTensorType>(ad.b.getType()) : RankedTensorType();
  if (!at || !bt || at.getRank() != 2 || bt.getRank() != 2 || !at.getElementType().isF32() ||
      bt.getElementType() != at.getElementType() || bt.getDimSize(1) != at.getDimSize(0))
    return std::nullopt;
  ad.rank = at.getDimSize(0);
  return ad;
}

struct JoinLoraPass : sd::impl::JoinLoraBase<JoinLoraPass> {
  void runOnOperation() override {
    SmallVector<SplitOp> splits;
    getOperation().walk([&](SplitOp s) { splits.push_back(s); });
    for (SplitOp s : splits) join(s);
  }

  // The Split of a fused projection's output along its last axis whose
  // parts have adapters (some or all) with one scale, all reading the
  // projection's input.
  void join(SplitOp split) {
    auto proj = split.getInput().getDefiningOp<LinearOp>();
    auto in = dyn_cast<RankedTensorType>(split.getInput().getType());
    if (!proj || !in || !in.hasStaticShape() || in.getRank() < 2 || !in.getElementType().isF32() ||
        !split.getInput().hasOneUse())
      return;
    int64_t axis = split.getAxis().value_or(0);
    if (axis < 0) axis += in.getRank();
    if (axis != in.getRank() - 1) return;
    SmallVector<std::optional<Adapter>> adapters;
    SmallVector<int64_t> widths;
    std::optional<double> scale;
    int64_t joinedRank = 0;
    for (Value part : split.getOutputs()) {
      auto t = dyn_cast<RankedTensorType>(part.getType());
      if (!t || !t.hasStaticShape()) return;
      widths.push_back(t.getShape().back());
      adapters.push_back(adapterOn(part, proj.getInput()));
      if (!adapters.back()) continue;
      if (scale && *scale != adapters.back()->scale) return;
      scale = adapters.back()->scale;
      joinedRank += adapters.back()->rank;
    }
    if (!scale) return;
    OpBuilder b(split);
    GradBuilder g(b, split.getLoc());
    Type f32 = in.getElementType();
    auto load = [&](GlobalLoadOp l) {
      return b.create<GlobalLoadOp>(l.getLoc(), l.getType(), l.getGlobal()).getResult();
    };
    SmallVector<Value> as, blocks;
    int64_t before = 0; // the joined rank's columns taken by earlier parts
    for (auto [ad, width] : llvm::zip(adapters, widths)) {
      if (!ad) { // no adapter: zero rows
        blocks.push_back(g.zeros(RankedTensorType::get({width, joinedRank}, f32)));
        continue;
      }
      as.push_back(load(ad->a));
      // B_i between the earlier and later parts' rank columns (zeros).
      SmallVector<Value> row;
      const int64_t after = joinedRank - before - ad->rank;
      if (before) row.push_back(g.zeros(RankedTensorType::get({width, before}, f32)));
      row.push_back(load(ad->b));
      if (after) row.push_back(g.zeros(RankedTensorType::get({width, after}, f32)));
      blocks.push_back(row.size() == 1 ? row[0] : g.make<ConcatOp>(row, {g.attr("axis", 1)}));
      before += ad->rank;
    }
    auto linear = [&](Value x, Value w, StringRef suffix) {
      return g.make<LinearOp>({x, w, g.none()}, {b.getNamedAttr("layout", b.getStringAttr("oi")),
                                                 b.getNamedAttr("module", b.getStringAttr(proj.getModule().str() + suffix.str()))});
    };
    Value aJoined = as.size() == 1 ? as[0] : g.make<ConcatOp>(as, {g.attr("axis", 0)});
    Value down = linear(proj.getInput(), aJoined, ".lora_A");
    Value up = linear(down, g.make<ConcatOp>(blocks, {g.attr("axis", 0)}), ".lora_B");
    Value sum = g.add(split.getInput(), g.scale(up, *scale));
    if (g.failed()) return signalPassFailure();
    split->setOperand(0, sum);
    // The adapters' steps, users first, then what they read that nothing
    // else does (the scale, the weights' loads, the nones).
    SmallVector<Operation *> dead;
    for (auto [ad, part] : llvm::zip(adapters, split.getOutputs())) {
      if (!ad) continue;
      ad->sum.getResult().replaceAllUsesWith(part);
      dead.append({ad->sum.getOperation(), ad->scaled.getOperation(), ad->up.getOperation(), ad->down.getOperation()});
    }
    llvm::SetVector<Operation *> inputs;
    for (Operation *op : dead)
      for (Value operand : op->getOperands())
        if (Operation *def = operand.getDefiningOp(); def && !llvm::is_contained(dead, def)) inputs.insert(def);
    for (Operation *op : dead) op->erase();
    for (Operation *op : inputs)
      if (op->use_empty() && (isOpTriviallyDead(op) || isa<GlobalLoadOp>(op))) op->erase();
  }
};

} // namespace
