// sd-peft-lora: low-rank adapters on the sd.linear modules PEFT would match
// (with dora: weight-decomposed, a trained magnitude per output row; with
// init pissa, olora or loftq: started from the base weight, rewritten).
#include "sd/format/training_abi.h"
#include "GlobalData.h"
#include "LoraBaseStart.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "sd/format/peft.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "llvm/ADT/StringExtras.h"
#include <cmath>
#include <random>

namespace sd {
#define GEN_PASS_DEF_PEFTLORA
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct PeftLoraPass : sd::impl::PeftLoraBase<PeftLoraPass> {
  using PeftLoraBase::PeftLoraBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (rank < 1) {
      module.emitError() << "--lora-r must be at least 1, got " << rank;
      return signalPassFailure();
    }
    if (!(dropout >= 0.0 && dropout < 1.0)) {
      module.emitError() << "--lora-dropout must be in [0, 1), got " << dropout;
      return signalPassFailure();
    }
    if (init != "default" && init != "gaussian" && !sd::rewritesBaseWeight(init)) {
      module.emitError() << "--lora-init takes default, gaussian, pissa, olora or loftq, got '" << init << "'";
      return signalPassFailure();
    }
    if (sd::rewritesBaseWeight(init) && dora) {
      module.emitError() << "--lora-init " << init << " with --use-dora is not supported: DoRA's magnitude starts "
                         << "from the base weight, which " << init << " rewrites";
      return signalPassFailure();
    }
    if (init == "loftq" && loftqIter < 1) {
      module.emitError() << "--loftq-iter must be at least 1, got " << loftqIter;
      return signalPassFailure();
    }
    SmallVector<LinearOp> linears;
    if (failed(sd::adapterTargets(module, targetModules, linears))) return signalPassFailure();
    std::mt19937_64 rng{static_cast<uint64_t>(seed)};
    double scale = sd::loraScale(alpha, rank, rslora);
    std::set<std::string> adapted;
    bool allInOut = true; // PEFT's fan_in_fan_out: every adapted PyTorch weight is [in, out]
    for (auto [stream, l] : llvm::enumerate(linears)) {
      allInOut &= sd::storedInOut(l);
      if (failed(adapt(module, l, scale, int64_t(stream), rng))) return signalPassFailure();
      adapted.insert(l.getModule().str());
    }
    FailureOr<SmallVector<Attribute>> biases = trainBiases(module, linears);
    if (failed(biases)) return signalPassFailure();
    Builder b(module.getContext());
    SmallVector<Attribute> names;
    for (const std::string &m : adapted) names.push_back(b.getStringAttr(m));
    SmallVector<NamedAttribute> fields = {
        b.getNamedAttr("peft_type", b.getStringAttr("LORA")),
        b.getNamedAttr("r", b.getI64IntegerAttr(rank)),
        b.getNamedAttr("lora_alpha", b.getF64FloatAttr(alpha)),
        b.getNamedAttr("lora_dropout", b.getF64FloatAttr(dropout)),
        b.getNamedAttr("use_rslora", b.getBoolAttr(rslora)),
        b.getNamedAttr("use_dora", b.getBoolAttr(dora)),
        b.getNamedAttr("fan_in_fan_out", b.getBoolAttr(allInOut && !adapted.empty())),
        b.getNamedAttr("init_lora_weights", b.getStringAttr(init)),
        b.getNamedAttr("target_modules", b.getStringAttr(targetModules)),
        b.getNamedAttr("modules", b.getArrayAttr(names)),
        b.getNamedAttr("bias", b.getStringAttr(bias)),
        b.getNamedAttr("trained_biases", b.getArrayAttr(*biases)),
    };
    if (init == "loftq") fields.push_back(b.getNamedAttr("loftq_iter", b.getI64IntegerAttr(loftqIter)));
    module->setAttr("sd.peft", b.getDictionaryAttr(fields));
  }

  // PEFT's bias: "all" trains every parameter whose name contains "bias"
  // (LayerNorm's too), "lora_only" the adapted layers' own biases. Their
  // names, sorted.
  FailureOr<SmallVector<Attribute>> trainBiases(ModuleOp module, ArrayRef<LinearOp> linears) {
    if (bias != "none" && bias != "all" && bias != "lora_only") {
      module.emitError() << "--bias takes 'none', 'all' or 'lora_only', got '" << bias << "'";
      return failure();
    }
    std::set<std::string> names;
    auto train = [&](GlobalOp g) {
      auto t = cast<RankedTensorType>(g.getType());
      if (g.getRole() != "frozen" || !isa<FloatType>(t.getElementType())) return;
      g.setRole("trainable");
      names.insert(g.getSymName().str());
    };
    if (bias == "all")
      for (GlobalOp g : module.getOps<GlobalOp>())
        if (g.getSymName().contains("bias")) train(g);
    if (bias == "lora_only")
      for (LinearOp l : linears)
        if (GlobalOp g = sd::frozenGlobalOf(l.getBias())) train(g);
    if (bias != "none" && names.empty()) {
      module.emitError() << "--bias " << bias << ": no bias of "
                         << (bias == "all" ? "the model" : "the adapted layers") << " to train";
      return failure();
    }
    SmallVector<Attribute> out;
    for (const std::string &n : names) out.push_back(StringAttr::get(module.getContext(), n));
    return out;
  }

  LogicalResult adapt(ModuleOp module, LinearOp l, double scale, int64_t stream, std::mt19937_64 &rng) {
    auto wt = cast<RankedTensorType>(l.getWeight().getType());
    auto [in, out] = sd::linearInOut(l);
    std::string m = l.getModule().str();
    // PEFT: A = kaiming_uniform_(a=sqrt(5)) -> U(-1/sqrt(in), 1/sqrt(in)); gaussian: N(0, 1/r). B = 0.
    std::vector<float> a, bInit;
    if (sd::rewritesBaseWeight(init)) {
      if (failed(startFromBase(l, scale, a, bInit))) return failure();
    } else if (init == "gaussian") {
      std::normal_distribution<double> d(0.0, 1.0 / double(rank));
      for (int64_t i = 0; i < rank * in; ++i) a.push_back(float(d(rng)));
    } else {
      a = sd::kaimingUniform(rank, in, rng);
    }
    Type f32 = Float32Type::get(module.getContext());
    if (wt.getElementType() != f32) return l.emitError("LoRA on non-f32 weights is not supported yet");
    GlobalOp ga = sd::createFloatGlobal(module, m + ".lora_A.weight", {rank, in}, "trainable", &a);
    GlobalOp gb = sd::createFloatGlobal(module, m + ".lora_B.weight", {out, rank}, "trainable",
                                        bInit.empty() ? nullptr : &bInit);
    OpBuilder b(l);
    b.setInsertionPointAfter(l);
    GradBuilder g(b, l.getLoc());
    Value av = b.create<GlobalLoadOp>(l.getLoc(), ga.getType(), ga.getSymName());
    Value bv = b.create<GlobalLoadOp>(l.getLoc(), gb.getType(), gb.getSymName());
    Value x = l.getInput();
    if (dropout > 0) x = sd::adapterDropout(module, g, x, dropout, stream);
    SmallVector<OpOperand *> readers = sd::usesOf(l.getOutput()); // before the adapter reads it too
    Value down = sd::adapterLinear(g, x, av, "oi", m + ".lora_A");
    Value up = sd::adapterLinear(g, down, bv, "oi", m + ".lora_B");
    Value sum = dora ? doraOutput(module, l, x, g.scale(up, scale), ga, gb, scale, g, b)
                     : g.add(l.getOutput(), g.scale(up, scale));
    if (!sum || g.failed()) return failure();
    for (OpOperand *u : readers) u->set(sum);
    return success();
  }

  // PiSSA, OLoRA or LoftQ (LoraBaseStart.h): A and B from the frozen weight,
  // which is rewritten in place, so the weight must be this layer's alone.
  // PEFT's olora and loftq read nn.Linear's [out, in] weight as it is (a
  // Conv1D's [in, out] would give factors of the wrong shapes), so they are
  // refused on GPT-2's layers; pissa transposes it as PEFT does.
  LogicalResult startFromBase(LinearOp l, double scale, std::vector<float> &a, std::vector<float> &bInit) {
    std::string m = l.getModule().str();
    GlobalOp w = sd::frozenGlobalOf(l.getWeight());
    ArrayRef<float> stored = w ? sd::floatsOf(w) : ArrayRef<float>();
    auto [in, out] = sd::linearInOut(l);
    if (int64_t(stored.size()) != in * out)
      return l.emitError() << "--lora-init " << init << " needs module '" << m
                           << "''s weight as a stored f32 weight (the adapter starts from it)";
    bool inOut = l.getLayout() == "io";
    if (sd::storedInOut(l) && init != "pissa")
      return l.emitError() << "--lora-init " << init << " on module '" << m
                           << "', whose weight is stored [in, out] (a Conv1D): PEFT's " << init
                           << " reads it as [out, in] and gives factors of the wrong shapes; use pissa";
    int64_t loads = 0;
    getOperation().walk([&](GlobalLoadOp load) { loads += load.getGlobal() == w.getSymName(); });
    if (loads != 1)
      return l.emitError() << "--lora-init " << init << " rewrites module '" << m << "''s weight '" << w.getSymName()
                           << "', which " << loads << " ops read (a tied weight): not supported";
    std::vector<float> ws(size_t(in * out));
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) ws[size_t(o * in + i)] = stored[size_t(inOut ? i * out + o : o * in + i)];
    sd::LoraBaseStart start;
    std::string error;
    if (!sd::loraBaseStart(init, ws, out, in, rank, scale, loftqIter, start, error))
      return l.emitError() << "--lora-init " << init << " on module '" << m << "': " << error;
    std::vector<float> base(start.base.size());
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) base[size_t(inOut ? i * out + o : o * in + i)] = start.base[size_t(o * in + i)];
    auto type = cast<RankedTensorType>(w.getType());
    std::string blobName = w.getSymName().str() + "." + init;
    w.setInitialValueAttr(DenseResourceElementsAttr::get(
        type, blobName, HeapAsmResourceBlob::allocateAndCopyInferAlign(ArrayRef<float>(base))));
    a = std::move(start.a);
    bInit = std::move(start.b);
    return success();
  }

  // DoRA (PEFT's use_dora): y = m / n * (x Wᵀ + s x Aᵀ Bᵀ) + b with
  // n = |W + s B A| per output row, recomputed each step from detached reads
  // of A and B (no gradient flows through n, as in PEFT and DoRA's paper).
  // The magnitude m starts as W's row norms, so the layer starts as W's.
  Value doraOutput(ModuleOp module, LinearOp l, Value xd, Value scaledUp, GlobalOp ga, GlobalOp gb, double scale,
                   GradBuilder &g, OpBuilder &b) {
    std::string m = l.getModule().str();
    bool oi = l.getLayout() == "oi";
    auto wt = cast<RankedTensorType>(l.getWeight().getType());
    int64_t rows = wt.getDimSize(0), cols = wt.getDimSize(1), out = oi ? rows : cols;
    GlobalOp w = sd::frozenGlobalOf(l.getWeight());
    ArrayRef<float> wv = w ? sd::floatsOf(w) : ArrayRef<float>();
    if (int64_t(wv.size()) != rows * cols) {
      l.emitError() << "DoRA needs module '" << m << "''s weight as a stored f32 weight (its norm starts the magnitude)";
      return {};
    }
    std::vector<double> squares(size_t(out), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) squares[size_t(oi ? r : c)] += double(wv[size_t(r * cols + c)]) * wv[size_t(r * cols + c)];
    std::vector<float> magnitude;
    for (double sq : squares) magnitude.push_back(float(std::sqrt(sq)));
    GlobalOp gm = sd::createFloatGlobal(module, m + ".lora_magnitude_vector", {out}, "trainable", &magnitude);
    Location loc = l.getLoc();
    Value mv = b.create<GlobalLoadOp>(loc, gm.getType(), gm.getSymName());
    auto detached = [&](GlobalOp gl) {
      auto load = b.create<GlobalLoadOp>(loc, gl.getType(), gl.getSymName());
      load->setAttr(sd::kDetachedAttr, b.getUnitAttr());
      return load.getResult();
    };
    Value aD = detached(ga), bD = detached(gb);
    // B A as W is stored: [out, in] ("oi") or its transpose Aᵀ Bᵀ ("io").
    std::string deltaName = m + ".lora_magnitude_vector.delta";
    Value delta = oi ? sd::adapterLinear(g, bD, aD, "io", deltaName)
                     : sd::adapterLinear(g, g.transpose(aD, {1, 0}), bD, "oi", deltaName);
    Value full = g.add(l.getWeight(), g.scale(delta, scale));
    Value norm = g.make<SqrtOp>({g.reduceSum(g.mul(full, full), {oi ? 1 : 0}, false)});
    Value factor = g.div(mv, norm);
    if (dropout > 0) { // PEFT: the base result keeps x; the magnitude's correction reads the dropped x
      Value base = sd::adapterLinear(g, xd, l.getWeight(), l.getLayout(), m + ".lora_magnitude_vector.base");
      Value one = g.scalar(wt.getElementType(), 1.0);
      return g.add(l.getOutput(), g.add(g.mul(g.sub(factor, one), base), g.mul(factor, scaledUp)));
    }
    Value bias = l.getBias();
    bool hasBias = !isa<NoneType>(bias.getType());
    if (hasBias) { // the layer computes x Wᵀ alone; the bias is added after the magnitude's scaling
      OpBuilder before(l);
      l.getBiasMutable().assign(GradBuilder(before, loc).none());
    }
    Value scaled = g.mul(factor, g.add(l.getOutput(), scaledUp));
    return hasBias ? g.add(scaled, bias) : scaled;
  }
};

} // namespace
