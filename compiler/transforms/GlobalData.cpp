// f32 data in and out of sd.global ops.
#include "GlobalData.h"
#include "PassDetail.h"
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
