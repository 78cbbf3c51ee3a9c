// sd-kv-cache: the specialized prefill and decode entries (sd-kv-entries)
// attend through key/value caches that live in plan state.
//
// Both entries take position_ids [batch, seq] (each token's position in its
// row). Every fused attention must be a causal self-attention: q [B, H, T, d],
// keys transposed [B, H, d, T], values [B, H, T, dv], and a constant mask that
// hides exactly the keys after each query. It becomes
//   sd.cached_attention(q, k, v, load(kv_cache/i/key), load(kv_cache/i/value), positions)
// whose updated caches are stored back (in place, so a decode step replays
// with the same addresses). k and v are taken from before the repeat-kv
// expansion (Unsqueeze/Reshape -> Expand -> Reshape) when the model has one,
// so grouped-query models cache their kv heads once.
// Positions the model derived from arange(seq) follow position_ids instead:
// the learned position embedding's lookup, and the rotary cos/sin, which
// are constants [1, seq, W] here; their tables of positions 0..max-1 come from
// the same rotary in the kv_probe entry (specialized at the maximum length),
// checked against the entry's own first rows. kv_probe is erased.
#include "sd/format/training_abi.h"
#include "EntryInputs.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "PositionLookups.h"
#include "vjp/GradBuilder.h"
#include <cmath>

namespace sd {
#define GEN_PASS_DEF_KVCACHE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

constexpr const char *kFlag = "--kv-cache";

// kfull [B, H, T, d] = Reshape(Expand(Unsqueeze|Reshape(k [B, Hkv, T, d]) [B, Hkv, 1, T, d]) [B, Hkv, n, T, d]):
// Hugging Face's repeat_kv. Returns k, or kfull itself when there is no such chain.
Value beforeRepeatKv(Value full) {
  ArrayRef<int64_t> f = shapeOf(full);
  auto reshape = full.getDefiningOp<ReshapeOp>();
  if (!reshape) return full;
  auto expand = reshape.getLhs().getDefiningOp<ExpandOp>();
  if (!expand) return full;
  ArrayRef<int64_t> e = shapeOf(expand.getResult());
  if (e.size() != 5 || e[0] != f[0] || e[1] * e[2] != f[1] || e[3] != f[2] || e[4] != f[3]) return full;
  Value unexpanded = expand.getLhs();
  ArrayRef<int64_t> u = shapeOf(unexpanded);
  if (u.size() != 5 || u[0] != e[0] || u[1] != e[1] || u[2] != 1 || u[3] != e[3] || u[4] != e[4]) return full;
  Operation *def = unexpanded.getDefiningOp();
  if (!def || !isa<UnsqueezeOp, ReshapeOp>(def)) return full;
  Value k = def->getOperand(0);
  ArrayRef<int64_t> s = shapeOf(k);
  if (s.size() != 4 || s[0] != e[0] || s[1] != e[1] || s[2] != e[3] || s[3] != e[4]) return full;
  return k;
}

// The mask hides exactly the keys after each query: masked[.., i, j] == (j > i).
bool isCausalMask(Value mask, int64_t steps) {
  if (isa<NoneType>(mask.getType())) return false;
  auto dense = dyn_cast_or_null<DenseElementsAttr>(constantValue(mask));
  ArrayRef<int64_t> m = shapeOf(mask);
  if (!dense || m.size() < 2 || m[m.size() - 1] != steps || m[m.size() - 2] != steps) return false;
  int64_t i = 0;
  for (bool masked : dense.getValues<bool>()) {
    int64_t row = (i / steps) % steps, col = i % steps;
    if (masked != (col > row)) return false;
    ++i;
  }
  return true;
}

struct KvCachePass : sd::impl::KvCacheBase<KvCachePass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    func::FuncOp probe;
    SmallVector<func::FuncOp> entries;
    for (auto f : module.getOps<func::FuncOp>()) {
      auto entry = f->getAttrOfType<StringAttr>("sd.entry");
      if (!entry) continue;
      if (entry.getValue() == sd::abi::kKvProbe) probe = f;
      if (entry.getValue() == sd::abi::kPrefill || entry.getValue() == sd::abi::kDecode ||
          entry.getValue() == sd::abi::kVerify)
        entries.push_back(f);
    }
    if (!probe) return;
    int64_t maxLength = shapeOf(probe.getArgument(0))[1];
    for (func::FuncOp f : entries)
      if (failed(cache(module, f, probe, maxLength))) return signalPassFailure();
    probeAngles.clear();
    probe.erase();
  }

  // The kv_probe's cos/sin tables, folded once for both entries.
  llvm::DenseMap<Value, DenseElementsAttr> probeAngles;

  LogicalResult cache(ModuleOp module, func::FuncOp f, func::FuncOp probe, int64_t maxLength) {
    Value tokens;
    int positionsArg = -1;
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      auto name = f.getArgAttrOfType<StringAttr>(i, "sd.name");
      if (name && name.getValue() == sd::abi::kPositionIds) positionsArg = int(i);
      else if (!tokens && sd::isTokenShaped(f.getArgument(i))) tokens = f.getArgument(i);
    }
    if (!tokens) return f.emitError() << kFlag << ": the entry has no int64 [batch, seq] token input";
    ArrayRef<int64_t> rows = shapeOf(tokens);
    int64_t batch = rows[0], steps = rows[1];
    OpBuilder b(f.getContext());
    bool ownPositions = positionsArg >= 0; // the model takes position_ids and computes from them itself
    if (!ownPositions) {
      positionsArg = int(f.getNumArguments());
      NamedAttribute name(b.getStringAttr("sd.name"), b.getStringAttr(sd::abi::kPositionIds));
      f.insertArgument(unsigned(positionsArg), RankedTensorType::get({batch, steps}, b.getI64Type()),
                       b.getDictionaryAttr({name}), f.getLoc());
    }
    Value positions = f.getArgument(unsigned(positionsArg));
    if (!ownPositions) {
      int found = 0;
      if (failed(sd::replacePositionLookups(f, positions, steps, kFlag, found)) ||
          failed(indexRotaryTables(f, probe, positions, steps, maxLength)))
        return failure();
    }

    SmallVector<AttentionOp> attentions;
    f.walk([&](AttentionOp a) { attentions.push_back(a); });
    if (attentions.empty())
      return f.emitError() << kFlag << ": the model has no attention that sd-fuse-attention recognized";
    for (auto [layer, a] : llvm::enumerate(attentions))
      if (failed(cacheAttention(module, a, positions, batch, steps, maxLength, layer))) return failure();
    return success();
  }

  LogicalResult cacheAttention(ModuleOp module, AttentionOp a, Value positions, int64_t batch, int64_t steps,
                               int64_t maxLength, size_t layer) {
    ArrayRef<int64_t> q = shapeOf(a.getQ()), kt = shapeOf(a.getKt()), v = shapeOf(a.getV());
    if (q.size() != 4 || kt.size() != 4 || v.size() != 4 || q[0] != batch || q[2] != steps || kt[0] != batch ||
        kt[1] != q[1] || kt[2] != q[3] || kt[3] != steps || v[0] != batch || v[1] != q[1] || v[2] != steps)
      return a.emitError() << kFlag << ": " << sd::describeNode(a)
                           << " is not a self-attention over q [batch, heads, seq, d] with keys and values of the "
                              "same heads and positions";
    if (!isa<NoneType>(a.getPositions().getType()) || !isCausalMask(a.getMask(), steps))
      return a.emitError() << kFlag << ": " << sd::describeNode(a)
                           << " is not causal (its mask is not the constant causal mask), so it cannot attend "
                              "through a cache";
    OpBuilder b(a);
    sd::ir::GradBuilder g(b, a.getLoc());
    Value keys; // [B, H, T, d]
    if (auto t = a.getKt().getDefiningOp<TransposeOp>()) {
      SmallVector<int64_t> perm;
      if (auto p = t.getPerm()) perm.assign(p->begin(), p->end());
      if (perm == SmallVector<int64_t>{0, 1, 3, 2}) keys = t.getInput();
    }
    if (!keys) keys = g.swapLastTwo(a.getKt());
    Value k = beforeRepeatKv(keys), values = beforeRepeatKv(a.getV());
    if (shapeOf(k)[1] != shapeOf(values)[1]) { // only one is seen through: cache both expanded
      k = keys;
      values = a.getV();
    }
    ArrayRef<int64_t> ks = shapeOf(k), vs = shapeOf(values);
    auto element = b.getF32Type();
    std::string prefix = sd::abi::kKvCachePrefix + std::to_string(layer);
    auto keyType = RankedTensorType::get({batch, ks[1], maxLength, ks[3]}, element);
    auto valueType = RankedTensorType::get({batch, vs[1], maxLength, vs[3]}, element);
    sd::ir::GlobalOp kc = sd::getOrCreateGlobal(module, prefix + "/key", keyType, "kv_cache");
    sd::ir::GlobalOp vc = sd::getOrCreateGlobal(module, prefix + "/value", valueType, "kv_cache");
    if (kc.getType() != keyType || vc.getType() != valueType)
      return a.emitError() << kFlag << ": the prefill and decode entries disagree on layer " << layer
                           << "'s cache shape";
    Value kLoad = b.create<GlobalLoadOp>(a.getLoc(), keyType, kc.getSymName());
    Value vLoad = b.create<GlobalLoadOp>(a.getLoc(), valueType, vc.getSymName());
    SmallVector<NamedAttribute> attrs;
    if (Attribute s = a->getAttr("scale")) attrs.push_back(b.getNamedAttr("scale", s));
    else attrs.push_back(b.getNamedAttr("scale", b.getF32FloatAttr(1.0f)));
    Operation *cached = g.op<CachedAttentionOp>({a.getQ(), k, values, kLoad, vLoad, positions}, attrs, 3);
    if (!cached || g.failed()) return failure();
    b.create<GlobalStoreOp>(a.getLoc(), kc.getSymName(), cached->getResult(1));
    b.create<GlobalStoreOp>(a.getLoc(), vc.getSymName(), cached->getResult(2));
    a.getY().replaceAllUsesWith(cached->getResult(0));
    a.erase();
    return success();
  }

  // Rotary cos/sin constants [1, seq, W] of positions 0..seq-1 become the
  // kv_probe's tables of positions 0..max-1, read at position_ids.
  LogicalResult indexRotaryTables(func::FuncOp f, func::FuncOp probe, Value positions, int64_t steps,
                                  int64_t maxLength) {
    SmallVector<RotaryOp> rotaries, probes;
    f.walk([&](RotaryOp r) { rotaries.push_back(r); });
    probe.walk([&](RotaryOp r) { probes.push_back(r); });
    if (rotaries.size() != probes.size())
      return f.emitError() << kFlag << ": the model has " << rotaries.size() << " rotary embeddings at " << steps
                           << " tokens but " << probes.size() << " at " << maxLength;
    for (auto [r, p] : llvm::zip(rotaries, probes)) {
      if (!isa<NoneType>(r.getPositions().getType())) {
        // Tables read at constant positions 0..seq-1 in every row (a contrib
        // GroupQueryAttention's, once its seqlens folded): read at position_ids.
        auto at = dyn_cast_or_null<DenseIntElementsAttr>(constantValue(r.getPositions()));
        bool arange = at && at.getNumElements() > 0;
        int64_t i = 0;
        if (arange)
          for (const APInt &x : at.getValues<APInt>()) arange = arange && x.getSExtValue() == i++ % steps;
        if (!arange)
          return r.emitError() << kFlag << ": " << sd::describeNode(r)
                               << " reads its angles at positions computed in the graph, not 0.." << steps - 1;
        if (shapeOf(r.getCos())[0] < maxLength)
          return r.emitError() << kFlag << ": " << sd::describeNode(r) << "'s cos/sin tables hold "
                               << shapeOf(r.getCos())[0] << " positions, fewer than the cache's " << maxLength;
        r->setOperand(3, positions);
        continue;
      }
      SmallVector<Value, 2> tables;
      for (auto [angles, full] : {std::pair{r.getCos(), p.getCos()}, std::pair{r.getSin(), p.getSin()}}) {
        DenseElementsAttr mine = sd::foldPositionFree(angles), &all = probeAngles[full];
        if (!all) all = sd::foldPositionFree(full);
        ArrayRef<int64_t> ms = shapeOf(angles), fs = shapeOf(full);
        if (!mine || !all || ms.size() != 3 || ms[0] != 1 || ms[1] != steps || fs.size() != 3 || fs[0] != 1 ||
            fs[1] != maxLength || fs[2] != ms[2] || !mine.getElementType().isF32())
          return r.emitError() << kFlag << ": the rotary embedding " << sd::describeNode(r)
                               << " takes angles computed in the graph, not constant cos/sin of positions 0.."
                               << steps - 1 << "; export the model with a position_ids input";
        // The probe's first rows must be this entry's: then its rows are the angles of positions 0..max-1.
        auto got = mine.getValues<float>(), want = all.getValues<float>();
        for (int64_t i = 0, n = mine.getNumElements(); i < n; ++i)
          if (std::fabs(got[i] - want[i]) > 1e-5f * std::max(1.0f, std::fabs(want[i])))
            return r.emitError() << kFlag << ": the rotary angles of " << sd::describeNode(r)
                                 << " depend on the sequence length, not on the position alone";
        OpBuilder b(r);
        auto table = RankedTensorType::get({maxLength, fs[2]}, mine.getElementType());
        tables.push_back(b.create<ConstantOp>(r.getLoc(), table, all.reshape(table)).getResult());
      }
      r->setOperand(1, tables[0]);
      r->setOperand(2, tables[1]);
      r->setOperand(3, positions);
    }
    return success();
  }
};

} // namespace
