// ONNX RotaryEmbedding (opset 23) imported as sd ops, following ONNX's
// reference (onnx/reference/ops/op_rotary_embedding.py): heads split out of a
// 3-D input (or 4-D [B, H, S, D] moved to [B, S, H, D]); cos/sin gathered by
// position_ids when given; the first rotary_embedding_dim features rotated
// as halves, or as even/odd pairs with interleaved=1; the rest passed through.
#include "RotaryHandler.h"
#include "OpMaker.h"

using namespace mlir;
using namespace sd::ir;

namespace sd {

LogicalResult importRotaryEmbedding(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"interleaved", "num_heads", "rotary_embedding_dim"}))) return failure();
  auto input = [&](int i) { return optionalInput(imp, n, i); };
  FailureOr<Value> x = input(0), cosCache = input(1), sinCache = input(2), positions = input(3);
  if (failed(x) || failed(cosCache) || failed(sinCache) || failed(positions)) return failure();
  if (!*x || !*cosCache || !*sinCache) return imp.fail("RotaryEmbedding needs input, cos_cache and sin_cache");
  if (!isStatic(*x))
    return imp.fail("RotaryEmbedding needs a static input shape");
  OpMaker m{imp};
  ArrayRef<int64_t> xd = dimsOf(*x);
  Value h = *x;
  if (xd.size() == 4) {
    h = m.transpose(h, {0, 2, 1, 3});
  } else if (xd.size() == 3) {
    const auto *heads = attrOf(n, "num_heads");
    if (!heads || heads->i() < 1 || xd[2] % heads->i())
      return imp.fail("3-D RotaryEmbedding needs num_heads dividing the hidden size");
    h = m.reshape(h, {xd[0], xd[1], heads->i(), xd[2] / heads->i()});
  } else {
    return imp.fail("RotaryEmbedding takes a 3-D or 4-D input");
  }
  ArrayRef<int64_t> hd = dimsOf(h);
  int64_t head = hd[3], rot = head;
  if (const auto *a = attrOf(n, "rotary_embedding_dim"); a && a->i() > 0) rot = a->i();
  if (rot > head || rot % 2) return imp.fail("rotary_embedding_dim must be even and at most the head size");
  bool interleaved = false;
  if (const auto *a = attrOf(n, "interleaved")) interleaved = a->i() != 0;
  auto slice = [&](Value v, int64_t start, int64_t end, int64_t step) {
    return m.op("Slice", "slice", {v, imp.constI64({start}), imp.constI64({end}), imp.constI64({3}), imp.constI64({step})});
  };
  Value rotated = slice(h, 0, rot, 1);
  Value cosv = *cosCache, sinv = *sinCache;
  if (*positions) {
    cosv = m.op("Gather", "gather", {cosv, *positions}, {m.i64("axis", 0)});
    sinv = m.op("Gather", "gather", {sinv, *positions}, {m.i64("axis", 0)});
  }
  cosv = m.op("Unsqueeze", "unsqueeze", {cosv, imp.constI64({-2})});
  sinv = m.op("Unsqueeze", "unsqueeze", {sinv, imp.constI64({-2})});
  Value x1 = interleaved ? slice(rotated, 0, rot, 2) : slice(rotated, 0, rot / 2, 1);
  Value x2 = interleaved ? slice(rotated, 1, rot, 2) : slice(rotated, rot / 2, rot, 1);
  Value real = m.op("Sub", "sub", {m.op("Mul", "mul", {cosv, x1}), m.op("Mul", "mul", {sinv, x2})});
  Value imag = m.op("Add", "add", {m.op("Mul", "mul", {sinv, x1}), m.op("Mul", "mul", {cosv, x2})});
  if (interleaved) {
    Value re = m.op("Unsqueeze", "unsqueeze", {real, imp.constI64({-1})});
    Value im = m.op("Unsqueeze", "unsqueeze", {imag, imp.constI64({-1})});
    rotated = m.reshape(m.op("Concat", "concat", {re, im}, {m.i64("axis", -1)}), {hd[0], hd[1], hd[2], rot});
  } else {
    rotated = m.op("Concat", "concat", {real, imag}, {m.i64("axis", -1)});
  }
  Value out = rot < head ? m.op("Concat", "concat", {rotated, slice(h, rot, head, 1)}, {m.i64("axis", -1)}) : rotated;
  out = xd.size() == 4 ? m.transpose(out, {0, 2, 1, 3}) : m.reshape(out, xd);
  if (!m.ok) return imp.fail("the cos/sin caches do not fit the input and rotary_embedding_dim");
  bindOutput(imp, n, 0, out);
  return success();
}

} // namespace sd
