// sd-quantize-nf4 (sdc compile --quantize nf4, QLoRA's base weights): the
// frozen weight of every linear layer but the output head is stored as 4-bit
// NormalFloat codes, bitsandbytes' NF4 with blocks of 64 (quantize_4bit),
// and read through a dequantization at each load: `<w>.nf4` [n/2] u8 (two
// codes a byte, the first in the high half) and `<w>.nf4_absmax` [n/64] f32.
// The codes and scales are bitsandbytes' to the bit: each block's absmax, the
// values times its reciprocal clamped to [-1, 1], each given the code whose
// interval between the table's midpoints holds it (a midpoint itself going
// down), so a layer computes with exactly the weights PEFT's QLoRA does.
//
// The dequantization is existing ops (a broadcast BitShift and a BitwiseAnd
// for both codes of each byte, Cast, Gather from the 16-value table, Mul by
// the block's absmax); the weight is
// quantized as PyTorch stores it, [out, in], and a layer that stores [in, out]
// gets a Transpose after. sd-rematerialize-dequant later gives each reader
// its own dequantization just before it, so no whole f32 weight outlives the
// op that reads it (the backward dequantizes again).
#include "GlobalData.h"
#include "Nf4.h"
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include <algorithm>
#include <cmath>

namespace sd {
#define GEN_PASS_DEF_QUANTIZENF4
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

constexpr int64_t kBlock = sd::kNf4Block;

struct QuantizeNf4Pass : sd::impl::QuantizeNf4Base<QuantizeNf4Pass> {
  using QuantizeNf4Base::QuantizeNf4Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<LinearOp> linears;
    if (failed(sd::selectTargetLinears(module, "all-linear", "--quantize", linears))) return signalPassFailure();
    // Each weight once, with the layout its layers read it in.
    llvm::MapVector<Operation *, bool> weights; // global -> stored [in, out]
    llvm::DenseSet<Operation *> mixed;          // read in both layouts: left as they are
    for (LinearOp l : linears) {
      GlobalOp g = sd::frozenGlobalOf(l.getWeight());
      auto t = g ? dyn_cast<RankedTensorType>(g.getType()) : RankedTensorType();
      if (!g || g.getRole() != "frozen" || !t || t.getRank() != 2 || !t.getElementType().isF32() ||
          t.getNumElements() % kBlock || sd::floatsOf(g).empty())
        continue;
      bool inOut = l.getLayout() == "io";
      auto [it, added] = weights.insert({g.getOperation(), inOut});
      if (!added && it->second != inOut) mixed.insert(g.getOperation());
    }
    for (Operation *g : mixed) weights.erase(g);
    int64_t count = 0;
    for (auto &[g, inOut] : weights) {
      if (failed(quantizeWeight(module, cast<GlobalOp>(g), inOut))) return signalPassFailure();
      ++count;
    }
    module->setAttr("sd.quantized_nf4", Builder(module.getContext()).getI64IntegerAttr(count));
  }

  LogicalResult quantizeWeight(ModuleOp module, GlobalOp g, bool inOut) {
    auto t = cast<RankedTensorType>(g.getType());
    int64_t rows = t.getDimSize(0), cols = t.getDimSize(1);
    ArrayRef<float> stored = sd::floatsOf(g);
    // PyTorch's [out, in]: a weight stored [in, out] is transposed first.
    std::vector<float> w(stored.begin(), stored.end());
    if (inOut)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) w[size_t(c * rows + r)] = stored[size_t(r * cols + c)];
    std::vector<uint8_t> packed;
    std::vector<float> absmax;
    sd::quantizeNf4(w.data(), w.size(), packed, absmax);
    std::string name = g.getSymName().str();
    MLIRContext *ctx = module.getContext();
    auto codesType = RankedTensorType::get({int64_t(packed.size())}, IntegerType::get(ctx, 8, IntegerType::Unsigned));
    auto blob = HeapAsmResourceBlob::allocateAndCopyInferAlign(ArrayRef<uint8_t>(packed));
    GlobalOp codes = sd::getOrCreateGlobal(module, name + ".nf4", codesType, "frozen",
                                           DenseResourceElementsAttr::get(codesType, name + ".nf4", std::move(blob)));
    GlobalOp scales = sd::createFloatGlobal(module, name + ".nf4_absmax", {int64_t(absmax.size())}, "frozen", &absmax);
    SmallVector<GlobalLoadOp> loads;
    module.walk([&](GlobalLoadOp l) {
      if (l.getGlobal() == g.getSymName()) loads.push_back(l);
    });
    for (GlobalLoadOp l : loads) {
      OpBuilder b(l);
      GradBuilder gb(b, l.getLoc());
      Value q = b.create<GlobalLoadOp>(l.getLoc(), codes.getType(), codes.getSymName());
      Value s = b.create<GlobalLoadOp>(l.getLoc(), scales.getType(), scales.getSymName());
      Value out = dequantize(gb, q, s, inOut ? cols : rows, inOut ? rows : cols);
      if (inOut) out = gb.transpose(out, {1, 0});
      if (gb.failed()) return failure();
      out.getDefiningOp()->setAttr(sd::kDequantizedAttr, g.getSymNameAttr());
      l.getResult().replaceAllUsesWith(out);
      l.erase();
    }
    g.erase();
    return success();
  }

  // codes [n/2] u8, absmax [n/64] f32 -> [out, in] f32: table[code] * absmax of its block.
  static Value dequantize(GradBuilder &g, Value codes, Value absmax, int64_t out, int64_t in) {
    OpBuilder &b = g.builder();
    Type u8 = IntegerType::get(b.getContext(), 8, IntegerType::Unsigned);
    int64_t n = out * in, bytes = n / 2;
    // Each byte [bytes, 1] shifted right by [4, 0] (broadcast) and masked: its
    // two codes side by side, [bytes, 2], high half first.
    auto shiftsType = RankedTensorType::get({1, 2}, u8);
    Value shifts = b.create<ConstantOp>(g.loc(), shiftsType,
                                        DenseElementsAttr::get(shiftsType, ArrayRef<uint8_t>{uint8_t(4), uint8_t(0)}));
    Value shifted = g.make<BitShiftOp>({g.reshape(codes, {bytes, 1}), shifts},
                                       {b.getNamedAttr("direction", b.getStringAttr("RIGHT"))});
    Value pairs = g.make<BitwiseAndOp>({shifted, g.scalar(u8, 15)});
    Value index = g.castTo(g.reshape(pairs, {n}), b.getI32Type()); // int32: half the transient of int64
    auto tableType = RankedTensorType::get({16}, b.getF32Type());
    Value table = b.create<ConstantOp>(g.loc(), tableType, DenseElementsAttr::get(tableType, ArrayRef<float>(sd::kNf4Values)));
    Value values = g.make<GatherOp>({table, index}, {g.attr("axis", 0)});
    Value scaled = g.mul(g.reshape(values, {n / kBlock, kBlock}), g.reshape(absmax, {n / kBlock, 1}));
    return g.reshape(scaled, {out, in});
  }
};

} // namespace
