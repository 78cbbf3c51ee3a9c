// f32 data in and out of sd.global ops, and values folded from frozen ones.
#include "GlobalData.h"
#include "KernelFold.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"
#include "mlir/IR/DialectResourceBlobManager.h"

using namespace mlir;

sd::ir::GlobalOp sd::createFloatGlobal(ModuleOp module, StringRef name, ArrayRef<int64_t> shape, StringRef role,
                                       const std::vector<float> *values) {
  auto type = RankedTensorType::get(shape, Float32Type::get(module.getContext()));
  ElementsAttr init;
  if (values) {
    auto blob = HeapAsmResourceBlob::allocateAndCopyInferAlign(ArrayRef<float>(*values));
    init = DenseResourceElementsAttr::get(type, name, std::move(blob));
  }
  return getOrCreateGlobal(module, name, type, role, init);
}

bool sd::hasFrozenValue(sd::ir::GlobalOp g) {
  return (g.getRole() == "frozen" || g.getRole() == "constant") && g.getInitialValue();
}

sd::ir::GlobalOp sd::frozenGlobalOf(Value v) {
  auto load = v.getDefiningOp<ir::GlobalLoadOp>();
  auto g = load ? SymbolTable::lookupNearestSymbolFrom<ir::GlobalOp>(load, load.getGlobalAttr()) : ir::GlobalOp();
  return g && hasFrozenValue(g) ? g : ir::GlobalOp();
}

DenseElementsAttr sd::foldFromFrozenWeights(Value v, int64_t maxWeightBytes, int64_t maxFoldBytes) {
  if (auto dense = dyn_cast_or_null<DenseElementsAttr>(ir::constantValue(v))) return dense;
  // The ops v depends on; any block argument (an input) or mutable state ends the attempt.
  llvm::SetVector<Operation *> slice;
  SmallVector<Value> work = {v};
  while (!work.empty()) {
    Value x = work.pop_back_val();
    Operation *def = x.getDefiningOp();
    if (!def || def->getNumRegions()) return {};
    if (!slice.insert(def)) continue;
    if (isa<ir::GlobalLoadOp>(def)) {
      ir::GlobalOp g = frozenGlobalOf(x);
      auto type = g ? dyn_cast<RankedTensorType>(g.getType()) : RankedTensorType();
      if (!type || type.getNumElements() * int64_t(type.getElementTypeBitWidth() / 8) > maxWeightBytes) return {};
      continue;
    }
    for (Value operand : def->getOperands()) work.push_back(operand);
  }
  SmallVector<Operation *> ordered(slice.begin(), slice.end());
  llvm::sort(ordered, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  auto module = v.getParentRegion()->getParentOfType<ModuleOp>();
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  auto fn = b.create<func::FuncOp>(v.getLoc(), "__fold_from_frozen_weights", b.getFunctionType({}, {v.getType()}));
  b.setInsertionPointToStart(fn.addEntryBlock());
  IRMapping map;
  for (Operation *op : ordered) {
    if (auto load = dyn_cast<ir::GlobalLoadOp>(op)) {
      ir::GlobalOp g = frozenGlobalOf(load.getResult());
      map.map(load.getResult(), b.create<ir::ConstantOp>(op->getLoc(), load.getType(), g.getInitialValueAttr()));
      continue;
    }
    b.clone(*op, map);
  }
  b.create<func::ReturnOp>(v.getLoc(), map.lookup(v));
  DenseElementsAttr out;
  if (succeeded(propagateShapes(fn, maxFoldBytes))) {
    Value folded = fn.getBody().front().getTerminator()->getOperand(0);
    out = dyn_cast_or_null<DenseElementsAttr>(ir::constantValue(folded));
  }
  fn.erase();
  return out;
}

ArrayRef<float> sd::floatsOf(sd::ir::GlobalOp g) {
  if (!g.getInitialValue()) return {};
  Attribute v = *g.getInitialValue();
  ArrayRef<char> raw;
  if (auto r = dyn_cast<DenseResourceElementsAttr>(v)) {
    AsmResourceBlob *blob = r.getRawHandle().getBlob();
    if (!blob) return {};
    raw = blob->getData();
  } else if (auto d = dyn_cast<DenseElementsAttr>(v); d && !d.isSplat()) {
    raw = d.getRawData();
  } else {
    return {};
  }
  return ArrayRef<float>(reinterpret_cast<const float *>(raw.data()), raw.size() / sizeof(float));
}

std::vector<float> sd::kaimingUniform(int64_t rows, int64_t cols, std::mt19937_64 &rng) {
  return uniformFloats(size_t(rows * cols), 1.0 / std::sqrt(double(cols)), rng);
}

std::vector<float> sd::uniformFloats(size_t n, double bound, std::mt19937_64 &rng) {
  std::uniform_real_distribution<double> d(-bound, bound);
  std::vector<float> v(n);
  for (float &x : v) x = float(d(rng));
  return v;
}

std::vector<float> sd::torchUniformFloats(size_t n, double bound, std::mt19937 &gen) {
  float lo = float(-bound), hi = float(bound); // torch casts the bounds to the tensor's type first
  std::vector<float> v(n);
  for (float &x : v) {
    double unit = double(gen() & ((1u << 24) - 1)) / double(1u << 24);
    x = float(unit * double(hi - lo) + double(lo));
  }
  return v;
}
