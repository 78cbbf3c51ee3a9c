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
// transpose runs on the token-major values (seq_axis 1), the same math; so
// do Slice, Split and Concat on the last axis between them (GPT-NeoX's q|k|v
// packed per head, partial rotary embeddings), rebuilt only where nothing
// else reads them. Keys transposed with the heads merged into the batch
// (torch.onnx's dynamo exporter) are taken as the same k^T.
// Runs before autocast and autodiff, so AttentionGrad gets the layout too.
// Only an attention whose every operand and every use fits is rewritten.
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/Builders.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

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

// [B, T, H, d] of a head-major [B, H, T, d].
SmallVector<int64_t> tokenMajorShape(Value headMajor) {
  SmallVector<int64_t> dims(shapeOf(headMajor));
  std::swap(dims[1], dims[2]);
  return dims;
}

// Rebuilds head-major operands [B, H, T, d] on the token-major tensors [B,
// T, H, d] they were transposed from. Between the Transpose(0, 2, 1, 3) and
// attention there may be ops that act along the last axis only, and so
// commute with the transpose: a rotary embedding (then run with seq_axis 1),
// Slice, Split and Concat on the last axis (GPT-NeoX's q|k|v packed per
// head, the partial rotary embeddings of GPT-NeoX, Phi and StableLM), norms
// over each head's features (Gemma 3's q_norm and k_norm).
class TokenMajorChains {
public:
  // True when `v` is such a chain down to transposes; records its ops.
  bool reaches(Value v) {
    ArrayRef<int64_t> shape = shapeOf(v);
    if (shape.size() != 4 || ShapedType::isDynamicShape(shape)) return false;
    size_t before = order.size();
    if (reachesThroughOps(v)) return true;
    while (order.size() > before) ops.erase(order.pop_back_val()); // a partly matched chain is not rebuilt
    // One head (multi-query attention's shared key and value: StarCoder):
    // [B, 1, S, d] is laid out as [B, S, 1, d] already.
    if (shape[1] == 1) return oneHead.insert(v), true;
    return false;
  }

  // The recorded ops other than the transposes: rebuilding one that
  // something besides `dying` reads would compute it twice.
  bool allDie(const DenseSet<Operation *> &dying) const {
    return llvm::all_of(ops, [&](Operation *op) { return isa<TransposeOp>(op) || dying.contains(op); });
  }

  // The token-major value of a recorded head-major `v`, built at `b`.
  Value build(OpBuilder &b, Value v) {
    if (oneHead.contains(v)) return viewTokenMajor(b, v);
    Operation *op = v.getDefiningOp();
    if (isa<TransposeOp>(op)) return cast<TransposeOp>(op).getInput();
    Operation *copy = rebuilt.lookup(op);
    if (!copy) {
      SmallVector<Value> operands;
      for (Value o : op->getOperands())
        operands.push_back(o.getDefiningOp() && ops.contains(o.getDefiningOp()) ? build(b, o) : o);
      copy = rebuilt[op] = b.clone(*op);
      copy->setOperands(operands);
      for (Value r : copy->getResults())
        r.setType(RankedTensorType::get(tokenMajorShape(r), getElementTypeOrSelf(r.getType())));
      if (isa<RotaryOp>(copy)) copy->setAttr("seq_axis", b.getI64IntegerAttr(1));
    }
    return copy->getResult(cast<OpResult>(v).getResultNumber());
  }

private:
  // A chain down to transposes (rather than a one-head view: Mistral's
  // rotary on its one key/value head runs token-major, its transpose goes).
  bool reachesThroughOps(Value v) {
    if (shapeOf(v).size() != 4) return false;
    Operation *op = v.getDefiningOp();
    if (!op) return false;
    if (ops.contains(op)) return true;
    bool ok = false;
    if (Value x = transposeInput(v, kHeadsFirst)) {
      ok = shapeOf(x).size() == 4;
    } else if (auto r = dyn_cast<RotaryOp>(op)) {
      // Positions [B, S] pick a token's angles in either layout (onnxruntime-genai's
      // models rotate by position_ids).
      ok = !r.getSeqAxis() && reachesThroughOps(r.getX());
    } else if (auto s = dyn_cast<SliceOp>(op)) {
      SmallVector<int64_t> axes;
      ok = !isa<NoneType>(s.getAxes().getType()) && constantInts(s.getAxes(), axes) && axes.size() == 1 &&
           isLastAxis(axes[0]) && reachesThroughOps(s.getData());
    } else if (auto s = dyn_cast<SplitOp>(op)) {
      ok = s.getAxis() && isLastAxis(int64_t(*s.getAxis())) && reachesThroughOps(s.getInput());
    } else if (auto n = dyn_cast<RMSNormalizationOp>(op)) {
      ok = lastAxisNorm(n.getAxis(), {n.getScale()}) && reachesThroughOps(n.getX());
    } else if (auto n = dyn_cast<LayerNormalizationOp>(op)) {
      ok = n.getStats().empty() && lastAxisNorm(n.getAxis(), {n.getScale(), n.getBias()}) &&
           reachesThroughOps(n.getX());
    } else if (auto c = dyn_cast<ConcatOp>(op)) {
      ok = isLastAxis(int64_t(c.getAxis())) &&
           llvm::all_of(c.getInputs(), [&](Value in) { return reachesThroughOps(in); });
    }
    if (ok) ops.insert(op), order.push_back(op);
    return ok;
  }

  // A norm over each head's features alone (Gemma 3's q_norm and k_norm on
  // the head-major q and k): its weights [d] or none.
  // The features' axis of a 4-D head-major tensor.
  static bool isLastAxis(int64_t axis) { return axis == 3 || axis == -1; }

  static bool lastAxisNorm(std::optional<int64_t> axis, ArrayRef<Value> weights) {
    if (!isLastAxis(axis.value_or(-1))) return false;
    return llvm::all_of(weights, [](Value w) { return isa<NoneType>(w.getType()) || shapeOf(w).size() <= 1; });
  }

  // [B, S, 1, d] of a one-head [B, 1, S, d]: a Reshape, which moves nothing.
  Value viewTokenMajor(OpBuilder &b, Value v) {
    Value &view = views[v];
    if (!view) view = GradBuilder(b, v.getLoc()).reshape(v, tokenMajorShape(v));
    return view;
  }

  DenseSet<Operation *> ops;
  SmallVector<Operation *> order; // ops, as recorded
  DenseSet<Value> oneHead;
  DenseMap<Operation *, Operation *> rebuilt;
  DenseMap<Value, Value> views;
};

// The ops computing `a`'s operands that nothing else reads (they go with
// it), last first: walked back from `a` through ops of the kinds this pass
// rewrites.
SmallVector<Operation *> dyingWith(Operation *a) {
  SmallVector<Operation *> found;
  DenseSet<Operation *> seen;
  SmallVector<Operation *> work = {a};
  while (!work.empty()) {
    Operation *op = work.pop_back_val();
    for (Value o : op->getOperands()) {
      Operation *d = o.getDefiningOp();
      if (!d || d->getBlock() != a->getBlock() ||
          !isa<TransposeOp, RotaryOp, SliceOp, SplitOp, ConcatOp, RMSNormalizationOp, LayerNormalizationOp, ReshapeOp,
               ExpandOp, UnsqueezeOp>(d) ||
          !seen.insert(d).second)
        continue;
      found.push_back(d);
      work.push_back(d);
    }
  }
  // Users come after their producers: last first, one pass decides.
  llvm::sort(found, [](Operation *x, Operation *y) { return y->isBeforeInBlock(x); });
  DenseSet<Operation *> dying;
  SmallVector<Operation *> ordered;
  for (Operation *op : found)
    if (llvm::all_of(op->getUsers(), [&](Operation *u) { return u == a || dying.contains(u); }))
      dying.insert(op), ordered.push_back(op);
  return ordered;
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
// Transpose(0, 1, 3, 2)(k). Repeated keys come straight from repeat_kv's
// Expand, [B, Hkv, g, S, d] (its Reshape to [B, H, S, d] merged into the
// first). Gives k (the unrepeated keys for the latter), else null.
Value swappedThroughMergedHeads(Value kt) {
  auto outer = kt.getDefiningOp<ReshapeOp>();
  Value merged = outer ? transposeInput(outer.getLhs(), {0, 2, 1}) : Value();
  auto inner = merged ? merged.getDefiningOp<ReshapeOp>() : ReshapeOp{};
  if (!inner) return {};
  Value k = inner.getLhs();
  SmallVector<int64_t> ks(shapeOf(k));
  if (ks.size() == 5) { // [B, Hkv, g, S, d]: unrepeated() of its Reshape to [B, H, S, d]
    auto expand = k.getDefiningOp<ExpandOp>();
    auto unsqueeze = expand ? expand.getLhs().getDefiningOp<UnsqueezeOp>() : UnsqueezeOp{};
    if (!unsqueeze) return {};
    Value y = unsqueeze.getLhs();
    ArrayRef<int64_t> ys = shapeOf(y), us = shapeOf(unsqueeze.getResult());
    if (ys.size() != 4 || us != ArrayRef<int64_t>{ys[0], ys[1], 1, ys[2], ys[3]} ||
        ArrayRef<int64_t>(ks) != ArrayRef<int64_t>{ys[0], ys[1], ks[2], ys[2], ys[3]})
      return {};
    k = y;
    ks = {ys[0], ys[1] * ks[2], ys[2], ys[3]};
  }
  if (ks.size() != 4 || ShapedType::isDynamicShape(ks)) return {};
  ArrayRef<int64_t> ms = shapeOf(merged), kts = shapeOf(kt);
  const bool same = ms == ArrayRef<int64_t>{ks[0] * ks[1], ks[2], ks[3]} &&
                    kts == ArrayRef<int64_t>{ks[0], ks[1], ks[3], ks[2]};
  return same ? k : Value();
}

// The keys: kt = Transpose(0, 2, 3, 1)(k [B, S, H, d]) (GPT: `direct` is
// set to the token-major k), or Transpose(0, 1, 3, 2) of a head-major, maybe
// repeated, operand (Llama; or its merged-heads form above): that operand,
// unrepeated. Null when neither.
Value headMajorKeys(Value kt, Value &direct) {
  constexpr int64_t kKeysLast[] = {0, 2, 3, 1}, kSwapLast[] = {0, 1, 3, 2};
  if (Value x = transposeInput(kt, kKeysLast); x && shapeOf(x).size() == 4) return direct = x;
  Value k = transposeInput(kt, kSwapLast);
  if (!k) k = swappedThroughMergedHeads(kt);
  return k ? unrepeated(k) : Value();
}

// Erases the ops nothing reads, to a fixpoint: what the fusions before left
// unread (a rotary embedding's or attention's pieces, which would look like
// other readers of the chains), and the rewrite after.
void eraseUnread(Operation *root) {
  for (bool erased = true; erased;) {
    SmallVector<Operation *> dead;
    root->walk([&](Operation *op) {
      if (op->getNumResults() && isOpTriviallyDead(op)) dead.push_back(op);
    });
    erased = !dead.empty();
    for (Operation *op : llvm::reverse(dead)) op->erase();
  }
}

// An export with a KV cache (Optimum, onnxruntime-genai) joins the past keys
// and values to the new ones; a plan specialized to no past (training, a
// prompt) joins an empty tensor, and the Concat is the new keys themselves.
void dropEmptyConcatInputs(Operation *root) {
  SmallVector<ConcatOp> concats;
  root->walk([&](ConcatOp c) { concats.push_back(c); });
  for (ConcatOp c : concats) {
    auto type = dyn_cast<RankedTensorType>(c.getResult().getType());
    if (!type || !type.hasStaticShape()) continue;
    SmallVector<Value> kept;
    for (Value in : c.getInputs())
      if (auto t = dyn_cast<RankedTensorType>(in.getType()); !t || !t.hasStaticShape() || t.getNumElements() != 0)
        kept.push_back(in);
    if (kept.size() == 1 && kept[0].getType() == type) {
      c.getResult().replaceAllUsesWith(kept[0]);
      c->erase();
    }
  }
}

struct AttentionLayoutPass : sd::impl::AttentionLayoutBase<AttentionLayoutPass> {
  void runOnOperation() override {
    dropEmptyConcatInputs(getOperation());
    eraseUnread(getOperation());
    SmallVector<AttentionOp> attentions;
    getOperation().walk([&](AttentionOp a) { attentions.push_back(a); });
    for (AttentionOp a : attentions) rewrite(a);
    eraseUnread(getOperation());
  }

  void rewrite(AttentionOp a) {
    if (a.getLayout() || !isa<NoneType>(a.getPositions().getType()) || a.getY().use_empty()) return;
    TokenMajorChains chains;
    Value directK;
    Value q = a.getQ(), k = headMajorKeys(a.getKt(), directK), v = unrepeated(a.getV());
    if (!k || !chains.reaches(q) || (!directK && !chains.reaches(k)) || !chains.reaches(v)) return;
    // A Reshape to the shape it already has (Phi-3 as torch.onnx exports it)
    // is the output itself.
    for (Operation *u : llvm::make_early_inc_range(a.getY().getUsers()))
      if (isa<ReshapeOp>(u) && u->getResult(0).getType() == a.getY().getType()) {
        u->getResult(0).replaceAllUsesWith(a.getY());
        u->erase();
      }
    for (Operation *u : a.getY().getUsers())
      if (!isa<TransposeOp>(u) || !transposeInput(u->getResult(0), kHeadsFirst)) return;
    // q [B, T, H, d], k [B, S, Hkv, d], v [B, S, Hkv, dv]; the head-major
    // result [B, H, T, dv] as before.
    SmallVector<int64_t> qs = tokenMajorShape(q), ks = directK ? SmallVector<int64_t>(shapeOf(directK))
                                                              : tokenMajorShape(k),
                         vs = tokenMajorShape(v);
    ArrayRef<int64_t> ys = shapeOf(a.getY());
    if (ks[0] != qs[0] || ks[3] != qs[3] || vs[0] != qs[0] || vs[1] != ks[1] || vs[2] != ks[2] || ks[2] <= 0 ||
        qs[2] % ks[2] || ys != ArrayRef<int64_t>{qs[0], qs[2], qs[1], vs[3]})
      return;
    SmallVector<Operation *> dying = dyingWith(a);
    if (!chains.allDie(DenseSet<Operation *>(dying.begin(), dying.end()))) return;
    OpBuilder b(a);
    Value qx = chains.build(b, q), kx = directK ? directK : chains.build(b, k), vx = chains.build(b, v);
    SmallVector<NamedAttribute> attrs(a->getAttrs());
    attrs.push_back(b.getNamedAttr("layout", b.getStringAttr("bshd")));
    Operation *user = *a.getY().getUsers().begin();
    auto fused = b.create<AttentionOp>(a.getLoc(), TypeRange{user->getResult(0).getType()},
                                       ValueRange{qx, kx, vx, a.getMask(), a.getPositions()}, attrs);
    for (Operation *u : llvm::make_early_inc_range(a.getY().getUsers())) {
      u->getResult(0).replaceAllUsesWith(fused.getY());
      u->erase();
    }
    a->erase();
    // Last first; what the rebuilt ops read too (a rotary's tables) stays.
    for (Operation *op : dying)
      if (op->use_empty()) op->erase();
  }
};

} // namespace
