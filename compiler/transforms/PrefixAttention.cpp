// sd-prefix-attention: prefix tuning's trained keys and values (PEFT's
// PrefixTuningConfig), once the attention's shapes are known.
//
// PEFT hands the model past_key_values of N positions: every layer's
// attention sees N trained keys and values before the tokens' own (not
// rotated), and the tokens sit at positions N.. . sd-peft-prompt already runs
// each entry on the virtual ids vocab..vocab+N-1 before the tokens, so the
// positions and the causal mask are right; here each layer's keys and values
// at those ids become the trained ones. Selected by id, not by position, so
// the generation entries (the ids fed first, through the cache) get the
// same.
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "sd/format/peft.h"
#include "vjp/GradBuilder.h"
#include <cmath>
#include <random>

namespace sd {
#define GEN_PASS_DEF_PREFIXATTENTION
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

constexpr const char *kWho = "--peft prefix";

struct PrefixAttentionPass : sd::impl::PrefixAttentionBase<PrefixAttentionPass> {
  using PrefixAttentionBase::PrefixAttentionBase;

  // What the trained tensor's shape depends on, the same in every entry.
  struct Heads {
    int64_t layers = 0, kvHeads = 0, headDim = 0;
    bool operator!=(const Heads &o) const { return layers != o.layers || kvHeads != o.kvHeads || headDim != o.headDim; }
  };

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto peft = module->getAttrOfType<DictionaryAttr>("sd.peft");
    auto type = peft ? peft.getAs<StringAttr>("peft_type") : StringAttr();
    if (!type || type.getValue() != "PREFIX_TUNING") return;
    int64_t n = peft.getAs<IntegerAttr>("num_virtual_tokens").getInt();
    int64_t first = peft.getAs<IntegerAttr>("first_virtual_id").getInt();
    GlobalOp prompt;
    Heads made;
    for (auto f : llvm::make_early_inc_range(module.getOps<func::FuncOp>())) {
      Operation *lookup = nullptr;
      f.walk([&](GatherOp g) {
        if (g->hasAttr(sd::kVirtualLookupAttr)) lookup = g;
      });
      if (!lookup) continue;
      SmallVector<AttentionOp> layers;
      f.walk([&](AttentionOp a) { layers.push_back(a); });
      if (layers.empty()) {
        f.emitError() << kWho << ": entry '" << f.getName()
                      << "' has no attention layer (sd-fuse-attention found none) to give the prefix to";
        return signalPassFailure();
      }
      FailureOr<Heads> heads = headsOf(layers);
      if (failed(heads)) return signalPassFailure();
      if (!prompt) {
        made = *heads;
        if (failed(createPrefix(module, n, made))) return signalPassFailure();
        prompt = encoder.embedding;
      } else if (*heads != made) {
        f.emitError() << kWho << ": entry '" << f.getName() << "' has " << heads->layers
                      << " attention layers of other heads than the first entry's " << made.layers;
        return signalPassFailure();
      }
      if (failed(replaceVirtualKeys(lookup, layers, *heads, n, first))) return signalPassFailure();
    }
    if (!prompt) {
      module.emitError() << kWho << ": no entry reads the virtual tokens";
      return signalPassFailure();
    }
    Builder b(module.getContext());
    NamedAttrList attrs(peft);
    attrs.set("token_dim", b.getI64IntegerAttr(made.kvHeads * made.headDim));
    attrs.set("num_layers", b.getI64IntegerAttr(made.layers));
    attrs.set("num_attention_heads", b.getI64IntegerAttr(made.kvHeads));
    attrs.set("prefix_projection", b.getBoolAttr(projection));
    if (projection) attrs.set("encoder_hidden_size", b.getI64IntegerAttr(hiddenSize(made)));
    module->setAttr("sd.peft", attrs.getDictionary(module.getContext()));
  }

  // The trained tensors: the prefix itself ([N, 2 L Hkv d], nn.Embedding's
  // N(0, 1), as PEFT's PrefixEncoder), or with `projection` the embedding
  // [N, Hkv d] and the MLP's two nn.Linear layers (PyTorch's start: weights
  // and biases U(-1/sqrt(in), 1/sqrt(in))), names as PEFT's parameters.
  struct Encoder {
    GlobalOp embedding, w0, b0, w2, b2;
  } encoder;

  int64_t hiddenSize(const Heads &h) const { return encoderHiddenSize > 0 ? int64_t(encoderHiddenSize) : h.kvHeads * h.headDim; }

  LogicalResult createPrefix(ModuleOp module, int64_t n, const Heads &h) {
    std::mt19937_64 rng{uint64_t(seed)};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t tokenDim = h.kvHeads * h.headDim, all = 2 * h.layers * tokenDim, hidden = hiddenSize(h);
    std::vector<float> values(size_t(n * (projection ? tokenDim : all)));
    for (float &v : values) v = normal(rng);
    if (!projection) {
      encoder.embedding = sd::createFloatGlobal(module, sd::kPromptEmbeddings, {n, all}, "trainable", &values);
      return success();
    }
    if (hidden < 1 || hidden > (int64_t(1) << 20))
      return module.emitError() << kWho << ": --encoder-hidden-size must be from 1 to 2^20, got " << hidden;
    encoder.embedding = sd::createFloatGlobal(module, sd::kPrefixEncoderNames[0], {n, tokenDim}, "trainable", &values);
    std::vector<float> w0 = sd::kaimingUniform(hidden, tokenDim, rng);
    std::vector<float> b0 = sd::uniformFloats(size_t(hidden), 1.0 / std::sqrt(double(tokenDim)), rng);
    std::vector<float> w2 = sd::kaimingUniform(all, hidden, rng);
    std::vector<float> b2 = sd::uniformFloats(size_t(all), 1.0 / std::sqrt(double(hidden)), rng);
    encoder.w0 = sd::createFloatGlobal(module, sd::kPrefixEncoderNames[1], {hidden, tokenDim}, "trainable", &w0);
    encoder.b0 = sd::createFloatGlobal(module, sd::kPrefixEncoderNames[2], {hidden}, "trainable", &b0);
    encoder.w2 = sd::createFloatGlobal(module, sd::kPrefixEncoderNames[3], {all, hidden}, "trainable", &w2);
    encoder.b2 = sd::createFloatGlobal(module, sd::kPrefixEncoderNames[4], {all}, "trainable", &b2);
    return success();
  }

  // The prefix's keys and values [N, 2 L Hkv d]: the trained tensor, or the MLP of the embedding.
  Value prefixValues(GradBuilder &g) {
    OpBuilder &b = g.builder();
    auto load = [&](GlobalOp gl) { return b.create<GlobalLoadOp>(g.loc(), gl.getType(), gl.getSymName()).getResult(); };
    if (!projection) return load(encoder.embedding);
    auto linear = [&](Value x, GlobalOp w, GlobalOp bias, const char *module) {
      return g.make<LinearOp>({x, load(w), load(bias)}, {b.getNamedAttr("layout", b.getStringAttr("oi")),
                                                         b.getNamedAttr("module", b.getStringAttr(module))});
    };
    Value hidden = g.make<TanhOp>({linear(load(encoder.embedding), encoder.w0, encoder.b0, "prompt_encoder.transform.0")});
    return linear(hidden, encoder.w2, encoder.b2, "prompt_encoder.transform.2");
  }

  // The layers' query heads H and head size d from q [B, H, T, d], and the
  // key/value heads from the projection the keys come from: a k_proj of
  // Hkv d outputs, or a fused q/k/v one of (H + 2 Hkv) d.
  FailureOr<Heads> headsOf(ArrayRef<AttentionOp> layers) {
    Heads h;
    h.layers = int64_t(layers.size());
    for (AttentionOp layer : layers) {
      AttentionOp a = layer;
      ArrayRef<int64_t> q = shapeOf(a.getQ()), kt = shapeOf(a.getKt()), v = shapeOf(a.getV());
      // Keys and values of every query head (an export's repeated key/value
      // heads) or of the key/value heads themselves (broadcast).
      if (q.size() != 4 || kt.size() != 4 || v.size() != 4 || (a.getLayout() && *a.getLayout() != "") ||
          kt[1] != v[1] || q[1] % kt[1] != 0 || kt[2] != q[3] || v[3] != q[3] ||
          !isa<NoneType>(a.getPositions().getType()))
        return a.emitError() << kWho << ": " << sd::describeNode(a)
                             << " is not a [batch, heads, seq, d] self-attention with keys [batch, heads, d, seq]";
      LinearOp proj = projectionOf(a.getKt());
      int64_t heads = q[1], d = q[3], out = proj ? sd::linearInOut(proj).second : 0;
      int64_t units = d > 0 && out % d == 0 ? out / d : 0;
      int64_t kv = units <= heads ? units : (units - heads) / 2;
      if (kv < 1 || heads % kv != 0 || kt[1] % kv != 0 || (units > heads && units != heads + 2 * kv))
        return a.emitError() << kWho << ": cannot tell the key/value heads of " << sd::describeNode(a)
                             << " (its keys' projection has " << out << " outputs, heads of " << d << ")";
      if (h.headDim && (h.headDim != d || h.kvHeads != kv))
        return a.emitError() << kWho << ": the attention layers differ in heads; prefix tuning needs them equal";
      h.headDim = d;
      h.kvHeads = kv;
    }
    return h;
  }

  // The sd.linear the keys come from (the nearest one upstream).
  static LinearOp projectionOf(Value keys) {
    SmallVector<Value> frontier = {keys};
    for (int depth = 0; depth < 24 && !frontier.empty(); ++depth) {
      SmallVector<Value> next;
      for (Value v : frontier) {
        Operation *op = v.getDefiningOp();
        if (!op) continue;
        if (auto l = dyn_cast<LinearOp>(op)) return l;
        for (Value in : op->getOperands())
          if (isa<RankedTensorType>(in.getType()) && isa<FloatType>(cast<RankedTensorType>(in.getType()).getElementType()))
            next.push_back(in);
      }
      frontier = std::move(next);
    }
    return {};
  }

  // Layer i's keys and values at virtual ids: rows 2i and 2i+1 of each virtual
  // token's embedding, [Hkv, d] each, every head repeated as the layer's keys
  // repeat it (over its H / Hkv query heads, or not at all).
  LogicalResult replaceVirtualKeys(Operation *lookup, ArrayRef<AttentionOp> layers, const Heads &h, int64_t n,
                                   int64_t first) {
    Value ids = lookup->getOperand(1).getDefiningOp() ? lookup->getOperand(1).getDefiningOp()->getOperand(0) : Value();
    auto idType = ids ? dyn_cast<RankedTensorType>(ids.getType()) : RankedTensorType();
    if (!idType || idType.getRank() != 2 || !idType.hasStaticShape())
      return lookup->emitError() << kWho << ": the virtual ids are not a static [batch, seq] value";
    int64_t batch = idType.getDimSize(0), seq = idType.getDimSize(1);
    OpBuilder b(lookup);
    GradBuilder g(b, NameLoc::get(b.getStringAttr("prefix_keys")));
    sd::VirtualIds virtualIds = sd::virtualIdsAmong(g, ids, first);
    Value isVirtual = virtualIds.isVirtual, slot = virtualIds.slot;
    Value all = prefixValues(g);
    Value perLayer = g.reshape(all, {n, 2 * h.layers, h.kvHeads, h.headDim});
    for (auto [i, layer] : llvm::enumerate(layers)) {
      AttentionOp a = layer;
      int64_t heads = shapeOf(a.getKt())[1]; // the key/value heads repeated to the operands' own
      if (shapeOf(a.getKt())[3] != seq)
        return a.emitError() << kWho << ": " << sd::describeNode(a) << " attends over " << shapeOf(a.getKt())[3]
                             << " keys, not the entry's " << seq << " tokens";
      OpBuilder at(a);
      GradBuilder ga(at, a.getLoc());
      // [B, S, H, d]: the virtual token's row for each position, each key/value head repeated.
      auto rows = [&](int64_t which) {
        Value part = ga.make<GatherOp>({perLayer, ga.scalar(at.getI64Type(), double(2 * int64_t(i) + which))},
                                       {ga.attr("axis", 1)});
        Value atIds = ga.make<GatherOp>({part, slot}, {ga.attr("axis", 0)});
        Value spread = ga.make<ExpandOp>({ga.reshape(atIds, {batch, seq, h.kvHeads, 1, h.headDim}),
                                          ga.ints({batch, seq, h.kvHeads, heads / h.kvHeads, h.headDim})});
        return ga.reshape(spread, {batch, seq, heads, h.headDim});
      };
      Value keys = ga.transpose(rows(0), {0, 2, 3, 1});   // [B, H, d, S], as kt
      Value values = ga.transpose(rows(1), {0, 2, 1, 3}); // [B, H, S, d], as v
      Value kt = ga.make<WhereOp>({ga.reshape(isVirtual, {batch, 1, 1, seq}), keys, a.getKt()});
      Value v = ga.make<WhereOp>({ga.reshape(isVirtual, {batch, 1, seq, 1}), values, a.getV()});
      if (ga.failed()) return failure();
      a->setOperand(1, kt);
      a->setOperand(2, v);
    }
    return g.failed() ? failure() : success();
  }
};

} // namespace
