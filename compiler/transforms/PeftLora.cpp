// sd-peft-lora: low-rank adapters on the sd.linear modules PEFT would match.
#include "sd/format/training_abi.h"
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "sd/format/peft.h"
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
    if (init != "default" && init != "gaussian") {
      module.emitError() << "--lora-init takes 'default' or 'gaussian', got '" << init << "'";
      return signalPassFailure();
    }
    SmallVector<LinearOp> linears;
    if (failed(sd::selectTargetLinears(module, targetModules, "--target-modules", linears))) return signalPassFailure();
    for (GlobalOp g : module.getOps<GlobalOp>())
      if (g.getRole() == "trainable") g.setRole("frozen");
    std::mt19937_64 rng{static_cast<uint64_t>(seed)};
    double scale = sd::loraScale(alpha, rank, rslora);
    std::set<std::string> adapted;
    bool allInOut = true; // PEFT's fan_in_fan_out: every adapted PyTorch weight is [in, out]
    for (auto [stream, l] : llvm::enumerate(linears)) {
      allInOut &= storedInOut(l);
      if (failed(adapt(module, l, scale, int64_t(stream), rng))) return signalPassFailure();
      adapted.insert(l.getModule().str());
    }
    Builder b(module.getContext());
    SmallVector<Attribute> names;
    for (const std::string &m : adapted) names.push_back(b.getStringAttr(m));
    module->setAttr("sd.peft", b.getDictionaryAttr({
                                   b.getNamedAttr("peft_type", b.getStringAttr("LORA")),
                                   b.getNamedAttr("r", b.getI64IntegerAttr(rank)),
                                   b.getNamedAttr("lora_alpha", b.getF64FloatAttr(alpha)),
                                   b.getNamedAttr("lora_dropout", b.getF64FloatAttr(dropout)),
                                   b.getNamedAttr("use_rslora", b.getBoolAttr(rslora)),
                                   b.getNamedAttr("fan_in_fan_out", b.getBoolAttr(allInOut && !adapted.empty())),
                                   b.getNamedAttr("init_lora_weights", b.getStringAttr(init)),
                                   b.getNamedAttr("target_modules", b.getStringAttr(targetModules)),
                                   b.getNamedAttr("modules", b.getArrayAttr(names)),
                               }));
  }

  // Whether the source framework stores this weight [in, out] (GPT-2's
  // Conv1D): an [in, out] weight under its own module name. An [in, out]
  // initializer under another name (onnx::MatMul_N) is the exporter's folded
  // transpose of an nn.Linear, which PyTorch stores [out, in].
  static bool storedInOut(LinearOp l) {
    auto load = l.getWeight().getDefiningOp<GlobalLoadOp>();
    return l.getLayout() == "io" && load && load.getGlobal() == l.getModule().str() + ".weight";
  }

  LogicalResult adapt(ModuleOp module, LinearOp l, double scale, int64_t stream, std::mt19937_64 &rng) {
    auto wt = cast<RankedTensorType>(l.getWeight().getType());
    bool oi = l.getLayout() == "oi";
    int64_t in = oi ? wt.getDimSize(1) : wt.getDimSize(0), out = oi ? wt.getDimSize(0) : wt.getDimSize(1);
    std::string m = l.getModule().str();
    // PEFT: A = kaiming_uniform_(a=sqrt(5)) -> U(-1/sqrt(in), 1/sqrt(in)); gaussian: N(0, 1/r). B = 0.
    std::vector<float> a(size_t(rank * in));
    if (init == "gaussian") {
      std::normal_distribution<double> d(0.0, 1.0 / double(rank));
      for (float &v : a) v = float(d(rng));
    } else {
      double bound = 1.0 / std::sqrt(double(in));
      std::uniform_real_distribution<double> d(-bound, bound);
      for (float &v : a) v = float(d(rng));
    }
    Type f32 = Float32Type::get(module.getContext());
    if (wt.getElementType() != f32) return l.emitError("LoRA on non-f32 weights is not supported yet");
    GlobalOp ga = sd::createFloatGlobal(module, m + ".lora_A.weight", {rank, in}, "trainable", &a);
    GlobalOp gb = sd::createFloatGlobal(module, m + ".lora_B.weight", {out, rank}, "trainable", nullptr);
    OpBuilder b(l);
    b.setInsertionPointAfter(l);
    GradBuilder g(b, l.getLoc());
    Value av = b.create<GlobalLoadOp>(l.getLoc(), ga.getType(), ga.getSymName());
    Value bv = b.create<GlobalLoadOp>(l.getLoc(), gb.getType(), gb.getSymName());
    auto linear = [&](Value x, Value w, StringRef name) {
      return g.make<LinearOp>({x, w, g.none()}, {b.getNamedAttr("layout", b.getStringAttr("oi")),
                                                 b.getNamedAttr("module", b.getStringAttr(name))});
    };
    Value x = l.getInput();
    if (dropout > 0) {
      GlobalOp state = sd::getOrCreateGlobal(module, sd::abi::kDropoutRng,
                                             RankedTensorType::get({sd::abi::kDropoutRngSize}, b.getI64Type()), "scalar_state");
      Value rngState = b.create<GlobalLoadOp>(l.getLoc(), state.getType(), state.getSymName());
      x = g.make<SeededDropoutOp>({x, rngState}, {b.getNamedAttr("ratio", b.getF32FloatAttr(float(dropout))),
                                                  g.attr("stream", stream)});
    }
    Value down = linear(x, av, m + ".lora_A");
    Value up = linear(down, bv, m + ".lora_B");
    Value sum = g.add(l.getOutput(), g.scale(up, scale));
    if (g.failed()) return failure();
    l.getOutput().replaceAllUsesExcept(sum, sum.getDefiningOp());
    return success();
  }
};

} // namespace
