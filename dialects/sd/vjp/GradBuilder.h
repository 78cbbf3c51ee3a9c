// Helpers for the reverse-mode rules: builds sd ops with result types from
// the op library's shape rules, and the reductions that turn a broadcast
// gradient back into an operand's shape. A failed build (a shape rule
// rejecting the operands) is remembered, so rules can chain calls and check
// once at the end.
#pragma once
#include "OpLibraryBridge.h"
#include "SDDialect.h"

namespace sd::ir {

class GradBuilder {
public:
  GradBuilder(mlir::OpBuilder &b, mlir::Location loc) : b_(b), loc_(loc) {}
  bool failed() const { return failed_; }
  mlir::OpBuilder &builder() { return b_; }
  mlir::Location loc() const { return loc_; }

  // Any compute op by class; null Value (and failed()) if its rule rejects it.
  template <typename OpT>
  mlir::Operation *op(mlir::ValueRange operands, llvm::ArrayRef<mlir::NamedAttribute> attrs = {},
                      unsigned numResults = 1) {
    for (mlir::Value v : operands)
      if (!v) return fail();
    mlir::Operation *o = buildComputeOp(b_, loc_, OpT::getOperationName(), OpT::getContract(), operands, attrs,
                                        numResults);
    return o ? o : fail();
  }
  template <typename OpT>
  mlir::Value make(mlir::ValueRange operands, llvm::ArrayRef<mlir::NamedAttribute> attrs = {}) {
    mlir::Operation *o = op<OpT>(operands, attrs);
    return o ? o->getResult(0) : mlir::Value();
  }

  mlir::NamedAttribute attr(llvm::StringRef name, int64_t v) { return b_.getNamedAttr(name, b_.getI64IntegerAttr(v)); }
  mlir::NamedAttribute attr(llvm::StringRef name, llvm::ArrayRef<int64_t> v) {
    return b_.getNamedAttr(name, b_.getDenseI64ArrayAttr(v));
  }
  // The listed attributes of `op` that are set, to pass on to its backward op.
  llvm::SmallVector<mlir::NamedAttribute> attrsOf(mlir::Operation *op, llvm::ArrayRef<llvm::StringRef> names);

  // Rank-0 constant of `elementType`, and an i64 vector constant.
  mlir::Value scalar(mlir::Type elementType, double v);
  mlir::Value ints(llvm::ArrayRef<int64_t> v);
  // An int64 constant of any shape (values row-major).
  mlir::Value ints(llvm::ArrayRef<int64_t> shape, llvm::ArrayRef<int64_t> values);
  mlir::Value none();

  mlir::Value add(mlir::Value a, mlir::Value b);
  mlir::Value sub(mlir::Value a, mlir::Value b);
  mlir::Value mul(mlir::Value a, mlir::Value b);
  mlir::Value div(mlir::Value a, mlir::Value b);
  mlir::Value neg(mlir::Value a);
  // 1 where a == b, else 0, in a's element type (which of a max's operands won).
  mlir::Value equalMask(mlir::Value a, mlir::Value b);
  // v cast to `elementType` (v itself when it has it already).
  mlir::Value castTo(mlir::Value v, mlir::Type elementType);
  mlir::Value scale(mlir::Value a, double s); // a * s
  mlir::Value reshape(mlir::Value v, llvm::ArrayRef<int64_t> shape);
  mlir::Value transpose(mlir::Value v, llvm::ArrayRef<int64_t> perm);
  mlir::Value swapLastTwo(mlir::Value v);
  mlir::Value reduceSum(mlir::Value v, llvm::ArrayRef<int64_t> axes, bool keepdims);
  // v[start:end:step] along one axis (ONNX Slice clamping; a negative step walks back).
  mlir::Value sliceAxis(mlir::Value v, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
  // v with `before` and `after` zeros added along one axis.
  mlir::Value padAxis(mlir::Value v, int64_t axis, int64_t before, int64_t after);
  mlir::Value zeros(mlir::Type type);
  // Sums `grad` over the axes that broadcasting added or stretched, giving `target`'s shape.
  mlir::Value unbroadcast(mlir::Value grad, mlir::Type target);
  // `grad` (shaped like a reduction's keepdims=0/1 result) stretched back to `target`.
  mlir::Value broadcastTo(mlir::Value grad, mlir::Type target, llvm::ArrayRef<int64_t> axes);

private:
  mlir::Operation *fail() {
    failed_ = true;
    return nullptr;
  }
  mlir::OpBuilder &b_;
  mlir::Location loc_;
  bool failed_ = false;
};

// On the per-channel means BatchNormalization's backward needs over the whole
// batch ([2C], batchNormVJP): sd-training-batch-norm averages them over data-parallel ranks.
constexpr const char *kCrossRankMeanAttr = "sd.cross_rank_mean";

llvm::ArrayRef<int64_t> shapeOf(mlir::Value v);
// An optional axis attribute (default 0), made non-negative for `rank`.
inline int64_t axisOf(std::optional<int64_t> a, int64_t rank) {
  int64_t v = a.value_or(0);
  return v < 0 ? v + rank : v;
}
mlir::Type elementTypeOf(mlir::Value v);
// Integer values of an sd.constant operand; false when it is not constant.
bool constantInts(mlir::Value v, llvm::SmallVectorImpl<int64_t> &out);
// The axes a Reduce* op (data, axes?) reduces, normalized: all of them when
// none are given, none when noop_with_empty_axes says so (so empty means the
// result is its operand). False when the axes are not constants. The
// reductions' rules and sd-bounded-extents both read reductions this way.
bool reducedAxesOf(mlir::Operation *reduction, llvm::SmallVectorImpl<int64_t> &axes);

// The rule of one op class, attached as a DifferentiableOpInterface model.
template <typename OpT>
using VJPRule = mlir::LogicalResult (*)(OpT op, GradBuilder &g, llvm::ArrayRef<mlir::Value> dys,
                                        llvm::ArrayRef<bool> needed, llvm::SmallVectorImpl<mlir::Value> &dxs);

template <typename OpT, VJPRule<OpT> Rule>
struct VJPModel : DifferentiableOpInterface::ExternalModel<VJPModel<OpT, Rule>, OpT> {
  mlir::LogicalResult buildVJP(mlir::Operation *op, mlir::OpBuilder &b, llvm::ArrayRef<mlir::Value> dys,
                               llvm::ArrayRef<bool> needed, llvm::SmallVectorImpl<mlir::Value> &dxs) const {
    GradBuilder g(b, op->getLoc());
    dxs.assign(op->getNumOperands(), mlir::Value());
    if (mlir::failed(Rule(llvm::cast<OpT>(op), g, dys, needed, dxs)) || g.failed()) return mlir::failure();
    return mlir::success();
  }
};

template <typename OpT, VJPRule<OpT> Rule> void attachVJP(mlir::MLIRContext *ctx) {
  OpT::template attachInterface<VJPModel<OpT, Rule>>(*ctx);
}

void attachActivationVJPs(mlir::MLIRContext *ctx);
void attachClassicNormVJPs(mlir::MLIRContext *ctx);
void attachConvVJPs(mlir::MLIRContext *ctx);
void attachElementwiseVJPs(mlir::MLIRContext *ctx);
void attachIndexingVJPs(mlir::MLIRContext *ctx);
void attachLinalgVJPs(mlir::MLIRContext *ctx);
void attachLossVJPs(mlir::MLIRContext *ctx);
void attachMovementVJPs(mlir::MLIRContext *ctx);
void attachNormalizationVJPs(mlir::MLIRContext *ctx);
void attachOsftVJPs(mlir::MLIRContext *ctx);
void attachRecurrentVJPs(mlir::MLIRContext *ctx);
void attachReductionVJPs(mlir::MLIRContext *ctx);
void attachRotaryVJPs(mlir::MLIRContext *ctx);
void attachSamplingVJPs(mlir::MLIRContext *ctx);
void attachTrigonometricVJPs(mlir::MLIRContext *ctx);

} // namespace sd::ir
