// ONNX RotaryEmbedding (opset 23) imported as one sd.rotary, following ONNX's
// reference (onnx/reference/ops/op_rotary_embedding.py): heads split out of a
// 3-D input (4-D is [B, H, S, D] already); the caches read by position_ids
// when given; the first rotary_embedding_dim features rotated as halves, or
// as even/odd pairs with interleaved=1; the rest passed through.
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
  OpMaker m{imp};
  SmallVector<int64_t> xd = dimsHinted(imp, n.input(0), *x);
  if (xd.size() != 3 && xd.size() != 4) return imp.fail("RotaryEmbedding takes a 3-D or 4-D input");
  // Batch and sequence may be dynamic (a generation export): the reshapes copy
  // them (0). The features must be known, from shapes or the exporter's value_info.
  if (ShapedType::isDynamic(xd.back())) return imp.fail("RotaryEmbedding needs a static feature size");
  Value h = *x; // as [B, H, S, D], the layout sd.rotary rotates
  int64_t head = xd.back();
  if (xd.size() == 3) {
    const auto *heads = attrOf(n, "num_heads");
    if (!heads || heads->i() < 1 || xd[2] % heads->i())
      return imp.fail("3-D RotaryEmbedding needs num_heads dividing the hidden size");
    head = xd[2] / heads->i();
    h = m.transpose(m.reshape(h, {0, 0, heads->i(), head}), {0, 2, 1, 3});
  }
  int64_t rot = head;
  if (const auto *a = attrOf(n, "rotary_embedding_dim"); a && a->i() > 0) rot = a->i();
  if (rot > head || rot % 2) return imp.fail("rotary_embedding_dim must be even and at most the head size");
  SmallVector<NamedAttribute> attrs;
  if (const auto *a = attrOf(n, "interleaved"); a && a->i() != 0) attrs.push_back(m.i64("interleaved", 1));
  auto slice = [&](Value v, int64_t start, int64_t end) {
    return m.op("Slice", "slice", {v, imp.constI64({start}), imp.constI64({end}), imp.constI64({3}), imp.constI64({1})});
  };
  // One angle per rotated pair: the caches are [positions, rot/2] tables read by
  // position_ids, or [B, S, rot/2] without them.
  Value part = rot < head ? slice(h, 0, rot) : h;
  Value out = m.op("Rotary", "rotary", {part, *cosCache, *sinCache, *positions ? *positions : imp.none()}, attrs);
  if (rot < head) out = m.op("Concat", "concat", {out, slice(h, rot, head)}, {m.i64("axis", -1)});
  if (xd.size() == 3) out = m.reshape(m.transpose(out, {0, 2, 1, 3}), {0, 0, xd[2]});
  if (!m.ok) return imp.fail("the cos/sin caches do not fit the input and rotary_embedding_dim");
  bindOutput(imp, n, 0, out);
  return success();
}

} // namespace sd
