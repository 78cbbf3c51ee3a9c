// ONNX RNN, GRU and LSTM, imported as sd ops: the input projection is one
// MatMul over the whole sequence per direction, the recurrence unrolls over
// the (static) sequence length with a MatMul and the gate arithmetic per step.
// Every piece has a VJP, so recurrent models train (full fine-tuning, or LoRA
// on their linear layers) through the normal autodiff pass.
//
// Gate order and equations follow the ONNX operator definitions: LSTM iofc
// with peepholes (i, o, f) and input_forget, GRU zrh with linear_before_reset,
// clip applied to every activation's input, per-direction activations with
// activation_alpha/beta consumed in order by the functions that take them (as
// ONNX Runtime does), sequence_lens masking (steps past a row's length keep
// its state and emit zeros), layout 0 and 1.
#include "RecurrentHandler.h"
#include "OnnxImporter.h"
#include "OpMaker.h"

using namespace mlir;
using namespace sd::ir;

namespace sd {
namespace {

enum class Cell { RNN, GRU, LSTM };

struct Activation {
  std::string name;
  float alpha = 0, beta = 0;
};

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

struct Recurrence {
  NodeImporter &imp;
  OpMaker m;
  Cell cell;
  int64_t hidden = 0, gates = 1;
  float clip = 0;
  bool inputForget = false, linearBeforeReset = false;
  Type et;

  Value scalar(double v) { return m.scalar(v, et); }
  Value index(int64_t i) { return imp.constI64({i}, /*scalar=*/true); }
  Value take(Value x, int64_t axis, int64_t i) { return m.op("Gather", "gather", {x, index(i)}, {m.i64("axis", axis)}); }
  // Columns [from, from + count) of a 2-D value; rows [from, from + count) when axis 0.
  Value cols(Value x, int64_t from, int64_t count, int64_t axis = 1) {
    return m.op("Slice", "slice", {x, imp.constI64({from}), imp.constI64({from + count}), imp.constI64({axis}), imp.none()});
  }
  Value add(Value a, Value b) { return m.op("Add", "add", {a, b}); }
  Value sub(Value a, Value b) { return m.op("Sub", "sub", {a, b}); }
  Value mul(Value a, Value b) { return m.op("Mul", "mul", {a, b}); }
  Value matmul(Value a, Value b) { return m.op("MatMul", "matmul", {a, b}); }
  Value transpose2d(Value x) { return m.transpose(x, {1, 0}); }

  Value apply(const Activation &f, Value x) {
    if (clip > 0) x = m.op("Clip", "clip", {x, scalar(-clip), scalar(clip)});
    auto f32 = [&](const char *n, float v) { return imp.builder.getNamedAttr(n, imp.builder.getF32FloatAttr(v)); };
    const std::string &n = f.name;
    if (n == "Sigmoid") return m.op("Sigmoid", "sigmoid", {x});
    if (n == "Tanh") return m.op("Tanh", "tanh", {x});
    if (n == "Relu") return m.op("Relu", "relu", {x});
    if (n == "Softsign") return m.op("Softsign", "softsign", {x});
    if (n == "Softplus") return m.op("Softplus", "softplus", {x});
    if (n == "Affine") return add(mul(x, scalar(f.alpha)), scalar(f.beta));
    if (n == "ScaledTanh") return mul(m.op("Tanh", "tanh", {mul(x, scalar(f.beta))}), scalar(f.alpha));
    if (n == "LeakyRelu") return m.op("LeakyRelu", "leaky_relu", {x}, {f32("alpha", f.alpha)});
    if (n == "ThresholdedRelu") return m.op("ThresholdedRelu", "thresholded_relu", {x}, {f32("alpha", f.alpha)});
    if (n == "Elu") return m.op("Elu", "elu", {x}, {f32("alpha", f.alpha)});
    if (n == "HardSigmoid") return m.op("HardSigmoid", "hard_sigmoid", {x}, {f32("alpha", f.alpha), f32("beta", f.beta)});
    m.ok = false;
    (void)imp.fail("activation '" + n + "' is not an ONNX RNN activation");
    return Value();
  }

  // One step of one direction: the new hidden (and cell) state.
  void step(Value xt, Value rT, Value rhT, Value rbh, Value peep, ArrayRef<Activation> fns, Value &h, Value &c) {
    int64_t H = hidden;
    if (cell == Cell::RNN) {
      h = apply(fns[0], add(xt, matmul(h, rT)));
      return;
    }
    if (cell == Cell::LSTM) {
      Value g = add(xt, matmul(h, rT));
      Value i = cols(g, 0, H), o = cols(g, H, H), f = cols(g, 2 * H, H), cc = cols(g, 3 * H, H);
      if (peep) {
        i = add(i, mul(cols(peep, 0, H, 0), c));
        f = add(f, mul(cols(peep, 2 * H, H, 0), c));
      }
      i = apply(fns[0], i);
      f = inputForget ? sub(scalar(1.0), i) : apply(fns[0], f);
      c = add(mul(f, c), mul(i, apply(fns[1], cc)));
      if (peep) o = add(o, mul(cols(peep, H, H, 0), c));
      h = mul(apply(fns[0], o), apply(fns[2], c));
      return;
    }
    // GRU: rT holds the z and r columns, rhT the h ones.
    Value zr = add(cols(xt, 0, 2 * H), matmul(h, rT));
    Value z = apply(fns[0], cols(zr, 0, H)), r = apply(fns[0], cols(zr, H, H));
    Value xh = cols(xt, 2 * H, H);
    Value hh = linearBeforeReset ? mul(r, rbh ? add(matmul(h, rhT), rbh) : matmul(h, rhT)) : matmul(mul(r, h), rhT);
    Value candidate = apply(fns[1], add(xh, hh));
    h = add(candidate, mul(z, sub(h, candidate))); // (1 - z) * candidate + z * h
  }
};

} // namespace

LogicalResult importRecurrent(NodeImporter &imp, const onnx::NodeProto &n, const OpSpec &) {
  Cell cell = n.op_type() == "LSTM" ? Cell::LSTM : n.op_type() == "GRU" ? Cell::GRU : Cell::RNN;
  Recurrence rec{imp, OpMaker{imp}, cell};
  rec.gates = cell == Cell::LSTM ? 4 : cell == Cell::GRU ? 3 : 1;
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
  rec.hidden = H;
  rec.et = xt.getElementType();
  if (H <= 0 || wt.getDimSize(0) != dirs || wt.getDimSize(1) != rec.gates * H)
    return imp.fail("W is " + std::to_string(wt.getDimSize(0)) + "x" + std::to_string(wt.getDimSize(1)) + "x... but " +
                    direction + " with hidden_size " + std::to_string(H) + " needs " + std::to_string(dirs) + "x" +
                    std::to_string(rec.gates * H) + "x...");
  OpMaker &m = rec.m;
  Value seqMajor = layout ? m.transpose(*x, {1, 0, 2}) : *x;
  if (!m.ok) return failure();
  auto sx = cast<RankedTensorType>(seqMajor.getType());
  int64_t seq = sx.getDimSize(0), batch = sx.getDimSize(1);
  if (ShapedType::isDynamic(seq) || ShapedType::isDynamic(batch))
    return imp.fail("the sequence length and batch size must be static to unroll the recurrence; give --shapes");
  if (seq > imp.options->maxUnroll)
    return imp.fail("runs " + std::to_string(seq) + " steps; recurrences unroll, up to --max-unroll " +
                    std::to_string(imp.options->maxUnroll));
  auto stateMajor = [&](Value s) { return s && layout ? m.transpose(s, {1, 0, 2}) : s; };
  h0 = stateMajor(h0), c0 = stateMajor(c0);

  // Activations: per direction, the cell's count of them.
  size_t perDir = cell == Cell::LSTM ? 3 : cell == Cell::GRU ? 2 : 1;
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
  std::vector<Activation> fns;
  size_t ai = 0, bi = 0;
  for (const std::string &f : names) {
    Activation act{f, defaultAlpha(f), defaultBeta(f)};
    if (takesAlpha(f) && ai < alphas.size()) act.alpha = alphas[ai++];
    if (takesBeta(f) && bi < betas.size()) act.beta = betas[bi++];
    fns.push_back(act);
  }

  // sequence_lens: a constant that covers every row needs no masking.
  bool masked = bool(lens);
  if (lens)
    if (DenseElementsAttr c = evaluateAtImport(imp, lens))
      masked = llvm::any_of(c.getValues<APInt>(), [&](const APInt &v) { return v.getSExtValue() != seq; });
  Type lensType = lens ? cast<ShapedType>(lens.getType()).getElementType() : Type();

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
    Value rT, rhT;
    if (cell == Cell::GRU) {
      rT = rec.transpose2d(rec.cols(rd, 0, 2 * H, 0));
      rhT = rec.transpose2d(rec.cols(rd, 2 * H, H, 0));
    } else {
      rT = rec.transpose2d(rd);
    }
    Value pd = peep ? rec.take(peep, 0, d) : Value();
    auto zeros = [&] {
      auto type = RankedTensorType::get({batch, H}, rec.et);
      return imp.builder.create<ConstantOp>(imp.loc, type, DenseElementsAttr::get(type, imp.builder.getZeroAttr(rec.et)))
          .getResult();
    };
    Value h = h0 ? rec.take(h0, 0, d) : zeros();
    Value c = cell == Cell::LSTM ? (c0 ? rec.take(c0, 0, d) : zeros()) : Value();
    ArrayRef<Activation> dirFns(fns.data() + d * perDir, perDir);
    SmallVector<Value> steps;
    steps.resize(size_t(seq));
    for (int64_t k = 0; k < seq && m.ok; ++k) {
      int64_t t = reverse ? seq - 1 - k : k;
      Value hPrev = h, cPrev = c;
      rec.step(rec.take(xw, 0, t), rT, rhT, rbh, pd, dirFns, h, c);
      if (!m.ok) return failure();
      steps[size_t(t)] = h;
      if (masked) {
        Value live = m.op("Unsqueeze", "unsqueeze",
                          {m.op("Less", "less", {imp.constScalarLike(double(t), lensType), lens}), imp.constI64({1})});
        steps[size_t(t)] = m.op("Where", "where", {live, h, rec.scalar(0)});
        h = m.op("Where", "where", {live, h, hPrev});
        if (c) c = m.op("Where", "where", {live, c, cPrev});
      }
    }
    if (!m.ok) return failure();
    SmallVector<Value> lifted;
    for (Value s : steps) lifted.push_back(m.op("Unsqueeze", "unsqueeze", {s, imp.constI64({0, 1})}));
    ys.push_back(lifted.size() == 1 ? lifted[0] : m.op("Concat", "concat", lifted, {m.i64("axis", 0)}));
    hs2.push_back(m.op("Unsqueeze", "unsqueeze", {h, imp.constI64({0})}));
    if (c) cs.push_back(m.op("Unsqueeze", "unsqueeze", {c, imp.constI64({0})}));
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
  imp.controlFlowNotes.push_back(n.op_type() + " '" + imp.nodeName + "': " + std::to_string(seq) + " steps x " +
                                 std::to_string(dirs) + " direction(s) unrolled, one input GEMM per direction" +
                                 (masked ? ", rows masked by sequence_lens" : ""));
  Value outs[3] = {y, yh, yc};
  for (int i = 0; i < n.output_size() && i < 3; ++i)
    if (!n.output(i).empty()) imp.values[n.output(i)] = outs[i];
  if (n.output_size() > (cell == Cell::LSTM ? 3 : 2)) return imp.fail("has more outputs than " + n.op_type() + " gives");
  return success();
}

} // namespace sd
