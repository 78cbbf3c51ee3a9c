// ONNX RNN, GRU and LSTM, imported as sd ops: per direction, the input
// projection is one MatMul over the whole sequence (plus the biases), and the
// recurrence one sd.recurrence, a fused CPU kernel that runs every step (a
// GEMM with Rᵀ and the gate arithmetic) and keeps what its backward needs. Its
// VJP is one sd.recurrence_grad, so recurrent models train (full fine-tuning,
// or LoRA on their linear layers) through the normal autodiff pass.
//
// Gate order and equations follow the ONNX operator definitions: LSTM iofc
// with peepholes (i, o, f) and input_forget, GRU zrh with linear_before_reset,
// clip on the gates' inputs, per-direction activations with activation_alpha
// and _beta consumed in order by the functions that take them (as ONNX Runtime
// does), sequence_lens (steps past a row's length keep its state and emit
// zeros), layout 0 and 1.
#include "RecurrentHandler.h"
#include "OnnxImporter.h"
#include "OpLibraryBridge.h"
#include "OpMaker.h"
#include "sd/ops/recurrent_layout.h"

using namespace mlir;
using namespace sd::ir;

namespace sd {
namespace {

using recurrent::Cell;

bool takesAlpha(const std::string &f) {
  return f == "Affine" || f == "LeakyRelu" || f == "ThresholdedRelu" || f == "ScaledTanh" || f == "HardSigmoid" ||
         f == "Elu";
}
bool takesBeta(const std::string &f) { return f == "Affine" || f == "ScaledTanh" || f == "HardSigmoid"; }

// The defaults of the ONNX operators the activation names refer to.
float defaultAlpha(const std::string &f) {
  if (f == "LeakyRelu") return 0.01f;
  if (f == "HardSigmoid") return 0.2f;
  if (f == "ThresholdedRelu" || f == "Elu" || f == "Affine" || f == "ScaledTanh") return 1.0f;
  return 0;
}
float defaultBeta(const std::string &f) { return f == "HardSigmoid" ? 0.5f : f == "ScaledTanh" ? 1.0f : 0.0f; }

// The handler's building blocks, and the attributes every direction shares.
struct RecurrentImport {
  NodeImporter &imp;
  OpMaker m;
  Cell cell;
  int64_t gates = 1;
  float clip = 0;
  bool inputForget = false, linearBeforeReset = false;
  Type et;

  Value index(int64_t i) { return imp.constI64({i}, /*scalar=*/true); }
  Value take(Value x, int64_t axis, int64_t i) { return m.op("Gather", "gather", {x, index(i)}, {m.i64("axis", axis)}); }
  // Columns [from, from + count) of a 2-D value; rows [from, from + count) when axis 0.
  Value cols(Value x, int64_t from, int64_t count, int64_t axis = 1) {
    return m.op("Slice", "slice", {x, imp.constI64({from}), imp.constI64({from + count}), imp.constI64({axis}), imp.none()});
  }
  Value add(Value a, Value b) { return m.op("Add", "add", {a, b}); }
  Value matmul(Value a, Value b) { return m.op("MatMul", "matmul", {a, b}); }
  Value transpose2d(Value x) { return m.transpose(x, {1, 0}); }
};

} // namespace

LogicalResult importRecurrent(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  Cell cell = recurrent::cellOf(n.op_type());
  // The attributes every cell has, plus LSTM's input_forget and GRU's
  // linear_before_reset (an LSTM with linear_before_reset is refused).
  const char *own = cell == Cell::LSTM ? "input_forget" : cell == Cell::GRU ? "linear_before_reset" : "hidden_size";
  if (failed(onlyAttrs(imp, n, {"activation_alpha", "activation_beta", "activations", "clip", "direction",
                                "hidden_size", "layout", own})))
    return failure();
  RecurrentImport rec{imp, OpMaker{imp}, cell};
  rec.gates = recurrent::gates(cell);
  auto x = imp.lookup(n.input(0));
  if (failed(x)) return failure();
  SmallVector<Value> in;
  for (int i = 1; i < 8; ++i) {
    auto v = optionalInput(imp, n, i);
    if (failed(v)) return failure();
    in.push_back(*v);
  }
  Value w = in[0], r = in[1], b = in[2], lens = in[3], h0 = in[4], c0 = in[5], peep = in[6];
  if (!w || !r) return imp.fail("needs W and R");
  if (cell != Cell::LSTM && (c0 || peep)) return imp.fail("has more inputs than " + n.op_type() + " takes");

  const onnx::AttributeProto *hs = attrOf(n, "hidden_size");
  std::string direction = attrOf(n, "direction") ? attrOf(n, "direction")->s() : "forward";
  int64_t layout = attrOf(n, "layout") ? attrOf(n, "layout")->i() : 0;
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    return imp.fail("direction '" + direction + "' is not forward, reverse or bidirectional");
  if (layout != 0 && layout != 1) return imp.fail("layout must be 0 or 1");
  int64_t dirs = direction == "bidirectional" ? 2 : 1;
  rec.clip = attrOf(n, "clip") ? attrOf(n, "clip")->f() : 0.0f;
  rec.inputForget = attrOf(n, "input_forget") && attrOf(n, "input_forget")->i();
  rec.linearBeforeReset = attrOf(n, "linear_before_reset") && attrOf(n, "linear_before_reset")->i();
  if (attrOf(n, "clip") && !(rec.clip > 0)) return imp.fail("clip must be positive");

  auto xt = dyn_cast<RankedTensorType>(x->getType());
  auto wt = dyn_cast<RankedTensorType>(w.getType());
  if (!xt || xt.getRank() != 3 || !wt || wt.getRank() != 3 || !wt.hasStaticShape())
    return imp.fail("X must be 3-D and W a 3-D tensor of known shape");
  int64_t H = hs ? hs->i() : wt.getDimSize(1) / rec.gates;
  rec.et = xt.getElementType();
  if (H <= 0 || wt.getDimSize(0) != dirs || wt.getDimSize(1) != rec.gates * H)
    return imp.fail("W is " + std::to_string(wt.getDimSize(0)) + "x" + std::to_string(wt.getDimSize(1)) + "x... but " +
                    direction + " with hidden_size " + std::to_string(H) + " needs " + std::to_string(dirs) + "x" +
                    std::to_string(rec.gates * H) + "x...");
  OpMaker &m = rec.m;
  Value seqMajor = layout ? m.transpose(*x, {1, 0, 2}) : *x;
  if (!m.ok) return failure();
  auto sx = cast<RankedTensorType>(seqMajor.getType());
  int64_t seq = sx.getDimSize(0);
  auto stateMajor = [&](Value s) { return s && layout ? m.transpose(s, {1, 0, 2}) : s; };
  h0 = stateMajor(h0), c0 = stateMajor(c0);

  // Activations: per direction, the cell's count of them.
  size_t perDir = size_t(recurrent::activationCount(cell));
  std::vector<std::string> names;
  if (const onnx::AttributeProto *a = attrOf(n, "activations")) names.assign(a->strings().begin(), a->strings().end());
  if (names.empty())
    for (int64_t d = 0; d < dirs; ++d)
      for (const char *f : cell == Cell::LSTM ? std::vector<const char *>{"Sigmoid", "Tanh", "Tanh"}
                           : cell == Cell::GRU ? std::vector<const char *>{"Sigmoid", "Tanh"}
                                               : std::vector<const char *>{"Tanh"})
        names.push_back(f);
  if (names.size() != perDir * size_t(dirs))
    return imp.fail("has " + std::to_string(names.size()) + " activations, " + direction + " " + n.op_type() +
                    " takes " + std::to_string(perDir * size_t(dirs)));
  std::vector<float> alphas, betas;
  if (const onnx::AttributeProto *a = attrOf(n, "activation_alpha")) alphas.assign(a->floats().begin(), a->floats().end());
  if (const onnx::AttributeProto *a = attrOf(n, "activation_beta")) betas.assign(a->floats().begin(), a->floats().end());
  // Per direction: "f,g,h" and one resolved alpha and beta per function.
  std::vector<std::string> activationNames(static_cast<size_t>(dirs));
  std::vector<SmallVector<float>> activationAlpha(static_cast<size_t>(dirs)),
      activationBeta(static_cast<size_t>(dirs));
  size_t ai = 0, bi = 0;
  for (auto [k, f] : llvm::enumerate(names)) {
    float alpha = defaultAlpha(f), beta = defaultBeta(f);
    if (takesAlpha(f) && ai < alphas.size()) alpha = alphas[ai++];
    if (takesBeta(f) && bi < betas.size()) beta = betas[bi++];
    size_t d = k / perDir;
    activationNames[d] += (activationNames[d].empty() ? "" : ",") + f;
    activationAlpha[d].push_back(alpha);
    activationBeta[d].push_back(beta);
  }

  // sequence_lens: a constant that covers every row needs no masking.
  bool masked = bool(lens);
  if (lens)
    if (auto c = dyn_cast_or_null<DenseElementsAttr>(constantValue(lens))) // folded at import
      masked = llvm::any_of(c.getValues<APInt>(), [&](const APInt &v) { return v.getSExtValue() != seq; });

  SmallVector<Value> ys, hs2, cs;
  for (int64_t d = 0; d < dirs; ++d) {
    bool reverse = direction == "reverse" || d == 1;
    Value wd = rec.take(w, 0, d), rd = rec.take(r, 0, d);
    Value xw = rec.matmul(seqMajor, rec.transpose2d(wd)); // [seq, batch, G*H]: one GEMM for every step
    Value rbh;
    if (b) {
      Value bd = rec.take(b, 0, d);
      Value wb = rec.cols(bd, 0, rec.gates * H, 0), rb = rec.cols(bd, rec.gates * H, rec.gates * H, 0);
      if (cell == Cell::GRU && rec.linearBeforeReset) {
        rbh = rec.cols(rb, 2 * H, H, 0); // applied inside r * (...)
        auto zeroType = RankedTensorType::get({H}, rec.et);
        Value zero = imp.builder.create<ConstantOp>(imp.loc, zeroType,
                                                    DenseElementsAttr::get(zeroType, imp.builder.getZeroAttr(rec.et)));
        rb = m.op("Concat", "concat", {rec.cols(rb, 0, 2 * H, 0), zero}, {m.i64("axis", 0)});
      }
      xw = rec.add(xw, rec.add(wb, rb));
    }
    SmallVector<Value> operands = {xw, rd, h0 ? rec.take(h0, 0, d) : imp.none(),
                                   c0 ? rec.take(c0, 0, d) : imp.none(), peep ? rec.take(peep, 0, d) : imp.none(),
                                   rbh ? rbh : imp.none(), masked ? lens : imp.none()};
    SmallVector<NamedAttribute> attrs = {
        imp.builder.getNamedAttr("cell", imp.builder.getStringAttr(n.op_type())),
        imp.builder.getNamedAttr("activations", imp.builder.getStringAttr(activationNames[size_t(d)])),
        imp.builder.getNamedAttr("activation_alpha", imp.builder.getDenseF32ArrayAttr(activationAlpha[size_t(d)])),
        imp.builder.getNamedAttr("activation_beta", imp.builder.getDenseF32ArrayAttr(activationBeta[size_t(d)]))};
    if (reverse) attrs.push_back(m.i64("reverse", 1));
    if (rec.clip > 0) attrs.push_back(imp.builder.getNamedAttr("clip", imp.builder.getF32FloatAttr(rec.clip)));
    if (rec.inputForget) attrs.push_back(m.i64("input_forget", 1));
    if (rec.linearBeforeReset) attrs.push_back(m.i64("linear_before_reset", 1));
    if (!m.ok) return failure();
    OpSpec spec{"Recurrence", 1, "recurrence", 7, 4, nullptr};
    auto op = imp.buildOp(spec, operands, attrs, 4);
    if (failed(op)) return failure();
    ys.push_back(m.op("Unsqueeze", "unsqueeze", {(*op)->getResult(0), imp.constI64({1})}));
    hs2.push_back(m.op("Unsqueeze", "unsqueeze", {(*op)->getResult(1), imp.constI64({0})}));
    if (cell == Cell::LSTM) cs.push_back(m.op("Unsqueeze", "unsqueeze", {(*op)->getResult(2), imp.constI64({0})}));
  }
  auto join = [&](ArrayRef<Value> parts, int64_t axis) {
    return parts.size() == 1 ? parts[0] : m.op("Concat", "concat", parts, {m.i64("axis", axis)});
  };
  Value y = join(ys, 1), yh = join(hs2, 0), yc = cs.empty() ? Value() : join(cs, 0);
  if (layout) {
    y = m.transpose(y, {2, 0, 1, 3});
    yh = m.transpose(yh, {1, 0, 2});
    if (yc) yc = m.transpose(yc, {1, 0, 2});
  }
  if (!m.ok) return failure();
  imp.controlFlowNotes.push_back(n.op_type() + " '" + imp.nodeName + "': " + std::to_string(dirs) +
                                 " direction(s), each one input GEMM and one fused recurrence" +
                                 (masked ? ", rows masked by sequence_lens" : ""));
  Value outs[3] = {y, yh, yc};
  for (int i = 0; i < n.output_size() && i < 3; ++i)
    if (!n.output(i).empty()) imp.values[n.output(i)] = outs[i];
  if (n.output_size() > (cell == Cell::LSTM ? 3 : 2)) return imp.fail("has more outputs than " + n.op_type() + " gives");
  return success();
}

} // namespace sd
