// sd-peft-osft: orthogonal subspace fine-tuning on the sd.linear modules
// PEFT's target_modules selects. Each weight W [out, in] is split by SVD at
// compile time (OsftSplit.h) into the top-k triplets, frozen, and the rest,
// trainable, and the layer becomes sd.osft_linear over the six factors; the
// dense W leaves the plan when nothing else reads it.
#include "sd/format/crc32c.h"
#include "OsftSplit.h"
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "llvm/ADT/StringExtras.h"
#include <cmath>
#include <cstring>
#include <map>
#include <set>

namespace sd {
#define GEN_PASS_DEF_PEFTOSFT
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct RankRule {
  std::unique_ptr<llvm::Regex> pattern;
  std::string text;
  double value;
};

struct PeftOsftPass : sd::impl::PeftOsftBase<PeftOsftPass> {
  using PeftOsftBase::PeftOsftBase;

  // "NAME=K|R,...": PEFT's rank_pattern, a regex searched in the module name
  // (the first rule that matches wins), K a rank, R a fraction in (0, 1).
  LogicalResult parseRankPattern(ModuleOp module, std::vector<RankRule> &rules) {
    SmallVector<StringRef> parts;
    StringRef(rankPattern).split(parts, ',', -1, false);
    for (StringRef p : parts) {
      auto [name, value] = p.trim().rsplit('=');
      double v = 0;
      if (name.empty() || value.empty() || value.trim().getAsDouble(v) || !(v > 0) ||
          (v >= 1 && v != std::floor(v)))
        return module.emitError() << "--osft-rank-pattern entry '" << p.trim()
                                  << "' must be NAME=K (a rank of at least 1) or NAME=R (a fraction in (0, 1))";
      RankRule r{std::make_unique<llvm::Regex>(name), name.str(), v};
      std::string err;
      if (!r.pattern->isValid(err)) return module.emitError() << "--osft-rank-pattern '" << name << "': " << err;
      rules.push_back(std::move(r));
    }
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!(ratio > 0.0 && ratio < 1.0)) {
      module.emitError() << "--osft-preserved-ratio must be in (0, 1), got " << ratio;
      return signalPassFailure();
    }
    std::vector<RankRule> rules;
    if (failed(parseRankPattern(module, rules))) return signalPassFailure();
    SmallVector<LinearOp> linears;
    if (failed(sd::adapterTargets(module, targetModules, linears))) return signalPassFailure();
    Builder b(module.getContext());
    SmallVector<Attribute> names, ranks;
    uint32_t crc = 0;
    std::map<std::string, int64_t> done; // a module used twice (shared layer) splits once
    std::set<std::string> replaced;
    for (LinearOp l : linears) {
      if (auto load = l.getWeight().getDefiningOp<GlobalLoadOp>()) replaced.insert(load.getGlobal().str());
      std::string m = l.getModule().str();
      int64_t k = 0;
      if (failed(adapt(module, l, rules, k, crc, done.count(m) != 0))) return signalPassFailure();
      if (done.emplace(m, k).second) names.push_back(b.getStringAttr(m)), ranks.push_back(b.getI64IntegerAttr(k));
    }
    // Dense weights no layer reads any more (their factors replace them).
    std::set<std::string> read;
    module.walk([&](GlobalLoadOp load) { read.insert(load.getGlobal().str()); });
    for (GlobalOp g : llvm::make_early_inc_range(module.getOps<GlobalOp>()))
      if (replaced.count(g.getSymName().str()) && !read.count(g.getSymName().str())) g.erase();
    char crcText[16];
    std::snprintf(crcText, sizeof crcText, "%08x", crc);
    module->setAttr("sd.peft", b.getDictionaryAttr({
                                   b.getNamedAttr("peft_type", b.getStringAttr("OSF")),
                                   b.getNamedAttr("effective_rank", b.getF64FloatAttr(ratio)),
                                   b.getNamedAttr("rank_pattern", b.getStringAttr(rankPattern)),
                                   b.getNamedAttr("target_modules", b.getStringAttr(targetModules)),
                                   b.getNamedAttr("modules", b.getArrayAttr(names)),
                                   b.getNamedAttr("ranks", b.getArrayAttr(ranks)),
                                   b.getNamedAttr("base_weights_crc32c", b.getStringAttr(crcText)),
                               }));
  }

  int64_t rankFor(StringRef module, int64_t minDim, const std::vector<RankRule> &rules) {
    for (const RankRule &r : rules)
      if (r.pattern->match(module)) return sd::preservedRank(r.value, minDim);
    return sd::preservedRank(ratio, minDim);
  }

  // W [out, in] in f64 from the weight global's initial value.
  LogicalResult denseWeight(LinearOp l, GlobalOp g, bool oi, int64_t out, int64_t in, std::vector<double> &w) {
    std::vector<float> f(size_t(out * in));
    if (ArrayRef<float> stored = sd::floatsOf(g); stored.size() == f.size()) {
      std::copy(stored.begin(), stored.end(), f.begin());
    } else if (auto dense = dyn_cast_or_null<DenseElementsAttr>(g.getInitialValueAttr())) { // a splat, or not f32
      size_t i = 0;
      for (APFloat v : dense.getValues<APFloat>()) f[i++] = v.convertToFloat();
    } else {
      return l.emitError() << "OSFT on module '" << l.getModule() << "': weight '" << g.getSymName()
                           << "' has no stored value to split";
    }
    w.resize(f.size());
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) w[size_t(o * in + i)] = f[size_t(oi ? o * in + i : i * out + o)];
    return success();
  }

  LogicalResult adapt(ModuleOp module, LinearOp l, const std::vector<RankRule> &rules, int64_t &k, uint32_t &crc,
                      bool seen) {
    std::string m = l.getModule().str();
    auto wt = dyn_cast<RankedTensorType>(l.getWeight().getType());
    if (!wt || wt.getRank() != 2 || !wt.hasStaticShape())
      return l.emitError() << "OSFT needs a static 2-D weight; module '" << m << "' has " << l.getWeight().getType();
    if (!wt.getElementType().isF32())
      return l.emitError() << "OSFT on module '" << m << "': the weight is " << wt.getElementType() << ", not f32";
    auto load = l.getWeight().getDefiningOp<GlobalLoadOp>();
    GlobalOp g = load ? dyn_cast_or_null<GlobalOp>(SymbolTable::lookupSymbolIn(module, load.getGlobal())) : GlobalOp();
    if (!g) return l.emitError() << "OSFT on module '" << m << "': the weight is computed, not a stored initializer";
    bool oi = l.getLayout() == "oi";
    auto [in, out] = sd::linearInOut(l);
    int64_t minDim = std::min(out, in);
    k = rankFor(m, minDim, rules);
    if (k < 1)
      return l.emitError() << "OSFT on module '" << m << "': the preserved rank is " << k << " of min(out, in) = "
                           << minDim << ", which keeps no direction; raise the ratio or give a rank";
    if (k >= minDim)
      return l.emitError() << "OSFT on module '" << m << "': preserving rank " << k << " of min(out, in) = " << minDim
                           << " leaves nothing trainable";
    std::string uHigh = m + ".osf_U_high", uLow = m + ".osf_svd_params.U_low";
    if (!seen) {
      std::vector<double> w;
      if (failed(denseWeight(l, g, oi, out, in, w))) return failure();
      std::vector<float> wf(w.begin(), w.end());
      crc = sd::crc32c(wf.data(), wf.size() * sizeof(float), crc);
      sd::SvdFactors f;
      std::string err;
      if (!sd::svdSplit(w, out, in, f, err)) return l.emitError() << "OSFT on module '" << m << "': " << err;
      std::vector<float> u, s, v;
      int64_t r = minDim - k;
      sd::factorSlice(f, 0, k, u, s, v);
      sd::createFloatGlobal(module, uHigh, {out, k}, "frozen", &u);
      sd::createFloatGlobal(module, m + ".osf_S_high", {k}, "frozen", &s);
      sd::createFloatGlobal(module, m + ".osf_V_high", {k, in}, "frozen", &v);
      sd::factorSlice(f, k, r, u, s, v);
      sd::createFloatGlobal(module, uLow, {out, r}, "trainable", &u);
      sd::createFloatGlobal(module, m + ".osf_svd_params.S_low", {r}, "trainable", &s);
      sd::createFloatGlobal(module, m + ".osf_svd_params.V_low", {r, in}, "trainable", &v);
    }
    OpBuilder b(l);
    SmallVector<Value> operands = {l.getInput()};
    for (const char *part : {".osf_U_high", ".osf_S_high", ".osf_V_high", ".osf_svd_params.U_low",
                             ".osf_svd_params.S_low", ".osf_svd_params.V_low"}) {
      auto gl = cast<GlobalOp>(SymbolTable::lookupSymbolIn(module, m + part));
      operands.push_back(b.create<GlobalLoadOp>(l.getLoc(), gl.getType(), gl.getSymName()));
    }
    operands.push_back(l.getBias()); // sd.none when the layer has no bias
    GradBuilder gb(b, l.getLoc());
    Value y = gb.make<OsftLinearOp>(operands, {b.getNamedAttr("module", b.getStringAttr(m))});
    if (!y) return l.emitError() << "OSFT on module '" << m << "': the factorized layer does not fit its operands";
    l.getOutput().replaceAllUsesWith(y);
    l.erase();
    if (load->use_empty()) load->erase();
    return success();
  }
};

} // namespace
