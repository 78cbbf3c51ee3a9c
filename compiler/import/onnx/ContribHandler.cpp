// onnxruntime contrib ops as sd ops, after onnxruntime's contrib op docs
// (docs/ContribOperators.md) and its CPU kernels:
//  - SimplifiedLayerNormalization: RMSNorm over the last axis;
//  - SkipSimplifiedLayerNormalization: RMSNorm(input + skip [+ bias]), whose
//    fourth output is that sum (the residual stream); SkipLayerNormalization
//    the same with LayerNorm (gamma, beta);
//  - GroupQueryAttention: a packed or split q/k/v projection split into
//    heads, rotary embeddings from cos/sin caches at each token's position
//    (seqlens_k[b] + 1 - seq + i, so a prompt after `past` keys continues
//    from them), past keys and values concatenated in front (the present
//    outputs), and causal attention with kv heads repeated to the query
//    heads: the Unsqueeze/Expand/Reshape, scale, Where mask and Softmax chain
//    sd-fuse-attention fuses and sd-kv-cache caches. Every shape stays
//    dynamic, so the node imports before the shapes are known;
//  - MatMulNBits: sd.matmul_nbits, the weights kept packed.
#include "ContribHandler.h"
#include "OpMaker.h"
#include <cmath>
#include <functional>
#include <map>

using namespace mlir;
using namespace sd::ir;

namespace sd {
namespace {

NamedAttribute f32Attr(NodeImporter &imp, const char *name, double v) {
  return imp.builder.getNamedAttr(name, imp.builder.getF32FloatAttr(float(v)));
}

double floatAttr(const onnx::NodeProto &n, const char *name, double def) {
  const auto *a = attrOf(n, name);
  return a ? a->f() : def;
}

int64_t intAttr(const onnx::NodeProto &n, const char *name, int64_t def) {
  const auto *a = attrOf(n, name);
  return a ? a->i() : def;
}

// Outputs past the first that hold statistics (mean, inverse std) no sd op gives.
LogicalResult noStatisticsOutputs(NodeImporter &imp, const onnx::NodeProto &n, std::initializer_list<int> outputs) {
  for (int i : outputs)
    if (i < n.output_size() && !n.output(i).empty())
      return imp.fail("output " + std::to_string(i) + " (normalization statistics) is not supported");
  return success();
}

Value rmsNorm(NodeImporter &imp, OpMaker &m, const onnx::NodeProto &n, Value x, Value scale) {
  return m.op("RMSNormalization", "rms_normalization", {x, scale},
              {m.i64("axis", -1), f32Attr(imp, "epsilon", floatAttr(n, "epsilon", 1e-5))});
}

// input + skip [+ bias], normalized by `norm`; the sum is output 3 (the residual stream).
LogicalResult importSkipNorm(NodeImporter &imp, const onnx::NodeProto &n, int biasInput,
                             const std::function<Value(OpMaker &, Value)> &norm) {
  FailureOr<Value> x = optionalInput(imp, n, 0), skip = optionalInput(imp, n, 1), bias = optionalInput(imp, n, biasInput);
  if (failed(x) || failed(skip) || failed(bias)) return failure();
  if (!*x || !*skip) return imp.fail(n.op_type() + " needs input and skip");
  OpMaker m{imp};
  Value sum = m.op("Add", "add", {*x, *skip});
  if (*bias) sum = m.op("Add", "add", {sum, *bias});
  Value y = m.ok ? norm(m, sum) : Value();
  if (!m.ok || !y) return imp.fail("input, skip, bias and the normalization's weights do not fit together");
  bindOutput(imp, n, 0, y);
  bindOutput(imp, n, 3, sum);
  return success();
}

// Inputs: input, skip, gamma, bias (no beta).
LogicalResult importSkipSimplifiedLayerNorm(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"epsilon"})) || failed(noStatisticsOutputs(imp, n, {1, 2}))) return failure();
  FailureOr<Value> gamma = optionalInput(imp, n, 2);
  if (failed(gamma)) return failure();
  if (!*gamma) return imp.fail("SkipSimplifiedLayerNormalization needs gamma");
  return importSkipNorm(imp, n, 3, [&](OpMaker &m, Value sum) { return rmsNorm(imp, m, n, sum, *gamma); });
}

// Inputs: input, skip, gamma, beta, bias: LayerNorm over the last axis (Phi-2's builds).
LogicalResult importSkipLayerNorm(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"epsilon"})) || failed(noStatisticsOutputs(imp, n, {1, 2}))) return failure();
  FailureOr<Value> gamma = optionalInput(imp, n, 2), beta = optionalInput(imp, n, 3);
  if (failed(gamma) || failed(beta)) return failure();
  if (!*gamma) return imp.fail("SkipLayerNormalization needs gamma");
  return importSkipNorm(imp, n, 4, [&](OpMaker &m, Value sum) {
    return m.op("LayerNormalization", "layer_normalization", {sum, *gamma, *beta ? *beta : imp.none()},
                {m.i64("axis", -1), f32Attr(imp, "epsilon", floatAttr(n, "epsilon", 1e-5))});
  });
}

LogicalResult importGroupQueryAttention(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"num_heads", "kv_num_heads", "scale", "local_window_size", "softcap", "do_rotary",
                                "rotary_interleaved", "smooth_softmax", "qk_output"}))) return failure();
  if (intAttr(n, "local_window_size", -1) != -1) return imp.fail("local_window_size (sliding windows) is not supported");
  if (floatAttr(n, "softcap", 0) != 0) return imp.fail("softcap is not supported");
  if (intAttr(n, "smooth_softmax", 0) != 0) return imp.fail("smooth_softmax is not supported");
  if (intAttr(n, "qk_output", 0) != 0) return imp.fail("qk_output is not supported");
  auto input = [&](int i) { return optionalInput(imp, n, i); };
  FailureOr<Value> query = input(0), key = input(1), value = input(2), pastK = input(3), pastV = input(4),
                   seqlens = input(5), cosCache = input(7), sinCache = input(8), positionIds = input(9),
                   bias = input(10), sink = input(11);
  for (auto *v : {&query, &key, &value, &pastK, &pastV, &seqlens, &cosCache, &sinCache, &positionIds, &bias, &sink})
    if (failed(*v)) return failure();
  if (*bias || *sink) return imp.fail("attention_bias and head_sink are not supported");
  if (!*seqlens) return imp.fail("GroupQueryAttention needs seqlens_k");
  if (bool(*pastK) != bool(*pastV)) return imp.fail("past_key and past_value go together");
  if (bool(*key) != bool(*value)) return imp.fail("key and value go together");
  const int64_t heads = intAttr(n, "num_heads", 0), kvHeads = intAttr(n, "kv_num_heads", 0);
  if (heads < 1 || kvHeads < 1 || heads % kvHeads) return imp.fail("num_heads must be a multiple of kv_num_heads >= 1");
  ArrayRef<int64_t> qd = dimsOf(*query);
  if (qd.size() != 3 || ShapedType::isDynamic(qd[2])) return imp.fail("query must be [batch, seq, hidden] with a static hidden size");
  const int64_t width = *key ? heads : heads + 2 * kvHeads; // packed q|k|v or q alone
  if (qd[2] % width) return imp.fail("the query's hidden size does not divide into the heads");
  const int64_t d = qd[2] / width;
  OpMaker m{imp};
  Type et = elementOf(*query);
  auto slice = [&](Value v, int64_t start, int64_t end) {
    return m.op("Slice", "slice", {v, imp.constI64({start}), imp.constI64({end}), imp.constI64({2}), imp.constI64({1})});
  };
  auto splitHeads = [&](Value x, int64_t count) { // [B, S, count*d] -> [B, count, S, d]
    return m.transpose(m.reshape(x, {0, 0, count, d}), {0, 2, 1, 3});
  };
  Value q = *query, k = *key, v = *value;
  if (!*key) {
    k = slice(q, heads * d, (heads + kvHeads) * d);
    v = slice(q, (heads + kvHeads) * d, (heads + 2 * kvHeads) * d);
    q = slice(q, 0, heads * d);
  }
  Value Q = splitHeads(q, heads), K = splitHeads(k, kvHeads), V = splitHeads(v, kvHeads);
  // Token i of row b sits at seqlens_k[b] + 1 - seq + i (the row's keys end at seqlens_k[b]).
  Value seq = m.op("Shape", "shape", {*query}, {m.i64("start", 1), m.i64("end", 2)});
  Value last = m.op("Cast", "cast", {*seqlens}, {m.i64("to", 7)});
  Value first = m.op("Sub", "sub", {m.op("Add", "add", {last, imp.constI64({1})}), seq});
  Value steps = m.op("Range", "range", {imp.constI64({0}, true), m.reshape(seq, {}), imp.constI64({1}, true)});
  Value positions = m.op("Add", "add", {m.op("Unsqueeze", "unsqueeze", {first, imp.constI64({1})}),
                                         m.op("Unsqueeze", "unsqueeze", {steps, imp.constI64({0})})}); // [B, S]
  if (intAttr(n, "do_rotary", 0)) {
    if (!*cosCache || !*sinCache) return imp.fail("do_rotary needs cos_cache and sin_cache");
    // The caches' width says how many features rotate: all of each head, or
    // its first 2 * width (partial rotary, as Phi-2's 40%), the rest passed on.
    ArrayRef<int64_t> cd = dimsOf(*cosCache);
    if (cd.size() != 2 || cd[1] < 1 || cd[1] * 2 > d)
      return imp.fail("cos_cache must be [positions, rotary_dim / 2] with rotary_dim at most the head size");
    const int64_t rot = cd[1] * 2;
    SmallVector<NamedAttribute> attrs;
    if (intAttr(n, "rotary_interleaved", 0)) attrs.push_back(m.i64("interleaved", 1));
    Value at = *positionIds ? *positionIds : positions;
    auto rotate = [&](Value x) {
      auto feature = [&](int64_t start, int64_t end) {
        return m.op("Slice", "slice", {x, imp.constI64({start}), imp.constI64({end}), imp.constI64({3}), imp.constI64({1})});
      };
      Value part = rot < d ? feature(0, rot) : x;
      Value out = m.op("Rotary", "rotary", {part, *cosCache, *sinCache, at}, attrs);
      return rot < d ? m.op("Concat", "concat", {out, feature(rot, d)}, {m.i64("axis", -1)}) : out;
    };
    Q = rotate(Q);
    K = rotate(K);
  }
  if (*pastK) { // read as [B, kv_heads, past, d]: the model may leave d unnamed (onnxruntime-genai's kv_cache_dim)
    K = m.op("Concat", "concat", {m.reshape(*pastK, {0, kvHeads, -1, d}), K}, {m.i64("axis", 2)});
    V = m.op("Concat", "concat", {m.reshape(*pastV, {0, kvHeads, -1, d}), V}, {m.i64("axis", 2)});
  }
  Value presentK = K, presentV = V;
  auto repeat = [&](Value x) { // [B, kvHeads, T, d] -> [B, heads, T, d], each kv head for heads/kvHeads queries
    if (heads == kvHeads) return x;
    Value e = m.op("Expand", "expand", {m.op("Unsqueeze", "unsqueeze", {x, imp.constI64({2})}),
                                        imp.constI64({1, 1, heads / kvHeads, 1, 1})});
    return m.reshape(e, {0, heads, -1, d});
  };
  double scale = floatAttr(n, "scale", 0);
  if (scale == 0) scale = 1.0 / std::sqrt(double(d));
  Value scores = m.op("Mul", "mul", {m.op("MatMul", "matmul", {Q, m.transpose(repeat(K), {0, 1, 3, 2})}),
                                     m.scalar(scale, et)});
  // Key j is hidden from the query at position p when j > p.
  Value keyCount = m.op("Shape", "shape", {K}, {m.i64("start", 2), m.i64("end", 3)});
  Value keys = m.op("Range", "range", {imp.constI64({0}, true), m.reshape(keyCount, {}), imp.constI64({1}, true)});
  Value masked = m.op("Greater", "greater", {m.reshape(keys, {1, 1, 1, -1}),
                                             m.op("Unsqueeze", "unsqueeze", {positions, imp.constI64({1, 3})})});
  Value probs = m.op("Softmax", "softmax", {m.op("Where", "where", {masked, m.scalar(-INFINITY, et), scores})},
                     {m.i64("axis", -1)});
  Value out = m.op("MatMul", "matmul", {probs, repeat(V)});
  out = m.reshape(m.transpose(out, {0, 2, 1, 3}), {0, 0, heads * d});
  if (!m.ok) return imp.fail("the query, key, value, past and cos/sin caches do not fit together");
  bindOutput(imp, n, 0, out);
  bindOutput(imp, n, 1, presentK);
  bindOutput(imp, n, 2, presentV);
  return success();
}

// Inputs: A, B (packed), scales, zero_points, g_idx (refused), bias. The
// weights stay packed as onnxruntime stores them (sd.matmul_nbits reads them
// so), so a 4-bit model's weights take an eighth of their f32 bytes.
LogicalResult importMatMulNBits(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"K", "N", "bits", "block_size", "accuracy_level", "weight_prepacked"})))
    return failure();
  const int64_t K = intAttr(n, "K", 0), N = intAttr(n, "N", 0), bits = intAttr(n, "bits", 4),
                block = intAttr(n, "block_size", 0);
  if (K < 1 || N < 1) return imp.fail("K and N must be positive");
  if (bits != 2 && bits != 4 && bits != 8) return imp.fail("bits " + std::to_string(bits) + " is not supported (2, 4 or 8)");
  if (block < 16 || (block & (block - 1))) return imp.fail("block_size must be a power of two >= 16");
  if (intAttr(n, "weight_prepacked", 0) != 0) return imp.fail("weight_prepacked (a CUDA layout) is not supported");
  auto input = [&](int i) { return optionalInput(imp, n, i); };
  FailureOr<Value> a = input(0), b = input(1), scales = input(2), zeros = input(3), gIdx = input(4), bias = input(5);
  for (auto *v : {&a, &b, &scales, &zeros, &gIdx, &bias})
    if (failed(*v)) return failure();
  if (!*a || !*b || !*scales) return imp.fail("MatMulNBits needs A, B and scales");
  if (*gIdx) return imp.fail("g_idx (deprecated act-order groups) is not supported");
  OpMaker m{imp};
  Value y = m.op("MatMulNBits", "matmul_nbits",
                 {*a, *b, *scales, *zeros ? *zeros : imp.none(), *bias ? *bias : imp.none()},
                 {m.i64("K", K), m.i64("N", N), m.i64("bits", bits), m.i64("block_size", block),
                  m.i64("accuracy_level", intAttr(n, "accuracy_level", 0))});
  if (!m.ok) return imp.fail("A, B, scales, zero_points and bias do not fit K, N, bits and block_size");
  bindOutput(imp, n, 0, y);
  return success();
}

} // namespace

LogicalResult importSimplifiedLayerNorm(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  if (failed(onlyAttrs(imp, n, {"axis", "epsilon", "stash_type"})) || failed(noStatisticsOutputs(imp, n, {1})))
    return failure();
  int64_t axis = intAttr(n, "axis", -1);
  FailureOr<Value> x = optionalInput(imp, n, 0), scale = optionalInput(imp, n, 1);
  if (failed(x) || failed(scale)) return failure();
  if (!*scale) return imp.fail("SimplifiedLayerNormalization needs a scale");
  int64_t rank = int64_t(dimsOf(*x).size());
  if (axis != -1 && axis != rank - 1) return imp.fail("only the last axis is supported");
  OpMaker m{imp};
  Value y = rmsNorm(imp, m, n, *x, *scale);
  if (!m.ok) return imp.fail("the scale does not fit the input");
  bindOutput(imp, n, 0, y);
  return success();
}

OpHandler findContribHandler(const std::string &opType) {
  static const std::map<std::string, OpHandler> handlers = {
      {"GroupQueryAttention", importGroupQueryAttention},
      {"SkipSimplifiedLayerNormalization", importSkipSimplifiedLayerNorm},
      {"SkipLayerNormalization", importSkipLayerNorm},
      {"SimplifiedLayerNormalization", importSimplifiedLayerNorm},
      {"MatMulNBits", importMatMulNBits},
  };
  auto it = handlers.find(opType);
  return it == handlers.end() ? nullptr : it->second;
}

} // namespace sd
