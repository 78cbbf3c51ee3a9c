// Shape rules of the elementwise family: unary math, binary broadcast ops,
// comparisons and logic, variadic Min/Max/Mean/Sum, Where, Clip, Cast.
#include "shape_util.h"
#include "sd/ops/fused_elementwise.h"

namespace sd {

static Status sameShape(ShapeContext &c) {
  SD_CHECK_ARG(c.hasInput(0), "missing input");
  c.outputs = {c.inputs[0]};
  return Status::ok();
}

static Status geluShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "approximate", {"none", "tanh"}));
  SD_CHECK_ARG(dtypeIsFloat(c.inputs[0].dtype), "expects a float tensor, got ", dtypeName(c.inputs[0].dtype));
  c.outputs = {c.inputs[0]};
  return Status::ok();
}

static Status bitShiftShape(ShapeContext &c);

static Status floatUnary(ShapeContext &c) {
  SD_CHECK_ARG(c.hasInput(0), "missing input");
  SD_CHECK_ARG(dtypeIsFloat(c.inputs[0].dtype), "expects a float tensor, got ",
               dtypeName(c.inputs[0].dtype));
  c.outputs = {c.inputs[0]};
  return Status::ok();
}

static Status boolResult(ShapeContext &c) {
  SD_CHECK_ARG(c.hasInput(0), "missing input");
  c.outputs = {sameAs(c.inputs[0], DType::Bool)};
  return Status::ok();
}

static Status broadcastTo(ShapeContext &c, DType resultType, size_t first = 0) {
  std::vector<const TensorInfo *> ins;
  DType dt = DType::Undefined;
  for (size_t i = first; i < c.inputs.size(); ++i) {
    if (!c.hasInput(i)) continue;
    ins.push_back(&c.inputs[i]);
    if (dt == DType::Undefined) dt = c.inputs[i].dtype;
  }
  SD_CHECK_ARG(!ins.empty(), "missing inputs");
  TensorInfo out;
  SD_RETURN_IF_ERROR(broadcastDims(ins, out));
  out.dtype = resultType == DType::Undefined ? dt : resultType;
  c.outputs = {out};
  return Status::ok();
}

static Status sameTypeBroadcast(ShapeContext &c) {
  for (size_t i = 1; i < c.inputs.size(); ++i)
    if (c.hasInput(i) && c.inputs[i].dtype != c.inputs[0].dtype)
      return sdError("operand ", i, " has type ", dtypeName(c.inputs[i].dtype),
                     ", operand 0 has ", dtypeName(c.inputs[0].dtype));
  return broadcastTo(c, DType::Undefined);
}
static Status powBroadcast(ShapeContext &c) { return broadcastTo(c, DType::Undefined); }
static Status compareBroadcast(ShapeContext &c) { return broadcastTo(c, DType::Bool); }
static Status bitShiftBroadcast(ShapeContext &c) { return broadcastTo(c, DType::Undefined); }
// Bitwise ops: integer operands only (ONNX's T is the signed and unsigned ints).
static Status integerUnary(ShapeContext &c) {
  SD_CHECK_ARG(c.hasInput(0), "missing input");
  SD_CHECK_ARG(dtypeIsInteger(c.inputs[0].dtype), "expects an integer tensor, got ", dtypeName(c.inputs[0].dtype));
  c.outputs = {c.inputs[0]};
  return Status::ok();
}

static Status integerBroadcast(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs.size() == 2 && dtypeIsInteger(c.inputs[0].dtype), "expects integer tensors, got ",
               dtypeName(c.inputs[0].dtype));
  return sameTypeBroadcast(c);
}

static Status bitShiftShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "direction", {"LEFT", "RIGHT"}));
  return bitShiftBroadcast(c);
}

static Status whereShape(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs.size() == 3, "Where takes 3 operands");
  SD_CHECK_ARG(c.inputs[0].dtype == DType::Bool, "condition must be bool");
  SD_CHECK_ARG(c.inputs[1].dtype == c.inputs[2].dtype, "branches differ in type");
  std::vector<const TensorInfo *> ins = {&c.inputs[0], &c.inputs[1], &c.inputs[2]};
  TensorInfo out;
  SD_RETURN_IF_ERROR(broadcastDims(ins, out));
  out.dtype = c.inputs[1].dtype;
  c.outputs = {out};
  return Status::ok();
}

static Status castShape(ShapeContext &c) {
  int64_t to = c.attrs.getInt("to", 0);
  SD_CHECK_ARG(dtypeIsKnown(int32_t(to)), "Cast to unsupported type ", to);
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "round_mode", {"up", "down", "nearest"}));
  c.outputs = {sameAs(c.inputs[0], DType(to))};
  return Status::ok();
}

// GroupedCast: each f32 input rounded to `to`, a half type.
static Status groupedCastShape(ShapeContext &c) {
  const int64_t to = c.attrs.getInt("to", 0);
  SD_CHECK_ARG(to == int64_t(DType::BF16) || to == int64_t(DType::F16), "GroupedCast to ", to,
               ": only bf16 (16) and f16 (10)");
  c.outputs.clear();
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    SD_CHECK_ARG(c.inputs[i].dtype == DType::F32, "GroupedCast: operand ", i, " is ", dtypeName(c.inputs[i].dtype),
                 ", not f32");
    c.outputs.push_back(sameAs(c.inputs[i], DType(to)));
  }
  return Status::ok();
}

// BitCast: the same bits read as `to`, which must be as wide.
static Status bitCastShape(ShapeContext &c) {
  int64_t to = c.attrs.getInt("to", 0);
  SD_CHECK_ARG(dtypeIsKnown(int32_t(to)), "BitCast to unsupported type ", to);
  SD_CHECK_ARG(dtypeSize(DType(to)) == dtypeSize(c.inputs[0].dtype), "BitCast from ", dtypeName(c.inputs[0].dtype),
               " to ", dtypeName(DType(to)), ": the widths differ");
  c.outputs = {sameAs(c.inputs[0], DType(to))};
  return Status::ok();
}

static Status castLikeShape(ShapeContext &c) {
  SD_CHECK_ARG(c.inputs.size() == 2, "CastLike takes 2 operands");
  c.outputs = {sameAs(c.inputs[0], c.inputs[1].dtype)};
  return Status::ok();
}

static Status dropoutShape(ShapeContext &c) {
  SD_CHECK_ARG(c.hasInput(0), "missing input");
  std::vector<int64_t> training;
  if (c.hasInput(2) && !c.constInts(2, training))
    return sdError("Dropout training_mode must be a constant (bind it with --bind)");
  if (!training.empty() && training[0]) {
    // Training mode with ratio 0 keeps every element (the identity, all-true
    // mask); any other ratio draws a random mask, which an inference plan does not.
    std::vector<double> ratio;
    const TensorView *r = c.hasInput(1) ? c.constInput(1) : nullptr;
    if (!r || !readDoubles(*r, ratio) || ratio.size() != 1 || ratio[0] != 0.0)
      return sdError("Dropout with training_mode=true and a ratio other than a constant 0 is not supported at inference "
                     "(it draws a random mask): export the model after model.eval(), or compile it for training");
  }
  c.outputs = {c.inputs[0], sameAs(c.inputs[0], DType::Bool)};
  return Status::ok();
}

// FusedElementwise(operands...) {program, to}: f32/bf16/f16 operands, every
// one the result's shape or a single element; the result f32 or `to`.
static Status fusedElementwiseShape(ShapeContext &c) {
  SD_RETURN_IF_ERROR(checkFusedProgram(c.attrs.getInts("program"), int64_t(c.inputs.size())));
  const DType to = DType(c.attrs.getInt("to", int64_t(DType::F32)));
  SD_CHECK_ARG(isFusedStorage(to), "FusedElementwise gives f32, bf16 or f16, not ", dtypeName(to));
  // The result's shape: an operand's with more than one element, or (all
  // single elements, as broadcasting ranks them) the highest-ranked one's.
  const TensorInfo *full = &c.inputs[0];
  for (const TensorInfo &in : c.inputs) {
    SD_CHECK_ARG(isFusedStorage(in.dtype), "FusedElementwise takes f32, bf16 or f16 operands, got ", dtypeName(in.dtype));
    SD_CHECK_ARG(in.rankKnown && in.isStatic(), "FusedElementwise takes static shapes");
    if (product(in.dims) != 1 || (product(full->dims) == 1 && in.rank() > full->rank())) full = &in;
  }
  for (const TensorInfo &in : c.inputs)
    SD_CHECK_ARG(product(in.dims) == 1 || in.dims == full->dims, "FusedElementwise operand ", formatDims(in.dims),
                 " is neither ", formatDims(full->dims), " nor one element");
  c.outputs = {TensorInfo{to, full->dims}};
  return Status::ok();
}

void registerElementwiseShapes() {
  registerShapeRule("FusedElementwise", fusedElementwiseShape);
  registerShapeRule("Dropout", dropoutShape);
  for (const char *op :
       {"Neg", "Abs", "Sign", "Identity", "Relu", "Floor", "Ceil", "Round",
        "Clip", "Not", "Shrink"})
    registerShapeRule(op, sameShape);
  registerShapeRule("BitwiseNot", integerUnary);
  for (const char *op :
       {"Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tan", "Asin", "Acos",
        "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Tanh", "Erf",
        "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Selu",
        "Celu", "ThresholdedRelu", "Softplus", "Softsign", "Mish", "Swish"})
    registerShapeRule(op, floatUnary);
  registerShapeRule("IsNaN", boolResult);
  registerShapeRule("IsInf", boolResult);
  for (const char *op : {"Add", "Sub", "Mul", "Div", "Mod", "PRelu", "Min",
                         "Max", "Mean", "Sum", "And", "Or", "Xor"})
    registerShapeRule(op, sameTypeBroadcast);
  registerShapeRule("Pow", powBroadcast);
  registerShapeRule("BitShift", bitShiftShape);
  for (const char *op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor"}) registerShapeRule(op, integerBroadcast);
  registerShapeRule("Gelu", geluShape);
  for (const char *op : {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
    registerShapeRule(op, compareBroadcast);
  registerShapeRule("Where", whereShape);
  registerShapeRule("Cast", castShape);
  registerShapeRule("GroupedCast", groupedCastShape);
  registerShapeRule("BitCast", bitCastShape);
  registerShapeRule("CastLike", castLikeShape);
}

} // namespace sd
