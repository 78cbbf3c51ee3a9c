// sd-attention-layout: attention reads its operands as the projections wrote
// them. A transformer's q, k and v leave their Linear token-major, [B, T,
// H*d] viewed as [B, T, H, d]; the exported graph transposes each into
// head-major [B, H, T, d] (keys once more into kt [B, H, d, S]), repeats the
// grouped key/value heads H / Hkv times (Llama's repeat_kv: Unsqueeze,
// Expand, Reshape) and transposes the output back. Each of these is a copy of
// an activation in the forward and again in the backward (there the repeat
// becomes a sum over the group). With layout "bshd" the Attention step reads
// q [B, T, H, d], keys as rows [B, S, Hkv, d] and v [B, S, Hkv, dv] where they
// are, shares a key/value head between its query heads, and writes y [B, T,
// H, dv] where the output projection reads it; cuDNN's SDPA takes these
// strides as they are. A rotary embedding between the projection and the
// transpose runs on the token-major values (seq_axis 1), the same math.
// Runs before autocast and autodiff, so AttentionGrad gets the layout too.
// Only an attention whose every operand and every use fits is rewritten.
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_ATTENTIONLAYOUT
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// The input of the Transpose with permutation `perm` that defines `v`, else null.
Value transposeInput(Value v, ArrayRef<int64_t> perm) {
  auto t = v.getDefiningOp<TransposeOp>();
  if (!t || !t.getPerm()) return {};
  return ArrayRef<int64_t>(*t.getPerm()) == perm ? t.getInput() : Value();
}

constexpr int64_t kHeadsFirst[] = {0, 2, 1, 3};

// A token-major operand: the tensor [B, T, H, d] the head-major one came
// from, and the rotary embedding applied between the two (or none).
struct TokenMajor {
  Value x;
  RotaryOp rotary;
};

// v = [Rotary](Transpose(0, 2, 1, 3)(x)), the rotary read by nothing else.
std::optional<TokenMajor> tokenMajorOf(Value v) {
  RotaryOp rotary = v.getDefiningOp<RotaryOp>();
  if (rotary) {
    if (!v.hasOneUse() || !isa<NoneType>(rotary.getPositions().getType()) || rotary.getSeqAxis()) return std::nullopt;
    v = rotary.getX();
  }
  Value x = transposeInput(v, kHeadsFirst);
  if (!x || shapeOf(x).size() != 4) return std::nullopt;
  return TokenMajor{x, rotary};
}

// Llama's repeat_kv: v = Reshape([B, Hkv*g, S, d])(Expand([B, Hkv, g, S, d])(
// Unsqueeze(y [B, Hkv, S, d]) at axis 2)) gives y; else v itself.
Value unrepeated(Value v) {
  auto reshape = v.getDefiningOp<ReshapeOp>();
  auto expand = reshape ? reshape.getLhs().getDefiningOp<ExpandOp>() : ExpandOp{};
  auto unsqueeze = expand ? expand.getLhs().getDefiningOp<UnsqueezeOp>() : UnsqueezeOp{};
  if (!unsqueeze) return v;
  Value y = unsqueeze.getLhs();
  ArrayRef<int64_t> ys = shapeOf(y), us = shapeOf(unsqueeze.getResult()), es = shapeOf(expand.getResult()),
                    rs = shapeOf(v);
  if (ys.size() != 4 || us.size() != 5 || es.size() != 5 || rs.size() != 4) return v;
  const bool repeat = us == ArrayRef<int64_t>{ys[0], ys[1], 1, ys[2], ys[3]} &&
                      es == ArrayRef<int64_t>{ys[0], ys[1], es[2], ys[2], ys[3]} &&
                      rs == ArrayRef<int64_t>{ys[0], ys[1] * es[2], ys[2], ys[3]};
  return repeat ? y : v;
}

// torch.onnx's dynamo exporter swaps the keys' last two axes with the
// heads merged into the batch: kt = Reshape([B, H, d, S])(Transpose(0, 2,
// 1)(Reshape([B*H, S, d])(k [B, H, S, d]))), the same values as
// Transpose(0, 1, 3, 2)(k). Gives k, else null.
Value swappedThroughMergedHeads(Value kt) {
  auto outer = kt.getDefiningOp<ReshapeOp>();
  Value merged = outer ? transposeInput(outer.getLhs(), {0, 2, 1}) : Value();
  auto inner = merged ? merged.getDefiningOp<ReshapeOp>() : ReshapeOp{};
  if (!inner) return {};
  Value k = inner.getLhs();
  ArrayRef<int64_t> ks = shapeOf(k), ms = shapeOf(merged), kts = shapeOf(kt);
  if (ks.size() != 4 || ShapedType::isDynamicShape(ks)) return {};
  const bool same = ms == ArrayRef<int64_t>{ks[0] * ks[1], ks[2], ks[3]} &&
                    kts == ArrayRef<int64_t>{ks[0], ks[1], ks[3], ks[2]};
  return same ? k : Value();
}

// The keys: kt = Transpose(0, 2, 3, 1)(k [B, S, H, d]) (GPT), or
// Transpose(0, 1, 3, 2) of a head-major, maybe repeated, operand (Llama;
// or its merged-heads form above).
std::optional<TokenMajor> tokenMajorKeys(Value kt) {
  constexpr int64_t kKeysLast[] = {0, 2, 3, 1}, kSwapLast[] = {0, 1, 3, 2};
  if (Value x = transposeInput(kt, kKeysLast); x && shapeOf(x).size() == 4) return TokenMajor{x, RotaryOp{}};
  Value k = transposeInput(kt, kSwapLast);
  if (!k) k = swappedThroughMergedHeads(kt);
  return k ? tokenMajorOf(unrepeated(k)) : std::nullopt;
}

// The rotary embedding, again on the token-major x.
Value rotated(OpBuilder &b, const TokenMajor &t) {
  if (!t.rotary) return t.x;
  Operation *r = b.clone(*t.rotary);
  r->setOperand(0, t.x);
  r->setAttr("seq_axis", b.getI64IntegerAttr(1));
  r->getResult(0).setType(t.x.getType());
  return r->getResult(0);
}

// Erases `v`'s producer and then theirs while nothing reads them (the
// transposes, repeats and rotary embeddings the rewrite left unread).
void eraseUnread(Value v) {
  Operation *op = v ? v.getDefiningOp() : nullptr;
  if (!op || !op->use_empty() || !isa<TransposeOp, RotaryOp, ReshapeOp, ExpandOp, UnsqueezeOp, ConstantOp>(op)) return;
  SmallVector<Value> operands(op->getOperands());
  op->erase();
  for (Value o : operands) eraseUnread(o);
}

struct AttentionLayoutPass : sd::impl::AttentionLayoutBase<AttentionLayoutPass> {
  void runOnOperation() override {
    SmallVector<AttentionOp> attentions;
    getOperation().walk([&](AttentionOp a) { attentions.push_back(a); });
    for (AttentionOp a : attentions) rewrite(a);
  }

  void rewrite(AttentionOp a) {
    if (a.getLayout() || !isa<NoneType>(a.getPositions().getType()) || a.getY().use_empty()) return;
    std::optional<TokenMajor> q = tokenMajorOf(a.getQ()), k = tokenMajorKeys(a.getKt());
    std::optional<TokenMajor> v = tokenMajorOf(unrepeated(a.getV()));
    if (!q || !k || !v) return;
    for (Operation *u : a.getY().getUsers())
      if (!isa<TransposeOp>(u) || !transposeInput(u->getResult(0), kHeadsFirst)) return;
    ArrayRef<int64_t> qs = shapeOf(q->x), ks = shapeOf(k->x), vs = shapeOf(v->x), ys = shapeOf(a.getY());
    // q [B, T, H, d], k [B, S, Hkv, d], v [B, S, Hkv, dv]; the head-major
    // result [B, H, T, dv] as before.
    if (ks[0] != qs[0] || ks[3] != qs[3] || vs[0] != qs[0] || vs[1] != ks[1] || vs[2] != ks[2] || ks[2] <= 0 ||
        qs[2] % ks[2] || ys != ArrayRef<int64_t>{qs[0], qs[2], qs[1], vs[3]})
      return;
    OpBuilder b(a);
    Value qx = rotated(b, *q), kx = rotated(b, *k), vx = rotated(b, *v);
    SmallVector<NamedAttribute> attrs(a->getAttrs());
    attrs.push_back(b.getNamedAttr("layout", b.getStringAttr("bshd")));
    Operation *user = *a.getY().getUsers().begin();
    auto fused = b.create<AttentionOp>(a.getLoc(), TypeRange{user->getResult(0).getType()},
                                       ValueRange{qx, kx, vx, a.getMask(), a.getPositions()}, attrs);
    for (Operation *u : llvm::make_early_inc_range(a.getY().getUsers())) {
      u->getResult(0).replaceAllUsesWith(fused.getY());
      u->erase();
    }
    Value oldQ = a.getQ(), oldK = a.getKt(), oldV = a.getV();
    a->erase();
    for (Value old : {oldQ, oldK, oldV}) eraseUnread(old);
  }
};

} // namespace
