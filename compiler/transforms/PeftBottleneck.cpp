// sd-peft-bottleneck: bottleneck adapters (Houlsby, Pfeiffer, parallel) as
// AdapterHub's `adapters` library inserts them into a transformer (pre-LN,
// or post-LN as BERT): f(u) = up(act(down(u))) added to a block's residual sum.
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "llvm/ADT/StringExtras.h"
#include "sd/format/peft.h"
#include <cmath>
#include <cstring>
#include <random>
#include <set>

namespace sd {
#define GEN_PASS_DEF_PEFTBOTTLENECK
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// A sublayer's end: z = h + r, where h is the last linear layer's result
// (through reshapes) and r the residual stream it is added to.
struct Residual {
  LinearOp linear;
  AddOp add;
  Value h;
  bool attention = false; // the linear projects an attention's output (AdapterHub's mh_adapter place)
  LayerNormalizationOp postNorm; // post-LN: the block's LayerNorm of z (BERT); null: pre-LN
  // r as the add reads it now: an adapter before this one may have replaced it.
  Value stream() const { return add->getOperand(0) == h ? add->getOperand(1) : add->getOperand(0); }
};

// A module's layer: its name up to its last all-digit part
// ("model.layers.3"), which AdapterHub's parameter names and leave_out use.
struct Layer {
  std::string prefix;
  int64_t number;
};

// Shapes that may be equal (before specialization, some extents are unknown).
bool mayBeSameShape(Value a, Value b) {
  auto ta = dyn_cast<RankedTensorType>(a.getType()), tb = dyn_cast<RankedTensorType>(b.getType());
  if (!ta || !tb || ta.getRank() != tb.getRank() || ta.getElementType() != tb.getElementType()) return false;
  for (auto [x, y] : llvm::zip(ta.getShape(), tb.getShape()))
    if (x != y && !ShapedType::isDynamic(x) && !ShapedType::isDynamic(y)) return false;
  return true;
}

// The value `v` stands for before reshapes and transposes.
Value throughViews(Value v) {
  while (Operation *def = v.getDefiningOp()) {
    if (!isa<ReshapeOp, TransposeOp>(def)) break;
    v = def->getOperand(0);
  }
  return v;
}

bool isNorm(Value v) {
  Operation *def = v.getDefiningOp();
  return def && isa<LayerNormalizationOp, RMSNormalizationOp>(def);
}

struct PeftBottleneckPass : sd::impl::PeftBottleneckBase<PeftBottleneckPass> {
  using PeftBottleneckBase::PeftBottleneckBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    defaults = sd::bottleneckDefaults(config);
    if (!defaults) {
      module.emitError() << "--bottleneck-config takes seq_bn, double_seq_bn or par_bn, got '" << config << "'";
      return signalPassFailure();
    }
    if (nonLinearity.empty()) nonLinearity = defaults->nonLinearity;
    if (init.empty()) init = defaults->initWeights;
    if (reductionFactor < 0) reductionFactor = defaults->reductionFactor;
    if (!(reductionFactor > 0)) {
      module.emitError() << "--reduction-factor must be positive, got " << reductionFactor;
      return signalPassFailure();
    }
    if (!llvm::is_contained(sd::kBottleneckActivations, StringRef(nonLinearity))) {
      module.emitError() << "--non-linearity takes relu, swish, silu, gelu, gelu_new, tanh, sigmoid or leakyrelu, got '"
                         << nonLinearity << "'";
      return signalPassFailure();
    }
    if (!scalingKind.empty() && scalingKind != "learned" && scalingKind != "channel") {
      module.emitError() << "--adapter-scaling takes a number, learned or channel, got '" << scalingKind << "'";
      return signalPassFailure();
    }
    if (init != "bert" && init != "mam_adapter" && init != "houlsby") {
      module.emitError() << "--bottleneck-init takes bert, mam_adapter or houlsby, got '" << init << "'";
      return signalPassFailure();
    }
    std::set<int64_t> skipped;
    SmallVector<StringRef> parts;
    StringRef(leaveOut).split(parts, ',', -1, false);
    for (StringRef p : parts) {
      int64_t layer;
      if (p.trim().getAsInteger(10, layer) || layer < 0) {
        module.emitError() << "--leave-out takes layer numbers separated by commas, got '" << leaveOut << "'";
        return signalPassFailure();
      }
      skipped.insert(layer);
    }
    // The model's own weights stay frozen: only the adapters train.
    for (GlobalOp g : module.getOps<GlobalOp>())
      if (g.getRole() == "trainable") g.setRole("frozen");

    SmallVector<Residual> sites;
    module.walk([&](LinearOp l) {
      if (auto site = residualOf(l)) sites.push_back(*site);
    });
    // AdapterHub's places: after the attention block (mh_adapter: double_seq_bn)
    // and after the feed-forward block (output_adapter: all three).
    bool attentionToo = defaults->mhAdapter;
    std::mt19937_64 rng{uint64_t(seed)};
    Builder b(module.getContext());
    SmallVector<Attribute> modules, places;
    std::set<int64_t> leftOut;
    int64_t feedForward = 0, hidden = 0;
    for (Residual &s : sites) {
      feedForward += !s.attention;
      if (s.attention && !attentionToo) continue;
      FailureOr<Layer> layer = layerOf(s.linear);
      if (failed(layer)) return signalPassFailure();
      if (skipped.count(layer->number)) {
        leftOut.insert(layer->number);
        continue;
      }
      // Post-LN (BERT): the stream is a norm's output, and the sum goes
      // through the block's own LayerNorm, which AdapterHub hands the adapter.
      if (isNorm(s.stream())) {
        Value z = s.add->getResult(0);
        s.postNorm = z.hasOneUse() ? dyn_cast<LayerNormalizationOp>(*z.getUsers().begin()) : LayerNormalizationOp();
        if (!s.postNorm || s.postNorm.getX() != z) {
          s.linear.emitError() << "module '" << s.linear.getModule()
                               << "': the stream its block adds to is a norm's output, but the sum is not "
                                  "LayerNorm-ed next: neither a pre-LN nor a post-LN block";
          return signalPassFailure();
        }
      }
      std::string place = placeOf(s, *layer);
      if (failed(adapt(module, s, place, rng))) return signalPassFailure();
      hidden = sd::linearInOut(s.linear).second;
      modules.push_back(b.getStringAttr(s.linear.getModule()));
      places.push_back(b.getStringAttr(place));
    }
    if (!feedForward) {
      module.emitError() << "--peft bottleneck: no residual sublayer found (a linear layer whose result is added to "
                            "the residual stream)";
      return signalPassFailure();
    }
    if (leftOut.size() != skipped.size()) {
      module.emitError() << "--leave-out '" << leaveOut << "' names layer " << *llvm::find_if(skipped, [&](int64_t l) {
        return !leftOut.count(l);
      }) << ", which has no block to adapt";
      return signalPassFailure();
    }
    if (modules.empty()) {
      module.emitError() << "--leave-out '" << leaveOut << "' leaves every layer without adapters";
      return signalPassFailure();
    }
    SmallVector<int64_t> leave(skipped.begin(), skipped.end());
    module->setAttr("sd.peft", b.getDictionaryAttr({
                                   b.getNamedAttr("peft_type", b.getStringAttr("BOTTLENECK")),
                                   b.getNamedAttr("config", b.getStringAttr(config)),
                                   b.getNamedAttr("reduction_factor", b.getF64FloatAttr(reductionFactor)),
                                   b.getNamedAttr("non_linearity", b.getStringAttr(nonLinearity)),
                                   b.getNamedAttr("scaling", b.getF64FloatAttr(scale())),
                                   b.getNamedAttr("scaling_kind", b.getStringAttr(scalingKind)),
                                   b.getNamedAttr("use_gating", b.getBoolAttr(useGating)),
                                   b.getNamedAttr("init_weights", b.getStringAttr(init)),
                                   b.getNamedAttr("modules", b.getArrayAttr(modules)),
                                   b.getNamedAttr("places", b.getArrayAttr(places)),
                                   b.getNamedAttr("hidden_size", b.getI64IntegerAttr(hidden)),
                                   b.getNamedAttr("leave_out", b.getI64ArrayAttr(leave)),
                               }));
  }

  const sd::BottleneckDefaults *defaults = nullptr; // the configuration's (checked first)
  double scale() const { return scaling >= 0 ? double(scaling) : defaults->scaling; }

  // `l`'s result, through reshapes, summed by an Add with a value of its shape
  // that is not a constant (a residual, not a bias).
  static std::optional<Residual> residualOf(LinearOp l) {
    Value h = l.getOutput();
    while (h.hasOneUse() && isa<ReshapeOp>(*h.getUsers().begin())) h = h.getUsers().begin()->getResult(0);
    if (!h.hasOneUse()) return std::nullopt;
    auto add = dyn_cast<AddOp>(*h.getUsers().begin());
    if (!add) return std::nullopt;
    Value r = add->getOperand(0) == h ? add->getOperand(1) : add->getOperand(0);
    if (!mayBeSameShape(r, h) || !mayBeSameShape(add->getResult(0), h)) return std::nullopt;
    if (Operation *def = r.getDefiningOp(); def && (isa<GlobalLoadOp>(def) || def->hasTrait<OpTrait::ConstantLike>()))
      return std::nullopt;
    Residual s{l, add, h};
    Operation *src = throughViews(l.getInput()).getDefiningOp();
    s.attention = src && isa<AttentionOp, MatMulOp>(src);
    return s;
  }

  static FailureOr<Layer> layerOf(LinearOp l) {
    SmallVector<StringRef> parts;
    l.getModule().split(parts, '.');
    for (int i = int(parts.size()) - 1; i >= 0; --i) {
      int64_t n;
      if (parts[size_t(i)].empty() || !llvm::all_of(parts[size_t(i)], llvm::isDigit) ||
          parts[size_t(i)].getAsInteger(10, n))
        continue;
      return Layer{llvm::join(ArrayRef<StringRef>(parts).take_front(size_t(i) + 1), "."), n};
    }
    return l.emitError() << "module '" << l.getModule() << "': no layer number in its name, to name its adapter by";
  }
  // AdapterHub's parameter prefix: in the BERT family the block's output
  // module (`encoder.layer.0.output`, the owner of the layer named
  // ...output.dense), elsewhere the layer and the place.
  static std::string placeOf(Residual s, const Layer &layer) {
    StringRef m = s.linear.getModule();
    if (m.ends_with(".output.dense")) return m.drop_back(strlen(".dense")).str();
    return layer.prefix + (s.attention ? ".attention_adapters" : ".output_adapters");
  }

  Value activate(GradBuilder &g, Value x) {
    OpBuilder &b = g.builder();
    if (nonLinearity == "relu") return g.make<ReluOp>({x});
    if (nonLinearity == "tanh") return g.make<TanhOp>({x});
    if (nonLinearity == "sigmoid") return g.make<SigmoidOp>({x});
    if (nonLinearity == "leakyrelu") // torch's leaky_relu: slope 0.01
      return g.make<LeakyReluOp>({x}, {b.getNamedAttr("alpha", b.getF32FloatAttr(0.01f))});
    if (nonLinearity == "gelu") return g.make<GeluOp>({x});
    if (nonLinearity == "gelu_new") return g.make<GeluOp>({x}, {b.getNamedAttr("approximate", b.getStringAttr("tanh"))});
    return g.make<SwishOp>({x}); // swish, silu: x sigmoid(x)
  }

  // down [n, d] and up [d, n] weights as AdapterHub starts them ("bert":
  // N(0, 0.02); "mam_adapter": down kaiming-uniform, up zero; "houlsby":
  // N(0, 0.01) cut at 2 std), biases zero.
  void startWeights(int64_t d, int64_t n, std::mt19937_64 &rng, std::vector<float> &down, std::vector<float> &up) {
    if (init == "mam_adapter") {
      down = sd::kaimingUniform(n, d, rng);
      up.assign(size_t(d * n), 0.0f);
      return;
    }
    double std = init == "bert" ? 0.02 : 0.01;
    std::normal_distribution<double> normal(0.0, std);
    auto draw = [&] {
      for (;;) {
        double v = normal(rng);
        if (init == "bert" || std::abs(v) <= 2 * std) return float(v);
      }
    };
    down.resize(size_t(n * d));
    for (float &v : down) v = draw();
    up.resize(size_t(d * n));
    for (float &v : up) v = draw();
  }

  // The gate's start: AdapterHub's init_bert_weights (N(0, 0.02), bias 0)
  // for bert and mam_adapter; houlsby leaves nn.Linear's own (weight and bias
  // U(-1/sqrt(d), 1/sqrt(d))).
  void gateWeights(int64_t d, std::mt19937_64 &rng, std::vector<float> &w, std::vector<float> &bias) {
    if (init == "houlsby") {
      w = sd::kaimingUniform(1, d, rng);
      bias = sd::uniformFloats(1, 1.0 / std::sqrt(double(d)), rng);
      return;
    }
    std::normal_distribution<double> normal(0.0, 0.02);
    w.resize(size_t(d));
    for (float &v : w) v = float(normal(rng));
  }

  // z' = z + s f(u): u is z (seq_bn), h (double_seq_bn) or r (par_bn), as
  // AdapterHub's pre_forward and post_forward give them (post-LN: see u below).
  LogicalResult adapt(ModuleOp module, Residual s, const std::string &place, std::mt19937_64 &rng) {
    if (!cast<RankedTensorType>(s.h.getType()).getElementType().isF32())
      return s.linear.emitError("bottleneck adapters on non-f32 layers are not supported yet");
    int64_t d = sd::linearInOut(s.linear).second;
    int64_t n = std::max<int64_t>(1, int64_t(std::floor(double(d) / reductionFactor)));
    std::vector<float> downW, upW, downB(size_t(n), 0.0f), upB(size_t(d), 0.0f);
    startWeights(d, n, rng, downW, upW);
    std::string prefix = place + ".adapters.bottleneck.";
    GlobalOp gdw = sd::createFloatGlobal(module, prefix + "adapter_down.0.weight", {n, d}, "trainable", &downW);
    GlobalOp gdb = sd::createFloatGlobal(module, prefix + "adapter_down.0.bias", {n}, "trainable", &downB);
    GlobalOp guw = sd::createFloatGlobal(module, prefix + "adapter_up.weight", {d, n}, "trainable", &upW);
    GlobalOp gub = sd::createFloatGlobal(module, prefix + "adapter_up.bias", {d}, "trainable", &upB);
    Value z = s.add->getResult(0);
    OpBuilder b(s.add);
    // Post-LN: the adapter goes before the block's LayerNorm, which then reads z'.
    if (s.postNorm) b.setInsertionPoint(s.postNorm);
    else b.setInsertionPointAfter(s.add);
    GradBuilder g(b, s.add->getLoc());
    auto load = [&](GlobalOp gl) { return b.create<GlobalLoadOp>(s.add->getLoc(), gl.getType(), gl.getSymName()); };
    Value r = s.stream();
    SmallVector<OpOperand *> readers = sd::usesOf(z);
    // seq_bn's input: the sum, or in a post-LN block the sum through the
    // block's LayerNorm (AdapterHub's original_ln_before), which then also
    // normalizes z' (original_ln_after): the LayerNorm runs twice.
    Value u = config == "double_seq_bn" ? s.h : config == "par_bn" ? r
              : s.postNorm ? b.clone(*s.postNorm)->getResult(0) : z;
    auto layer = [&](Value x, GlobalOp w, GlobalOp bias, StringRef name) {
      return g.make<LinearOp>({x, load(w), load(bias)}, {b.getNamedAttr("layout", b.getStringAttr("oi")),
                                                         b.getNamedAttr("module", b.getStringAttr(prefix + name))});
    };
    Value down = activate(g, layer(u, gdw, gdb, "adapter_down.0"));
    Value up = layer(down, guw, gub, "adapter_up");
    if (!scalingKind.empty()) { // AdapterHub's learned scaling: a trained factor, or one per feature
      std::vector<float> ones(size_t(scalingKind == "channel" ? d : 1), 1.0f);
      up = g.mul(up, load(sd::createFloatGlobal(module, prefix + "scaling", {int64_t(ones.size())}, "trainable", &ones)));
    } else if (scale() != 1.0) {
      up = g.scale(up, scale());
    }
    if (useGating) { // times the mean over the sequence of sigmoid(gate(u)), [batch, 1, 1]
      if (cast<RankedTensorType>(u.getType()).getRank() != 3)
        return s.linear.emitError() << "--use-gating needs the adapter's input as [batch, sequence, hidden], got rank "
                                    << cast<RankedTensorType>(u.getType()).getRank();
      std::vector<float> gw, gb(1, 0.0f);
      gateWeights(d, rng, gw, gb);
      GlobalOp ggw = sd::createFloatGlobal(module, prefix + "gate.weight", {1, d}, "trainable", &gw);
      GlobalOp ggb = sd::createFloatGlobal(module, prefix + "gate.bias", {1}, "trainable", &gb);
      Value gate = g.make<SigmoidOp>({layer(u, ggw, ggb, "gate")});
      up = g.mul(up, g.make<ReduceMeanOp>({gate, g.ints({1})}, {g.attr("keepdims", int64_t(1))}));
    }
    Value sum = g.add(z, up);
    if (!sum || g.failed()) return failure();
    for (OpOperand *r : readers) r->set(sum);
    return success();
  }
};

} // namespace
