// sd-peft-lokr: LoKr (low-rank Kronecker product) adapters on the sd.linear
// modules PEFT would match: y = linear(x, W, b) + x ΔWᵀ with
// ΔW = (W1 ⊗ W2) · alpha / r, W1 [a, c] and W2 [b, d] for out = a·b and
// in = c·d, each factor whole or a rank-r product as PEFT's LoKr decides.
// PEFT rebuilds ΔW [out, in] each step and multiplies x by it (in·out per
// token); the layer here applies the product factored where that is cheaper,
// x ΔWᵀ = W1 X W2ᵀ per token with X = x as [c, d] (in·b + out·c per token:
// 8 times fewer at 256 x 256, 32 at 4096 x 4096), else as PEFT does.
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include <algorithm>
#include <cmath>
#include <random>

namespace sd {
#define GEN_PASS_DEF_PEFTLOKR
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

// PEFT's (LyCORIS's) factorization of a dimension into m x n: factor x
// dim/factor when factor divides it (in that order), otherwise the divisor
// pair nearest the square root with m <= n (and m <= factor when factor > 0).
std::pair<int64_t, int64_t> factorization(int64_t dim, int64_t factor) {
  if (factor > 0 && dim % factor == 0) return {factor, dim / factor};
  if (factor == -1) factor = dim;
  int64_t m = 1, n = dim;
  while (m < n) {
    int64_t nm = m + 1;
    while (dim % nm != 0) ++nm;
    int64_t nn = dim / nm;
    if (nm + nn > m + n || nm > factor) break;
    m = nm, n = nn;
  }
  if (m > n) std::swap(m, n);
  return {m, n};
}

struct PeftLokrPass : sd::impl::PeftLokrBase<PeftLokrPass> {
  using PeftLokrBase::PeftLokrBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (rank < 1) {
      module.emitError() << "--lora-r (LoKr's r) must be at least 1, got " << rank;
      return signalPassFailure();
    }
    if (decomposeFactor == 0 || decomposeFactor < -1) {
      module.emitError() << "--decompose-factor must be a positive integer or -1, got " << decomposeFactor;
      return signalPassFailure();
    }
    SmallVector<LinearOp> linears;
    if (failed(sd::adapterTargets(module, targetModules, linears))) return signalPassFailure();
    std::mt19937_64 rng{static_cast<uint64_t>(seed)};
    Builder b(module.getContext());
    SmallVector<Attribute> names, factors;
    for (LinearOp l : linears) {
      std::string suffixes;
      if (failed(adapt(module, l, rng, suffixes))) return signalPassFailure();
      names.push_back(b.getStringAttr(l.getModule()));
      factors.push_back(b.getStringAttr(suffixes));
    }
    module->setAttr("sd.peft", b.getDictionaryAttr({
                                   b.getNamedAttr("peft_type", b.getStringAttr("LOKR")),
                                   b.getNamedAttr("r", b.getI64IntegerAttr(rank)),
                                   b.getNamedAttr("alpha", b.getF64FloatAttr(alpha)),
                                   b.getNamedAttr("decompose_both", b.getBoolAttr(decomposeBoth)),
                                   b.getNamedAttr("decompose_factor", b.getI64IntegerAttr(decomposeFactor)),
                                   b.getNamedAttr("target_modules", b.getStringAttr(targetModules)),
                                   b.getNamedAttr("modules", b.getArrayAttr(names)),
                                   b.getNamedAttr("factors", b.getArrayAttr(factors)),
                               }));
  }


  // One Kronecker factor [rows, cols]: whole (`name`) or, when `decompose`,
  // `name`_a [rows, r] times `name`_b [r, cols]. PEFT's default init: W1 (its
  // _a half when decomposed) zeros, the rest Kaiming-uniform, so ΔW starts at 0.
  Value factor(ModuleOp module, GradBuilder &g, OpBuilder &b, Location loc, const std::string &name, int64_t rows,
               int64_t cols, bool decompose, bool zero, std::mt19937_64 &rng, std::string &suffixes) {
    auto load = [&](GlobalOp gl) { return b.create<GlobalLoadOp>(loc, gl.getType(), gl.getSymName()).getResult(); };
    std::string m = name.substr(0, name.rfind(".lokr_"));
    auto note = [&](const std::string &global) { suffixes += (suffixes.empty() ? "" : ",") + global.substr(m.size() + 1); };
    if (!decompose) {
      std::vector<float> init = zero ? std::vector<float>() : sd::kaimingUniform(rows, cols, rng);
      GlobalOp w = sd::createFloatGlobal(module, name, {rows, cols}, "trainable", zero ? nullptr : &init);
      note(name);
      return load(w);
    }
    std::vector<float> initA = zero ? std::vector<float>() : sd::kaimingUniform(rows, rank, rng),
                       initB = sd::kaimingUniform(rank, cols, rng);
    GlobalOp wa = sd::createFloatGlobal(module, name + "_a", {rows, rank}, "trainable", zero ? nullptr : &initA);
    GlobalOp wb = sd::createFloatGlobal(module, name + "_b", {rank, cols}, "trainable", &initB);
    note(name + "_a");
    note(name + "_b");
    // w_a [rows, r] times w_b [r, cols]: "io" reads w_b as [K, N].
    return sd::adapterLinear(g, load(wa), load(wb), "io", name);
  }

  LogicalResult adapt(ModuleOp module, LinearOp l, std::mt19937_64 &rng, std::string &suffixes) {
    auto wt = cast<RankedTensorType>(l.getWeight().getType());
    if (!wt.getElementType().isF32()) return l.emitError("LoKr on non-f32 weights is not supported yet");
    auto [in, out] = sd::linearInOut(l);
    auto [a, bOut] = factorization(out, decomposeFactor);
    auto [c, d] = factorization(in, decomposeFactor);
    // PEFT: "r < max(...) / 2" in floating point.
    bool splitW1 = decomposeBoth && double(rank) < double(std::max(a, c)) / 2;
    bool splitW2 = double(rank) < double(std::max(bOut, d)) / 2;
    std::string m = l.getModule().str();
    SmallVector<OpOperand *> readers = sd::usesOf(l.getOutput());
    OpBuilder b(l);
    b.setInsertionPointAfter(l);
    GradBuilder g(b, l.getLoc());
    Value w1 = factor(module, g, b, l.getLoc(), m + ".lokr_w1", a, c, splitW1, /*zero=*/true, rng, suffixes);
    Value w2 = factor(module, g, b, l.getLoc(), m + ".lokr_w2", bOut, d, splitW2, /*zero=*/false, rng, suffixes);
    if (!w1 || !w2) return failure();
    Value update;
    if (in * bOut + out * c < in * out) {
      // x [..., c·d] as [tokens, c, d]; times W2ᵀ over d: [tokens, c, b];
      // times W1ᵀ over c (after swapping c and b): [tokens, b, a]; back to
      // [tokens, a, b] = [..., out] with the scale on W1 (a·c values).
      Value x = g.reshape(l.getInput(), {-1, c, d});
      Value xw2 = sd::adapterLinear(g, x, w2, "oi", m + ".lokr_x2");
      Value w1Scaled = g.scale(w1, alpha / double(rank));
      Value y = sd::adapterLinear(g, g.transpose(xw2, {0, 2, 1}), w1Scaled, "oi", m + ".lokr_x1");
      Value back = g.transpose(y, {0, 2, 1});
      auto outType = cast<RankedTensorType>(l.getOutput().getType());
      update = outType.hasStaticShape() ? g.reshape(back, outType.getShape())
                                        : g.make<ReshapeOp>({back, g.make<ShapeOp>({l.getOutput()})});
    } else {
      // kron(W1, W2)[i·b + j, k·d + l] = W1[i, k] · W2[j, l]: broadcast
      // [a, 1, c, 1] against [1, b, 1, d], then [a·b, c·d] = [out, in].
      Value kron = g.mul(g.reshape(w1, {a, 1, c, 1}), g.reshape(w2, {1, bOut, 1, d}));
      Value delta = g.scale(g.reshape(kron, {out, in}), alpha / double(rank));
      // The base weight's layout: ΔW is [out, in] ("oi"), as PEFT's F.linear.
      update = sd::adapterLinear(g, l.getInput(), delta, "oi", m + ".lokr");
    }
    Value sum = g.add(l.getOutput(), update);
    if (g.failed()) return failure();
    for (OpOperand *u : readers) u->set(sum);
    return success();
  }
};

} // namespace
