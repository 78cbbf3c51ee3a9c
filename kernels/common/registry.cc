// Op registry: a name-keyed table filled once by registerAllOps().
#include "sd/ops/registry.h"
#include <map>
#include <mutex>

namespace sd {

static std::map<std::string, OpDef, std::less<>> &table() {
  static std::map<std::string, OpDef, std::less<>> t;
  return t;
}

void registerOp(OpDef def) {
  auto &t = table();
  auto it = t.find(def.name);
  if (it == t.end()) {
    t.emplace(def.name, std::move(def));
    return;
  }
  // Shape rules and kernels register separately; merge them.
  if (def.shape) it->second.shape = def.shape;
  if (def.cpu) it->second.cpu = def.cpu;
  if (def.prepare) it->second.prepare = def.prepare;
}

void computeHalfViaF32(std::initializer_list<const char *> ops) {
  for (const char *op : ops) {
    auto it = table().find(std::string_view(op));
    if (it != table().end()) it->second.halfViaF32 = true;
  }
}

namespace cpu {
Status castTensor(const TensorView &in, const TensorView &out);
}

static bool isHalf(DType t) { return t == DType::F16 || t == DType::BF16; }

Status runKernel(const OpDef &def, const KernelContext &c) {
  if (!def.cpu) return sdError("op '", def.name, "' has no CPU kernel");
  bool half = false;
  if (def.halfViaF32) {
    for (auto &t : c.inputs) half = half || isHalf(t.dtype);
    for (auto &t : c.outputs) half = half || isHalf(t.dtype);
  }
  if (!half) return def.cpu(c);
  std::vector<std::vector<float>> store;
  store.reserve(c.inputs.size() + c.outputs.size());
  KernelContext f{c.attrs, c.inputs, c.outputs, c.pool};
  for (size_t i = 0; i < f.inputs.size() + f.outputs.size(); ++i) {
    bool in = i < f.inputs.size();
    TensorView &t = in ? f.inputs[i] : f.outputs[i - f.inputs.size()];
    if (!isHalf(t.dtype) || !t.data) continue;
    store.emplace_back(static_cast<size_t>(t.numElements()));
    TensorView wide{store.back().data(), DType::F32, t.dims};
    if (in) SD_RETURN_IF_ERROR(cpu::castTensor(t, wide));
    t = wide;
  }
  SD_RETURN_IF_ERROR(def.cpu(f));
  for (size_t i = 0; i < c.outputs.size(); ++i)
    if (isHalf(c.outputs[i].dtype) && c.outputs[i].data) SD_RETURN_IF_ERROR(cpu::castTensor(f.outputs[i], c.outputs[i]));
  return Status::ok();
}

const OpDef *findOp(std::string_view name) {
  registerAllOps();
  auto &t = table();
  auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

std::vector<const OpDef *> allOps() {
  registerAllOps();
  std::vector<const OpDef *> v;
  for (auto &e : table()) v.push_back(&e.second);
  return v;
}

bool ShapeContext::constInts(size_t i, std::vector<int64_t> &out) const {
  const TensorView *t = constInput(i);
  return t && readIntegers(*t, out);
}

Status inferShapes(std::string_view op, ShapeContext &ctx) {
  const OpDef *def = findOp(op);
  if (!def || !def->shape) return sdError("no shape rule for op '", op, "'");
  int lo = 0, hi = 0;
  if (!opArity(op, lo, hi)) return sdError("op '", op, "' has no declared arity");
  if (int(ctx.inputs.size()) < lo || int(ctx.inputs.size()) > hi)
    return sdError("op '", op, "' takes ", lo, lo == hi ? "" : "..", lo == hi ? "" : std::to_string(hi),
                   " operands, got ", ctx.inputs.size());
  for (int i = 0; i < lo; ++i)
    if (!ctx.hasInput(size_t(i))) return sdError("op '", op, "' is missing required operand ", i);
  // Rules index dims freely; an operand of unknown rank never reaches them.
  for (size_t i = 0; i < ctx.inputs.size(); ++i)
    if (ctx.hasInput(i) && !ctx.inputs[i].rankKnown) return sdError("operand ", i, " of '", op, "' has unknown rank");
  ctx.constInputs.resize(ctx.inputs.size(), nullptr);
  if (ctx.numOutputs == 0 || ctx.numOutputs > 4096) return sdError("op '", op, "' has ", ctx.numOutputs, " results");
  ctx.outputs.clear();
  SD_RETURN_IF_ERROR(def->shape(ctx));
  // No rule may produce a negative dim or a tensor past 2^40 elements; later
  // code multiplies dims freely and allocates from them.
  for (const TensorInfo &o : ctx.outputs) {
    int64_t n = 1;
    for (int64_t d : o.dims) {
      if (d < kUnknownDim) return sdError("op '", op, "' yields negative dim ", d);
      if (d <= 0) continue;
      if (n > (int64_t(1) << 40) / d) return sdError("op '", op, "' yields a tensor of more than 2^40 elements");
      n *= d;
    }
  }
  if (ctx.outputs.size() < ctx.numOutputs)
    return sdError("op '", op, "' produces ", ctx.outputs.size(),
                   " results, ", ctx.numOutputs, " expected");
  ctx.outputs.resize(ctx.numOutputs);
  return Status::ok();
}

} // namespace sd
