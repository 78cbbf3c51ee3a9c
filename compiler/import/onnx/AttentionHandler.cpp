// ONNX Attention (opset 23+) and FlexAttention (ai.onnx.preview) imported as sd ops, following ONNX's reference
// (onnx/reference/ops/op_attention.py) step by step:
//   3-D inputs split into heads; past key/value concatenated (present_*);
//   grouped-query heads repeated; scores = (Q sqrt(scale)) (K sqrt(scale))^T;
//   softcap; bias = attn_mask (bool -> 0/-inf, padded to the keys) and the
//   offset-aligned causal frontier and sliding window; softmax (in softmax_precision); rows whose
//   bias masks every key give zeros; Y = P V, merged back to 3-D.
// Sliding windows (opset 25) are one more band of the bias; an external
// cache (nonpad_kv_seqlen) gives per-batch offsets and a padding band,
// computed at run time.
#include "AttentionHandler.h"
#include "OpMaker.h"
#include <cmath>

using namespace mlir;
using namespace sd::ir;

namespace sd {
namespace {

// Grouped-query attention: kv head h / (hq / hkv) serves query head h, so
// [B, hkv, S, E] becomes [B, hq, S, E] with each head repeated in place. The
// Expand broadcasts, so batch and sequence may be dynamic.
Value repeatHeads(NodeImporter &imp, OpMaker &m, Value x, int64_t hkv, int64_t hq, int64_t e) {
  if (hkv == hq) return x;
  Value u = m.op("Unsqueeze", "unsqueeze", {x, imp.constI64({2})});
  Value expanded = m.op("Expand", "expand", {u, imp.constI64({1, 1, hq / hkv, 1, 1})});
  return m.reshape(expanded, {0, hq, -1, e});
}

} // namespace

LogicalResult importAttention(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"is_causal", "kv_num_heads", "left_window_size", "q_num_heads",
                                "qk_matmul_output_mode", "right_window_size", "scale", "softcap", "softmax_precision"})))
    return failure();
  auto input = [&](int i) { return optionalInput(imp, n, i); };
  FailureOr<Value> q = input(0), k = input(1), v = input(2), mask = input(3), pastK = input(4), pastV = input(5),
                   nonpad = input(6);
  if (failed(q) || failed(k) || failed(v) || failed(mask) || failed(pastK) || failed(pastV) || failed(nonpad))
    return failure();
  if (*nonpad && *pastK) return imp.fail("nonpad_kv_seqlen cannot be combined with past_key/past_value");
  int64_t window[2] = {-1, -1}; // left, right; -1: unbounded
  for (int side = 0; side < 2; ++side)
    if (const auto *a = attrOf(n, side ? "right_window_size" : "left_window_size")) window[side] = a->i();
  if (window[0] < -1 || window[1] < -1) return imp.fail("window sizes must be -1 or nonnegative");
  if (bool(*pastK) != bool(*pastV)) return imp.fail("past_key and past_value go together");
  Type et = cast<RankedTensorType>(q->getType()).getElementType();
  OpMaker m{imp};
  int64_t rank = int64_t(dimsOf(*q).size());
  if (rank != 3 && rank != 4) return imp.fail("Attention takes 3-D or 4-D query, key and value");
  // Batch and sequence lengths may be dynamic (a generation export, specialized
  // later); the head counts and sizes, which the graph below is built from,
  // must be known, from shapes or the exporter's value_info.
  SmallVector<int64_t> qh = dimsHinted(imp, n.input(0), *q), kh = dimsHinted(imp, n.input(1), *k),
                       vh = dimsHinted(imp, n.input(2), *v);
  for (ArrayRef<int64_t> d : {ArrayRef<int64_t>(qh), ArrayRef<int64_t>(kh), ArrayRef<int64_t>(vh)})
    if (int64_t(d.size()) != rank || ShapedType::isDynamic(d.back()) || (rank == 4 && ShapedType::isDynamic(d[1])))
      return imp.fail("Attention needs query, key and value of one rank with static head counts and sizes");
  Value Q = *q, K = *k, V = *v;
  int64_t hq, hkv, e, ev, sq, skv; // heads, head sizes, query and key lengths
  if (rank == 3) {
    const auto *qHeadsAttr = attrOf(n, "q_num_heads"), *kvHeadsAttr = attrOf(n, "kv_num_heads");
    if (!qHeadsAttr || !kvHeadsAttr) return imp.fail("3-D Attention needs q_num_heads and kv_num_heads");
    hq = qHeadsAttr->i(), hkv = kvHeadsAttr->i();
    if (hq < 1 || hkv < 1) return imp.fail("q_num_heads and kv_num_heads must be positive");
    if (qh[2] % hq || kh[2] % hkv || vh[2] % hkv) return imp.fail("the hidden sizes do not divide by the head counts");
    e = qh[2] / hq, ev = vh[2] / hkv, sq = qh[1], skv = kh[1];
    auto split = [&](Value x, int64_t heads, int64_t size) {
      return m.transpose(m.reshape(x, {0, 0, heads, size}), {0, 2, 1, 3});
    };
    Q = split(Q, hq, e), K = split(K, hkv, e), V = split(V, hkv, ev);
  } else {
    hq = qh[1], hkv = kh[1], e = qh[3], ev = vh[3], sq = qh[2], skv = kh[2];
    if (vh[1] != hkv) return imp.fail("key and value must have the same number of heads");
  }
  int64_t pastLength = 0;
  if (*pastK) {
    pastLength = dimsHinted(imp, n.input(4), *pastK)[2];
    skv = ShapedType::isDynamic(pastLength) || ShapedType::isDynamic(skv) ? ShapedType::kDynamic : pastLength + skv;
    K = m.op("Concat", "concat", {*pastK, K}, {m.i64("axis", 2)});
    V = m.op("Concat", "concat", {*pastV, V}, {m.i64("axis", 2)});
  }
  if (!m.ok) return imp.fail("past key/value do not fit the new keys/values");
  Value presentK = K, presentV = V;
  double scale = 1.0 / std::sqrt(double(e));
  if (const auto *a = attrOf(n, "scale")) scale = a->f();
  if (hq % hkv) return imp.fail("q_num_heads must be a multiple of kv_num_heads");
  K = repeatHeads(imp, m, K, hkv, hq, e), V = repeatHeads(imp, m, V, hkv, hq, ev);
  Value s = m.scalar(std::sqrt(scale), et);
  Value scores = m.op("MatMul", "matmul", {m.op("Mul", "mul", {Q, s}), m.transpose(m.op("Mul", "mul", {K, s}), {0, 1, 3, 2})});
  double softcap = 0;
  if (const auto *a = attrOf(n, "softcap")) softcap = a->f();
  if (softcap > 0) {
    Value c = m.scalar(softcap, et);
    scores = m.op("Mul", "mul", {m.op("Tanh", "tanh", {m.op("Div", "div", {scores, c})}), c});
  }
  // The bias: the mask (padded to the keys), then the causal frontier.
  Value zero = m.scalar(0.0, et), negInf = m.scalar(-INFINITY, et), bias;
  if (*mask) {
    Value mk = *mask;
    auto mt = cast<RankedTensorType>(mk.getType());
    bool isBool = mt.getElementType().isInteger(1);
    if (mt.getRank() < 1) return imp.fail("attn_mask needs at least one dim");
    int64_t maskKeys = mt.getShape().back();
    // A mask shorter than the keys is padded; with either length dynamic the
    // two are taken to be equal, and specialization's broadcast check refuses
    // them if they are not (a length of 1 would broadcast instead, so it is refused).
    if (ShapedType::isDynamic(skv) != ShapedType::isDynamic(maskKeys) && (maskKeys == 1 || skv == 1))
      return imp.fail("attn_mask's key length and the keys' must both be static when either is 1");
    if (int64_t pad = skv - maskKeys; !ShapedType::isDynamic(skv) && !ShapedType::isDynamic(maskKeys) && pad > 0) {
      SmallVector<int64_t> pads(size_t(2 * mt.getRank()), 0);
      pads[size_t(2 * mt.getRank() - 1)] = pad;
      Value fill = isBool ? imp.constScalarLike(0, mt.getElementType()) : negInf;
      mk = m.op("Pad", "pad", {mk, imp.constI64(pads), fill, imp.none()}, {imp.builder.getNamedAttr("mode", imp.builder.getStringAttr("constant"))});
    }
    bias = isBool ? m.op("Where", "where", {mk, zero, negInf}) : mk;
  }
  // Query i sits at absolute position p = i + offset: offset is the past
  // keys' count, or per batch nonpad_kv_seqlen[b] - q_len with an external
  // cache. Without nonpad_kv_seqlen the bands are constants.
  auto addBias = [&](Value allowed) { // bias += 0 where allowed, -inf elsewhere
    Value b = m.op("Where", "where", {allowed, zero, negInf});
    bias = bias ? m.op("Add", "add", {bias, b}) : b;
  };
  bool causal = false;
  if (const auto *a = attrOf(n, "is_causal")) causal = a->i() != 0;
  bool windowed = window[0] >= 0 || window[1] >= 0;
  auto allowedAt = [&](int64_t p, int64_t j, bool causalBand) {
    if (causalBand) return j <= p;
    return (window[0] < 0 || p - j <= window[0]) && (window[1] < 0 || j - p <= window[1]);
  };
  if ((causal || windowed || *nonpad) && (ShapedType::isDynamic(sq) || ShapedType::isDynamic(skv)))
    return imp.fail("Attention with is_causal, a window or nonpad_kv_seqlen needs static sequence lengths; give --shapes");
  if (!*nonpad) {
    int64_t offset = pastLength;
    for (bool causalBand : {true, false}) {
      if (causalBand ? !causal : !windowed) continue;
      auto allowedType = RankedTensorType::get({sq, skv}, imp.builder.getI1Type());
      SmallVector<bool> allowed;
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t j = 0; j < skv; ++j) allowed.push_back(allowedAt(i + offset, j, causalBand));
      addBias(imp.builder.create<ConstantOp>(imp.loc, allowedType, DenseElementsAttr::get(allowedType, allowed)));
    }
  } else {
    SmallVector<int64_t> is, js;
    for (int64_t i = 0; i < sq; ++i) is.push_back(i);
    for (int64_t j = 0; j < skv; ++j) js.push_back(j);
    Value j = m.reshape(imp.constI64(js), {1, 1, 1, skv});
    Value valid = m.reshape(m.op("Cast", "cast", {*nonpad}, {m.i64("to", 7)}), {-1, 1, 1, 1}); // [B, 1, 1, 1]
    Value p = m.op("Add", "add", {m.reshape(imp.constI64(is), {1, 1, sq, 1}),
                                  m.op("Sub", "sub", {valid, imp.constI64({sq}, /*scalar=*/true)})}); // [B, 1, q, 1]
    if (causal) addBias(m.op("LessOrEqual", "less_or_equal", {j, p}));
    if (windowed) {
      Value diff = m.op("Sub", "sub", {p, j}), allowed;
      if (window[0] >= 0) allowed = m.op("LessOrEqual", "less_or_equal", {diff, imp.constI64({window[0]}, true)});
      if (window[1] >= 0) {
        Value right = m.op("LessOrEqual", "less_or_equal", {m.op("Neg", "neg", {diff}), imp.constI64({window[1]}, true)});
        allowed = allowed ? m.op("And", "and", {allowed, right}) : right;
      }
      addBias(allowed);
    }
    addBias(m.op("Less", "less", {j, valid})); // keys past each batch's valid count
  }
  Value withBias = bias ? m.op("Add", "add", {scores, bias}) : scores;
  int64_t mode = 0;
  if (const auto *a = attrOf(n, "qk_matmul_output_mode")) mode = a->i();
  if (mode < 0 || mode > 3) return imp.fail("qk_matmul_output_mode must be 0, 1, 2 or 3");
  Value logits = withBias;
  if (const auto *a = attrOf(n, "softmax_precision"))
    logits = m.op("Cast", "cast", {logits}, {m.i64("to", a->i())});
  Value probs = m.op("Softmax", "softmax", {logits}, {m.i64("axis", -1)});
  if (logits != withBias) probs = m.op("Cast", "cast", {probs}, {m.i64("to", onnxFloatType(et))});
  if (bias) { // rows whose bias masks every key attend nothing: zeros, not NaN
    Value rowMax = m.op("ReduceMax", "reduce_max", {bias, imp.constI64({-1})}, {m.i64("keepdims", 1)});
    probs = m.op("Where", "where", {m.op("Equal", "equal", {rowMax, negInf}), zero, probs});
  }
  Value y = m.op("MatMul", "matmul", {probs, V});
  if (rank == 3) y = m.reshape(m.transpose(y, {0, 2, 1, 3}), {0, 0, hq * ev});
  if (!m.ok) return failure();
  Value outs[4] = {y, presentK, presentV, mode == 3 ? probs : mode == 2 ? withBias : scores};
  for (int i = 0; i < 4; ++i) bindOutput(imp, n, i, outs[i]);
  if (n.output_size() > 4) return imp.fail("Attention has at most 4 outputs");
  return success();
}

// FlexAttention (ai.onnx.preview, opset 1), after onnx/reference: scores
// (Q sqrt(scale)) (K sqrt(scale))^T in the softmax precision (f32 for halves),
// through the score_mod graph, softmax, the prob_mod graph, then P V in that
// precision, cast to V's type. The mod graphs are imported inline.
LogicalResult importFlexAttention(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (n.domain() != "ai.onnx.preview") return imp.fail("FlexAttention is an ai.onnx.preview op");
  if (failed(onlyAttrs(imp, n, {"scale", "score_mod", "prob_mod", "softmax_precision"}))) return failure();
  FailureOr<Value> q = optionalInput(imp, n, 0), k = optionalInput(imp, n, 1), v = optionalInput(imp, n, 2);
  if (failed(q) || failed(k) || failed(v)) return failure();
  if (!*q || !*k || !*v) return imp.fail("FlexAttention needs Q, K and V");
  for (Value x : {*q, *k, *v})
    if (!cast<RankedTensorType>(x.getType()).hasStaticShape() || dimsOf(x).size() != 4)
      return imp.fail("FlexAttention needs static 4-D Q, K and V");
  ArrayRef<int64_t> qd = dimsOf(*q), kd = dimsOf(*k);
  if (kd[1] < 1 || qd[1] % kd[1] || dimsOf(*v)[1] != kd[1])
    return imp.fail("Q's heads must be a multiple of K's and V's");
  Type et = cast<RankedTensorType>(q->getType()).getElementType();
  double scale = 1.0 / std::sqrt(double(qd[3]));
  if (const auto *a = attrOf(n, "scale")) scale = a->f();
  int64_t precision = et.isF16() || et.isBF16() ? 1 : onnxFloatType(et);
  if (const auto *a = attrOf(n, "softmax_precision")) precision = a->i();
  if (precision != 1 && precision != 10 && precision != 11 && precision != 16)
    return imp.fail("softmax_precision must be a float type (1, 10, 11 or 16)");
  OpMaker m{imp};
  Value K = repeatHeads(imp, m, *k, kd[1], qd[1], kd[3]), V = repeatHeads(imp, m, *v, kd[1], qd[1], dimsOf(*v)[3]);
  Value s = m.scalar(std::sqrt(float(scale)), et);
  Value scores = m.op("MatMul", "matmul", {m.op("Mul", "mul", {*q, s}), m.transpose(m.op("Mul", "mul", {K, s}), {0, 1, 3, 2})});
  auto toPrecision = [&](Value x) {
    return onnxFloatType(cast<RankedTensorType>(x.getType()).getElementType()) == precision
               ? x : m.op("Cast", "cast", {x}, {m.i64("to", precision)});
  };
  auto applyMod = [&](const char *name, Value x) -> FailureOr<Value> {
    const auto *g = attrOf(n, name);
    if (!g) return x;
    if (g->type() != onnx::AttributeProto::GRAPH) return imp.fail(std::string(name) + " must be a graph");
    if (!m.ok) return failure();
    auto outs = importSubgraph(imp, g->g(), name, {x});
    if (failed(outs)) return failure();
    if (outs->size() != 1) return imp.fail(std::string(name) + " must have one output");
    return toPrecision((*outs)[0]);
  };
  FailureOr<Value> modded = applyMod("score_mod", toPrecision(scores));
  if (failed(modded)) return failure();
  FailureOr<Value> probs = applyMod("prob_mod", m.op("Softmax", "softmax", {*modded}, {m.i64("axis", -1)}));
  if (failed(probs)) return failure();
  Value y = m.op("MatMul", "matmul", {*probs, toPrecision(V)});
  y = m.op("Cast", "cast", {y}, {m.i64("to", onnxFloatType(et))});
  if (!m.ok) return imp.fail("Q, K and V do not fit: [B, H, L, E], [B, Hkv, S, E], [B, Hkv, S, Ev]");
  bindOutput(imp, n, 0, y);
  return success();
}

} // namespace sd
