// sd-fold-conv-affine: in inference entries, Conv(x, W, B) followed by a
// multiply and/or an add by constants with one value per output channel (or
// one for all), or by a BatchNormalization with its statistics (the same
// affine: a = scale / sqrt(var + eps), b = bias - mean * a), becomes
// Conv(x, W * a, B * a + b), the new weights made at compile time. PP-LCNet (PaddleOCR's backbones) puts such a "learnable
// affine" after every convolution; folded, the convolution's own epilogue
// can then take the activation that follows (sd-fuse-conv-epilogue). The
// result differs from the unfolded graph by rounding only.
#include "GlobalData.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include <cmath>

namespace sd {
#define GEN_PASS_DEF_FOLDCONVAFFINE
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

using sd::otherOperand;
using sd::soleUser;

// The f32 values of `v` known now: a frozen or constant global's data, or a constant.
std::optional<std::vector<float>> knownFloats(const SymbolTable &globals, Value v) {
  auto type = dyn_cast<RankedTensorType>(v.getType());
  if (!type || !type.hasStaticShape() || !type.getElementType().isF32()) return std::nullopt;
  if (auto load = v.getDefiningOp<GlobalLoadOp>()) {
    auto g = globals.lookup<GlobalOp>(load.getGlobal());
    if (!g || !sd::hasFrozenValue(g)) return std::nullopt;
    ArrayRef<float> data = sd::floatsOf(g);
    if (int64_t(data.size()) != type.getNumElements()) return std::nullopt;
    return std::vector<float>(data.begin(), data.end());
  }
  auto dense = dyn_cast_or_null<DenseElementsAttr>(sd::ir::constantValue(v));
  if (!dense) return std::nullopt;
  auto values = dense.getValues<float>();
  return std::vector<float>(values.begin(), values.end());
}

// `v` as one value per channel of an [N, C, ...] result of rank `rank`: a
// constant of one element, or of shape [C, 1, ...] / [1, C, 1, ...] aligned
// to the right.
std::optional<std::vector<float>> perChannel(const SymbolTable &globals, Value v, int64_t channels, int64_t rank) {
  auto type = dyn_cast<RankedTensorType>(v.getType());
  std::optional<std::vector<float>> values = v ? knownFloats(globals, v) : std::nullopt;
  if (!type || !values) return std::nullopt;
  if (values->size() == 1) return std::vector<float>(size_t(channels), values->front());
  ArrayRef<int64_t> s = type.getShape();
  if (int64_t(s.size()) > rank) return std::nullopt;
  for (size_t i = 0; i < s.size(); ++i) {
    int64_t outDim = rank - int64_t(s.size()) + int64_t(i);
    if (s[i] != (outDim == 1 ? channels : 1)) return std::nullopt;
  }
  return values;
}

struct FoldConvAffinePass : sd::impl::FoldConvAffineBase<FoldConvAffinePass> {
  int folded = 0;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    folded = 0;
    SymbolTable globals(module);
    SmallVector<ConvOp> convs = sd::opsOfInferenceEntries<ConvOp>(module);
    for (ConvOp conv : convs) tryFold(module, globals, conv);
  }

  void tryFold(ModuleOp module, const SymbolTable &globals, ConvOp conv) {
    auto type = dyn_cast<RankedTensorType>(conv.getResult().getType());
    auto wType = dyn_cast<RankedTensorType>(conv.getW().getType());
    if (!type || !type.hasStaticShape() || !type.getElementType().isF32() || !wType || type.getRank() < 3) return;
    const int64_t channels = type.getDimSize(1), rank = type.getRank();
    std::optional<std::vector<float>> scale, shift;
    Operation *last = conv;
    if (auto bn = dyn_cast_or_null<BatchNormalizationOp>(soleUser(conv.getResult()));
        bn && bn.getTrainingMode().value_or(0) == 0 && bn.getResult().getType() == type &&
        bn.getX() == conv.getResult()) {
      // Batch normalization with its statistics: y = (x - mean) * scale / sqrt(var + eps) + bias, per channel.
      auto read = [&](Value v) { return perChannel(globals, v, channels, 2); }; // [C]
      auto g = read(bn.getScale()), bb = read(bn.getBias()), mean = read(bn.getInputMean()),
           var = read(bn.getInputVar());
      if (g && bb && mean && var) {
        const double eps = bn.getEpsilon() ? double(bn.getEpsilon()->convertToFloat()) : 1e-5;
        scale.emplace(size_t(channels));
        shift.emplace(size_t(channels));
        for (size_t c = 0; c < size_t(channels); ++c) {
          const double a = double((*g)[c]) / std::sqrt(double((*var)[c]) + eps);
          (*scale)[c] = float(a);
          (*shift)[c] = float(double((*bb)[c]) - double((*mean)[c]) * a);
        }
        last = bn;
      }
    }
    if (last == conv.getOperation()) {
      if (auto mul = dyn_cast_or_null<MulOp>(soleUser(conv.getResult())); mul && mul.getResult().getType() == type) {
        scale = perChannel(globals, otherOperand(mul, conv.getResult()), channels, rank);
        if (scale) last = mul;
      }
      if (auto add = dyn_cast_or_null<AddOp>(soleUser(last->getResult(0))); add && add.getResult().getType() == type) {
        shift = perChannel(globals, otherOperand(add, last->getResult(0)), channels, rank);
        if (shift) last = add;
      }
    }
    if (last == conv.getOperation()) return;
    std::optional<std::vector<float>> w = knownFloats(globals, conv.getW()), b;
    if (!w || int64_t(w->size()) % channels) return;
    if (!isa<NoneType>(conv.getB().getType())) {
      b = knownFloats(globals, conv.getB());
      if (!b || int64_t(b->size()) != channels) return;
    } else {
      b = std::vector<float>(size_t(channels), 0.0f);
    }
    const size_t perOut = w->size() / size_t(channels);
    for (size_t c = 0; c < size_t(channels); ++c) {
      const float a = scale ? (*scale)[c] : 1.0f;
      for (size_t i = 0; i < perOut; ++i) (*w)[c * perOut + i] *= a;
      (*b)[c] = (*b)[c] * a + (shift ? (*shift)[c] : 0.0f);
    }
    std::string name = "conv_affine." + std::to_string(folded++);
    GlobalOp wg = sd::createFloatGlobal(module, name + ".weight", wType.getShape(), "frozen", &*w);
    GlobalOp bg = sd::createFloatGlobal(module, name + ".bias", {channels}, "frozen", &*b);
    OpBuilder builder(conv);
    conv->setOperand(1, builder.create<GlobalLoadOp>(conv.getLoc(), wg.getType(), wg.getSymName()));
    conv->setOperand(2, builder.create<GlobalLoadOp>(conv.getLoc(), bg.getType(), bg.getSymName()));
    // Erased now, so the convolution's sole user is what follows (sd-fuse-conv-epilogue).
    SmallVector<Operation *> dead = {last};
    if (!llvm::is_contained(last->getOperands(), conv.getResult())) dead.push_back(soleUser(conv.getResult()));
    last->getResult(0).replaceAllUsesWith(conv.getResult());
    for (Operation *op : dead) op->erase();
  }
};

} // namespace
