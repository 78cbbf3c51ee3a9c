// sd-quantize-int4 (sdc compile --quantize int4, inference plans): every
// linear layer whose weight is a frozen f32 matrix that nothing else reads
// becomes onnxruntime's MatMulNBits over 4-bit codes, as onnxruntime-genai's
// builder writes its int4 models for CPUs: blocks of 32 along the input
// axis, symmetric (the default zero point 8), accuracy_level 4 (the CPU
// kernel may quantize the activations to int8 per block). Each block's scale
// is its largest-magnitude value over -8, so that value takes code 0 and
// the block spans all 16 codes; codes round to nearest, ties to even.
// The weight is stored [out, in] as MatMulNBits reads it: `<w>.int4` u8
// [out, blocks, 16] and `<w>.int4_scales` f32 [out, blocks].
#include "GlobalData.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "llvm/ADT/MapVector.h"
#include <algorithm>
#include <cmath>

namespace sd {
#define GEN_PASS_DEF_QUANTIZEINT4
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

constexpr int64_t kBlock = 32;

struct Int4Weight {
  std::vector<uint8_t> codes; // [out, blocks, 16]
  std::vector<float> scales;  // [out, blocks]
};

// w [out, in] row-major.
Int4Weight quantize(const std::vector<float> &w, int64_t out, int64_t in) {
  const int64_t blocks = (in + kBlock - 1) / kBlock;
  Int4Weight q;
  q.codes.assign(size_t(out * blocks * kBlock / 2), 0);
  q.scales.assign(size_t(out * blocks), 0.f);
  for (int64_t n = 0; n < out; ++n)
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const float *v = w.data() + n * in + kb * kBlock;
      const int64_t count = std::min(kBlock, in - kb * kBlock);
      float most = 0;
      for (int64_t e = 0; e < count; ++e)
        if (std::fabs(v[e]) > std::fabs(most)) most = v[e];
      const float scale = most / -8.f, inverse = scale != 0 ? 1.f / scale : 0.f;
      q.scales[size_t(n * blocks + kb)] = scale;
      uint8_t *bytes = q.codes.data() + (n * blocks + kb) * kBlock / 2;
      for (int64_t e = 0; e < kBlock; ++e) {
        const float x = e < count ? v[e] : 0.f;
        const int code = int(std::clamp(std::nearbyint(x * inverse) + 8.f, 0.f, 15.f));
        bytes[e / 2] |= uint8_t(code << (4 * (e % 2))); // element 2j in byte j's low half, 2j+1 in its high
      }
    }
  return q;
}

struct QuantizeInt4Pass : sd::impl::QuantizeInt4Base<QuantizeInt4Pass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    // Each weight with the linear layers that read it; a weight anything else reads stays f32.
    llvm::MapVector<Operation *, SmallVector<LinearOp>> readers;
    llvm::DenseSet<Operation *> shared;
    module.walk([&](GlobalLoadOp load) {
      GlobalOp g = sd::frozenGlobalOf(load.getResult());
      if (!g) return;
      for (Operation *user : load.getResult().getUsers()) {
        auto l = dyn_cast<LinearOp>(user);
        if (!l || l.getWeight() != load.getResult() || !usable(l, g)) {
          shared.insert(g.getOperation());
          continue;
        }
        readers[g.getOperation()].push_back(l);
      }
    });
    int64_t count = 0;
    for (auto &[g, linears] : readers) {
      if (shared.contains(g)) continue;
      if (failed(replace(module, cast<GlobalOp>(g), linears))) return signalPassFailure();
      ++count;
    }
    module->setAttr("sd.quantized_int4", Builder(module.getContext()).getI64IntegerAttr(count));
  }

  // A frozen f32 matrix read as a linear layer's weight, with an f32 input and bias.
  static bool usable(LinearOp l, GlobalOp g) {
    auto t = dyn_cast<RankedTensorType>(g.getType());
    auto in = dyn_cast<RankedTensorType>(l.getInput().getType());
    if (!t || t.getRank() != 2 || !t.getElementType().isF32() || !in || !in.getElementType().isF32()) return false;
    if (l.getBias() && !isa<NoneType>(l.getBias().getType())) {
      auto b = dyn_cast<RankedTensorType>(l.getBias().getType());
      const int64_t out = l.getLayout() == "io" ? t.getDimSize(1) : t.getDimSize(0);
      if (!b || !b.getElementType().isF32() || b.getRank() != 1 || b.getDimSize(0) != out) return false;
    }
    return !sd::floatsOf(g).empty();
  }

  LogicalResult replace(ModuleOp module, GlobalOp g, MutableArrayRef<LinearOp> linears) {
    auto t = cast<RankedTensorType>(g.getType());
    const bool inOut = linears.front().getLayout() == "io";
    for (LinearOp l : linears)
      if ((l.getLayout() == "io") != inOut) return success(); // read in both layouts: left as it is
    const int64_t rows = t.getDimSize(0), cols = t.getDimSize(1), out = inOut ? cols : rows, in = inOut ? rows : cols;
    ArrayRef<float> stored = sd::floatsOf(g);
    std::vector<float> w(stored.begin(), stored.end());
    if (inOut) // MatMulNBits reads [out, in]
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) w[size_t(c * rows + r)] = stored[size_t(r * cols + c)];
    Int4Weight q = quantize(w, out, in);
    const int64_t blocks = (in + kBlock - 1) / kBlock;
    MLIRContext *ctx = module.getContext();
    const std::string name = g.getSymName().str();
    auto codesType = RankedTensorType::get({out, blocks, kBlock / 2}, IntegerType::get(ctx, 8, IntegerType::Unsigned));
    auto blob = HeapAsmResourceBlob::allocateAndCopyInferAlign(ArrayRef<uint8_t>(q.codes));
    GlobalOp codes = sd::getOrCreateGlobal(module, name + ".int4", codesType, "frozen",
                                           DenseResourceElementsAttr::get(codesType, name + ".int4", std::move(blob)));
    GlobalOp scales = sd::createFloatGlobal(module, name + ".int4_scales", {out, blocks}, "frozen", &q.scales);
    for (LinearOp l : linears) {
      OpBuilder b(l);
      GradBuilder gb(b, l.getLoc());
      Value c = b.create<GlobalLoadOp>(l.getLoc(), codes.getType(), codes.getSymName());
      Value s = b.create<GlobalLoadOp>(l.getLoc(), scales.getType(), scales.getSymName());
      Value bias = l.getBias() ? l.getBias() : gb.none();
      Value y = gb.make<MatMulNBitsOp>({l.getInput(), c, s, gb.none(), bias},
                                       {gb.attr("K", in), gb.attr("N", out), gb.attr("bits", 4),
                                        gb.attr("block_size", kBlock), gb.attr("accuracy_level", 4)});
      if (gb.failed() || y.getType() != l.getResult().getType()) { // not this one: it stays f32
        if (y) y.getDefiningOp()->erase();
        s.getDefiningOp()->erase();
        c.getDefiningOp()->erase();
        continue;
      }
      l.getResult().replaceAllUsesWith(y);
      Value weight = l.getWeight();
      l.erase();
      if (Operation *load = weight.getDefiningOp(); load && load->use_empty()) load->erase();
    }
    if (SymbolTable::symbolKnownUseEmpty(g, module)) g.erase();
    if (SymbolTable::symbolKnownUseEmpty(codes, module)) codes.erase(), scales.erase();
    return success();
  }
};

} // namespace
