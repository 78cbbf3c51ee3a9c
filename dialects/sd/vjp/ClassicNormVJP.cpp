// Reverse-mode rules of ONNX's older normalizations and Lp pooling, which
// models from the ONNX model zoo and older exporters hold (GoogLeNet's and
// CaffeNet's LRN, ArcFace's LpNormalization, speech front ends'
// MeanVarianceNormalization): each built from reductions and elementwise ops
// that have kernels on every backend. The forwards' math is
// sd/ops/math/classic_norms.h.
#include "GradBuilder.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

// v, but 1 where v is 0: a divisor for lines whose forward is 0 by rule (a
// zero line normalized, an all-zero pooling window), where the gradient's
// numerator is 0 too.
Value nonZero(GradBuilder &g, Value v) { return g.add(v, g.equalMask(v, g.scalar(elementTypeOf(v), 0.0))); }

Value keptMean(GradBuilder &g, Value v, ArrayRef<int64_t> axes) {
  return g.make<ReduceMeanOp>({v, g.ints(axes)}, {g.attr("keepdims", int64_t(1))});
}

// y = x / |x|_p along an axis (p 1 or 2): with s = sum(dy y) over the line,
// dx = (dy - y s) / |x|_2 for p = 2, (dy - sign(x) s) / |x|_1 for p = 1.
LogicalResult lpNormalizationVJP(LpNormalizationOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                                 Grads &dx) {
  Value x = op.getInput(), y = op.getOutput();
  int64_t axis = axisOf(op.getAxis().value_or(-1), int64_t(shapeOf(x).size()));
  int64_t p = op.getP().value_or(2);
  if (p != 1 && p != 2) return op.emitError("LpNormalization's gradient needs p = 1 or 2, not ") << p;
  SmallVector<NamedAttribute> keep = {g.attr("keepdims", int64_t(1))};
  Value norm = p == 2 ? g.make<ReduceL2Op>({x, g.ints({axis})}, keep) : g.make<ReduceL1Op>({x, g.ints({axis})}, keep);
  Value s = g.reduceSum(g.mul(dy[0], y), {axis}, /*keepdims=*/true);
  Value direction = p == 2 ? y : g.make<SignOp>({x});
  dx[0] = g.div(g.sub(dy[0], g.mul(direction, s)), nonZero(g, norm));
  return success();
}

// y = c / d over each group (axes), c = x - mean(x), s = sqrt(mean(c^2)),
// d = s + 1e-9: dc = dy / d - c mean(dy c) / (d^2 s), and dx = dc - mean(dc)
// (the mean's own share). A constant group (s = 0) has c = 0 and dc = dy / d.
LogicalResult meanVarianceNormVJP(MeanVarianceNormalizationOp op, GradBuilder &g, ArrayRef<Value> dy,
                                  ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput();
  Type et = elementTypeOf(x);
  int64_t rank = int64_t(shapeOf(x).size());
  SmallVector<int64_t> axes;
  if (std::optional<ArrayRef<int64_t>> given = op.getAxes()) {
    for (int64_t a : *given) axes.push_back(axisOf(a, rank));
  } else {
    axes = {0, 2, 3};
  }
  Value c = g.sub(x, keptMean(g, x, axes));
  Value s = g.make<SqrtOp>({keptMean(g, g.mul(c, c), axes)});
  Value d = g.add(s, g.scalar(et, 1e-9));
  Value t = keptMean(g, g.mul(dy[0], c), axes);
  Value dc = g.sub(g.div(dy[0], d), g.div(g.mul(c, t), g.mul(g.mul(d, d), nonZero(g, s))));
  dx[0] = g.sub(dc, keptMean(g, dc, axes));
  return success();
}

// out[k] = sum of v over channels [k + lo, k + hi] (axis 1, zeros outside).
Value channelWindowSum(GradBuilder &g, Value v, int64_t lo, int64_t hi) {
  const int64_t channels = shapeOf(v)[1];
  Value sum;
  for (int64_t o = lo; o <= hi; ++o) {
    if (o >= channels || -o >= channels) continue;
    Value shifted = o == 0  ? v
                    : o > 0 ? g.padAxis(g.sliceAxis(v, 1, o, channels), 1, 0, o)
                            : g.padAxis(g.sliceAxis(v, 1, 0, channels + o), 1, -o, 0);
    sum = sum ? g.add(sum, shifted) : shifted;
  }
  return sum;
}

// y = x D^-beta, D = bias + alpha / size * (x^2 summed over the channel
// window [k - before, k + after]): dx = dy D^-beta - (2 alpha beta / size)
// x * (dy y / D summed over the channels whose window holds k, [k - after, k + before]).
LogicalResult lrnVJP(LRNOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getInput(), y = op.getOutput();
  Type et = elementTypeOf(x);
  if (shapeOf(x).size() < 2) return op.emitError("LRN's gradient needs an input of rank 2 or more");
  const int64_t size = op.getSize();
  const double alpha = op.getAlpha() ? double(op.getAlpha()->convertToFloat()) : 1e-4;
  const double beta = op.getBeta() ? double(op.getBeta()->convertToFloat()) : 0.75;
  const double bias = op.getBias() ? double(op.getBias()->convertToFloat()) : 1.0;
  const int64_t before = (size - 1) / 2, after = size - 1 - before;
  Value squares = channelWindowSum(g, g.mul(x, x), -before, after);
  Value d = g.add(g.scale(squares, alpha / double(size)), g.scalar(et, bias));
  Value direct = g.mul(dy[0], g.make<PowOp>({d, g.scalar(et, -beta)}));
  Value spread = channelWindowSum(g, g.div(g.mul(dy[0], y), d), -after, before);
  dx[0] = g.sub(direct, g.scale(g.mul(x, spread), 2.0 * alpha * beta / double(size)));
  return success();
}

// y = (sum of |x|^p over the window)^(1/p): dx = |x|^(p-1) sign(x) times
// the sum, over the windows holding x, of dy y^(1-p). That sum is a sum
// pool's adjoint: AveragePoolGrad counting the padding, times the window's size.
template <typename OpT>
LogicalResult lpPoolVJP(OpT op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op->getOperand(0), y = op->getResult(0);
  Type et = elementTypeOf(x);
  ArrayRef<int64_t> xs = shapeOf(x);
  auto p = op->template getAttrOfType<IntegerAttr>("p");
  const int64_t power = p ? p.getInt() : 2;
  if (power < 1) return op.emitError("LpPool's gradient needs p >= 1, not ") << power;
  auto ceil = op->template getAttrOfType<IntegerAttr>("ceil_mode");
  if (ceil && ceil.getInt()) return op.emitError("LpPool's gradient with ceil_mode = 1 is not supported");
  int64_t window = 1;
  if (auto kernel = op->template getAttrOfType<DenseI64ArrayAttr>("kernel_shape")) {
    for (int64_t k : kernel.asArrayRef()) window *= k;
  } else {
    for (size_t a = 2; a < xs.size(); ++a) window *= xs[a];
  }
  Value perWindow = power == 1 ? dy[0]
                               : g.div(dy[0], g.make<PowOp>({nonZero(g, y), g.scalar(et, double(power - 1))}));
  SmallVector<NamedAttribute> attrs = g.attrsOf(op, {"auto_pad", "dilations", "kernel_shape", "pads", "strides"});
  attrs.push_back(g.attr("count_include_pad", int64_t(1)));
  Value summed = g.scale(g.make<AveragePoolGradOp>({perWindow, x}, attrs), double(window));
  Value local = g.make<SignOp>({x});
  if (power > 1) local = g.mul(local, g.make<PowOp>({g.make<AbsOp>({x}), g.scalar(et, double(power - 1))}));
  dx[0] = g.mul(summed, local);
  return success();
}

} // namespace

void attachClassicNormVJPs(MLIRContext *ctx) {
  attachVJP<LpNormalizationOp, lpNormalizationVJP>(ctx);
  attachVJP<MeanVarianceNormalizationOp, meanVarianceNormVJP>(ctx);
  attachVJP<LRNOp, lrnVJP>(ctx);
  attachVJP<LpPoolOp, lpPoolVJP<LpPoolOp>>(ctx);
  attachVJP<GlobalLpPoolOp, lpPoolVJP<GlobalLpPoolOp>>(ctx);
}

} // namespace sd::ir
