// Reverse-mode rules of Conv, ConvTranspose, Col2Im and the max/average
// pools (windowed and global). Conv's input gradient is a ConvTranspose with the
// forward's explicit padding (auto_pad resolved) and, where the stride
// skipped trailing input, an output_padding that restores the input's size;
// its weight gradient is a ConvGradWeight built only when the weight is
// trainable. ConvTranspose is Conv's adjoint, so its rule is Conv's with the
// roles swapped: its input gradient a Conv of dy, its weight gradient a
// ConvGradWeight of x (as the gradient) over dy (as the input).
#include "GradBuilder.h"
#include "sd/ops/window_geometry.h"

using namespace mlir;

namespace sd::ir {
namespace {

using Grads = SmallVectorImpl<Value>;

// Batch and spatial axes of an [N, C, ...] tensor: what a per-channel
// gradient sums over.
SmallVector<int64_t> nonChannelAxes(int64_t rank) {
  SmallVector<int64_t> axes = {0};
  for (int64_t i = 2; i < rank; ++i) axes.push_back(i);
  return axes;
}

LogicalResult convVJP(ConvOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  Value x = op.getX(), w = op.getW();
  ArrayRef<int64_t> xs = shapeOf(x), ws = shapeOf(w);
  AttrMap attrs = toAttrMap(op.getOperation());
  Dims in(xs.begin() + 2, xs.end()), kernel = attrs.getInts("kernel_shape");
  if (kernel.empty()) kernel.assign(ws.begin() + 2, ws.end());
  WindowGeometry geo;
  if (Status st = resolveWindows(attrs, in, kernel, false, geo); !st.isOk())
    return op.emitError("Conv gradient: ") << st.message();
  SmallVector<int64_t> pads(geo.padBegin.begin(), geo.padBegin.end()), outputPadding;
  pads.append(geo.padEnd.begin(), geo.padEnd.end());
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t extent = (kernel[i] - 1) * geo.dilations[i] + 1;
    outputPadding.push_back(in[i] + geo.padBegin[i] + geo.padEnd[i] - extent - (geo.out[i] - 1) * geo.strides[i]);
  }
  SmallVector<NamedAttribute> common = {g.attr("strides", ArrayRef<int64_t>(geo.strides)),
                                        g.attr("dilations", ArrayRef<int64_t>(geo.dilations)),
                                        g.attr("group", attrs.getInt("group", 1)),
                                        g.attr("kernel_shape", ArrayRef<int64_t>(kernel)), g.attr("pads", pads)};
  if (need[0]) {
    SmallVector<NamedAttribute> t = common;
    t.push_back(g.attr("output_padding", outputPadding));
    dx[0] = g.make<ConvTransposeOp>({dy[0], w, g.none()}, t);
  }
  if (need[1]) dx[1] = g.make<ConvGradWeightOp>({dy[0], x}, common);
  if (op->getNumOperands() > 2 && need[2]) dx[2] = g.reduceSum(dy[0], nonChannelAxes(int64_t(xs.size())), false);
  return success();
}

LogicalResult convTransposeVJP(ConvTransposeOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need,
                              Grads &dx) {
  if ((op.getAutoPad() && *op.getAutoPad() != "NOTSET") || op.getOutputShape())
    return op.emitError("ConvTranspose with auto_pad or output_shape is not differentiable yet; export explicit pads "
                        "(PyTorch does)");
  Value x = op.getX(), w = op.getW();
  ArrayRef<int64_t> xs = shapeOf(x), ws = shapeOf(w);
  size_t spatial = xs.size() - 2;
  SmallVector<int64_t> kernel(ws.begin() + 2, ws.end());
  if (auto k = op.getKernelShape()) kernel.assign(k->begin(), k->end());
  SmallVector<int64_t> ones(spatial, 1), zeros(2 * spatial, 0);
  auto ints = [](std::optional<ArrayRef<int64_t>> a, ArrayRef<int64_t> fallback) {
    return a ? SmallVector<int64_t>(a->begin(), a->end()) : SmallVector<int64_t>(fallback.begin(), fallback.end());
  };
  SmallVector<NamedAttribute> common = {g.attr("strides", ArrayRef<int64_t>(ints(op.getStrides(), ones))),
                                        g.attr("dilations", ArrayRef<int64_t>(ints(op.getDilations(), ones))),
                                        g.attr("group", op.getGroup().value_or(1)),
                                        g.attr("kernel_shape", ArrayRef<int64_t>(kernel)),
                                        g.attr("pads", ArrayRef<int64_t>(ints(op.getPads(), zeros)))};
  if (need[0]) dx[0] = g.make<ConvOp>({dy[0], w, g.none()}, common);
  if (need[1]) dx[1] = g.make<ConvGradWeightOp>({x, dy[0]}, common);
  if (op->getNumOperands() > 2 && need[2]) dx[2] = g.reduceSum(dy[0], nonChannelAxes(int64_t(xs.size())), false);
  return success();
}

template <typename OpT, typename GradOpT>
LogicalResult poolVJP(OpT op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  // Global pools carry no attributes: the gradient op's window is then the whole input.
  dx[0] = g.make<GradOpT>({dy[0], op->getOperand(0)},
                          g.attrsOf(op, {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape",
                                         "pads", "strides"}));
  return success();
}

// Col2Im (F.fold) sums sliding blocks into an image; its adjoint cuts them
// back out (F.unfold): for each offset inside the block, the strided,
// dilated window of the zero-padded dy, one column of blocks each, stacked
// in the block's row-major order into [N, C * prod(block), L].
LogicalResult col2ImVJP(Col2ImOp op, GradBuilder &g, ArrayRef<Value> dy, ArrayRef<bool> need, Grads &dx) {
  if (!need[0]) return success();
  SmallVector<int64_t> block;
  if (!constantInts(op.getBlockShape(), block)) return op.emitError("Col2Im with a run-time block_shape");
  ArrayRef<int64_t> ys = shapeOf(dy[0]), xs = shapeOf(op.getInput());
  const int64_t k = int64_t(block.size()), n = ys[0], c = ys[1];
  AttrMap attrs = toAttrMap(op.getOperation());
  auto intsOr = [&](const char *name, size_t count, int64_t fallback) {
    std::vector<int64_t> v = attrs.getInts(name);
    return v.empty() ? std::vector<int64_t>(count, fallback) : v;
  };
  std::vector<int64_t> dil = intsOr("dilations", size_t(k), 1), pads = intsOr("pads", size_t(2 * k), 0),
                       strides = intsOr("strides", size_t(k), 1);
  Value padded = dy[0];
  SmallVector<int64_t> blocks; // per spatial dim
  for (int64_t d = 0; d < k; ++d) {
    padded = g.padAxis(padded, 2 + d, pads[size_t(d)], pads[size_t(k + d)]);
    int64_t span = ys[size_t(2 + d)] + pads[size_t(d)] + pads[size_t(k + d)] - dil[size_t(d)] * (block[size_t(d)] - 1);
    blocks.push_back((span - 1) / strides[size_t(d)] + 1);
  }
  SmallVector<Value> columns;
  SmallVector<int64_t> offset(size_t(k), 0);
  for (bool more = true; more;) {
    Value window = padded;
    for (int64_t d = 0; d < k; ++d) {
      int64_t start = offset[size_t(d)] * dil[size_t(d)];
      window = g.sliceAxis(window, 2 + d, start, start + (blocks[size_t(d)] - 1) * strides[size_t(d)] + 1,
                           strides[size_t(d)]);
    }
    columns.push_back(g.reshape(window, {n, c, 1, xs[2]}));
    more = false;
    for (int64_t d = k - 1; d >= 0 && !more; --d) {
      if (++offset[size_t(d)] < block[size_t(d)]) more = true;
      else offset[size_t(d)] = 0;
    }
  }
  Value stacked = columns.size() == 1 ? columns[0] : g.make<ConcatOp>(columns, {g.attr("axis", int64_t(2))});
  dx[0] = g.reshape(stacked, xs);
  return success();
}

} // namespace

void attachConvVJPs(MLIRContext *ctx) {
  attachVJP<Col2ImOp, col2ImVJP>(ctx);
  attachVJP<ConvOp, convVJP>(ctx);
  attachVJP<ConvTransposeOp, convTransposeVJP>(ctx);
  attachVJP<MaxPoolOp, poolVJP<MaxPoolOp, MaxPoolGradOp>>(ctx);
  attachVJP<GlobalMaxPoolOp, poolVJP<GlobalMaxPoolOp, MaxPoolGradOp>>(ctx);
  attachVJP<AveragePoolOp, poolVJP<AveragePoolOp, AveragePoolGradOp>>(ctx);
  attachVJP<GlobalAveragePoolOp, poolVJP<GlobalAveragePoolOp, AveragePoolGradOp>>(ctx);
}

} // namespace sd::ir
