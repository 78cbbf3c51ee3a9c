// Shared pieces of the training recipes' loss entries.
#include "RecipeLoss.h"
#include "EntryInputs.h"
#include "sd/format/training_abi.h"
#include "sd/format/dtype.h"
#include "vjp/GradBuilder.h"

using namespace mlir;
using namespace sd::ir;

namespace sd {

SummedLoss summedCrossEntropy(GradBuilder &g, Value scores, Value labels) {
  OpBuilder &b = g.builder();
  Value ignore = g.scalar(b.getI64Type(), double(kIgnoreIndex));
  Value loss = g.make<SoftmaxCrossEntropyLossOp>(
      {scores, labels, g.none()},
      {b.getNamedAttr("reduction", b.getStringAttr("sum")), g.attr("ignore_index", kIgnoreIndex)});
  Value counted = g.make<NotOp>({g.make<EqualOp>({labels, ignore})});
  Value count = g.make<ReduceSumOp>({g.make<CastOp>({counted}, {g.attr("to", int64_t(sd::DType::F32))}), g.none()},
                                    {g.attr("keepdims", 0)});
  if (g.failed()) return {};
  if (cast<RankedTensorType>(loss.getType()).getElementType() != b.getF32Type())
    loss = g.make<CastOp>({loss}, {g.attr("to", int64_t(sd::DType::F32))});
  return {loss, count};
}

LogicalResult finishLossEntry(func::FuncOp f, Value loss, Value count) {
  setEntryOutputs(f, {loss, count}, {sd::abi::kLossSum, sd::abi::kTokens});
  return success();
}

Value addLabelsInput(func::FuncOp f, unsigned like, int64_t rank, llvm::StringRef name) {
  MLIRContext *ctx = f.getContext();
  auto likeType = cast<RankedTensorType>(f.getArgument(like).getType());
  auto type = RankedTensorType::get(likeType.getShape().take_front(size_t(rank)), IntegerType::get(ctx, 64));
  SmallVector<NamedAttribute> attrs = {NamedAttribute(StringAttr::get(ctx, "sd.name"), StringAttr::get(ctx, name))};
  if (auto params = f.getArgAttrOfType<ArrayAttr>(like, "sd.dim_params"))
    attrs.push_back(NamedAttribute(StringAttr::get(ctx, "sd.dim_params"),
                                   ArrayAttr::get(ctx, params.getValue().take_front(size_t(rank)))));
  unsigned index = f.getNumArguments();
  f.insertArgument(index, type, DictionaryAttr::get(ctx, attrs), f.getLoc());
  return f.getArgument(index);
}

} // namespace sd
