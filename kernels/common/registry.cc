// The op schema table and the kernel registries, filled once by registerAllOps().
#include "sd/ops/registry.h"
#include "sd/ops/threadpool.h"
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>

namespace sd {

static std::map<std::string, OpSchema, std::less<>> &schemaTable() {
  static std::map<std::string, OpSchema, std::less<>> t;
  return t;
}

// Called by the shape-rule files; arity comes from the table in arity.cc.
void registerShapeRule(const char *op, ShapeFn fn) {
  OpSchema s;
  s.name = op;
  s.shape = fn;
  opArity(op, s.minInputs, s.maxInputs);
  schemaTable()[s.name] = std::move(s);
}

const OpSchema *findSchema(std::string_view name) {
  registerAllOps();
  auto &t = schemaTable();
  auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

std::vector<const OpSchema *> allSchemas() {
  registerAllOps();
  std::vector<const OpSchema *> v;
  for (auto &e : schemaTable()) v.push_back(&e.second);
  return v;
}

TypeSet TypeSet::integers() {
  return {DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64};
}

std::vector<DType> TypeSet::list() const {
  std::vector<DType> v;
  for (int32_t i = 1; i < 32; ++i)
    if (bits_ & (1u << i)) v.push_back(DType(i));
  return v;
}

std::string TypeSet::describe() const {
  std::string s;
  for (DType t : list()) s += (s.empty() ? "" : ", ") + std::string(dtypeName(t));
  return s.empty() ? "nothing" : s;
}

void KernelRegistry::add(KernelDef def) {
  if (def.halfViaF32) def.types = def.types | TypeSet::halves();
  std::string op = def.op;
  kernels_[op] = std::move(def);
}

const KernelDef *KernelRegistry::find(std::string_view op) const {
  auto it = kernels_.find(op);
  return it == kernels_.end() ? nullptr : &it->second;
}

std::vector<const KernelDef *> KernelRegistry::all() const {
  std::vector<const KernelDef *> v;
  for (auto &e : kernels_) v.push_back(&e.second);
  return v;
}

StatusOr<const KernelDef *> KernelRegistry::bind(std::string_view op, const std::vector<DType> &inputs,
                                                 const std::vector<DType> &outputs) const {
  const KernelDef *k = find(op);
  if (!k) return sdError("op '", op, "' has no kernel on device '", backend_, "'");
  const std::vector<DType> &side = k->typeOperand < 0 ? outputs : inputs;
  size_t i = k->typeOperand < 0 ? 0 : size_t(k->typeOperand);
  if (i < side.size() && side[i] != DType::Undefined && !k->types.contains(side[i]))
    return sdError("op '", op, "' on device '", backend_, "' does not compute ", dtypeName(side[i]), " (it takes ",
                   k->types.describe(), ")");
  if (!k->resultTypes.empty() && !outputs.empty() && outputs[0] != DType::Undefined &&
      !k->resultTypes.contains(outputs[0]))
    return sdError("op '", op, "' on device '", backend_, "' does not produce ", dtypeName(outputs[0]),
                   " (it produces ", k->resultTypes.describe(), ")");
  return k;
}

namespace cpu {
Status castTensor(const TensorView &in, const TensorView &out);
}

bool widensHalves(const KernelDef &def, const KernelContext &c) {
  if (!def.halfViaF32) return false;
  for (auto &t : c.inputs)
    if (dtypeIsHalf(t.dtype)) return true;
  for (auto &t : c.outputs)
    if (dtypeIsHalf(t.dtype)) return true;
  return false;
}

HalfOperands halfOperandsOf(const KernelContext &c) {
  HalfOperands h{c, {}, {}};
  auto standIn = [](TensorView &t) { t = TensorView{nullptr, DType::F32, t.dims}; };
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (dtypeIsHalf(c.inputs[i].dtype) && c.inputs[i].data) {
      standIn(h.wide.inputs[i]);
      h.widenInputs.push_back(i);
    }
  for (size_t o = 0; o < c.outputs.size(); ++o)
    if (dtypeIsHalf(c.outputs[o].dtype) && c.outputs[o].data) {
      standIn(h.wide.outputs[o]);
      h.roundOutputs.push_back(o);
    }
  return h;
}

Status convertHalf(ThreadPool *pool, const TensorView &from, const TensorView &to) {
  const int64_t n = from.numElements();
  if (n != to.numElements()) return sdError("converting ", n, " elements into ", to.numElements());
  // Chunks of 16K elements: a conversion streams memory, so threads only pay
  // off on tensors of some size (a thread's start costs about a chunk's time).
  constexpr int64_t kChunk = int64_t(1) << 14;
  const size_t fromSize = dtypeSize(from.dtype), toSize = dtypeSize(to.dtype);
  std::atomic<bool> failed{false};
  parallelFor(pool, (n + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
    const int64_t i0 = c0 * kChunk, len = std::min(n, c1 * kChunk) - i0;
    TensorView f{static_cast<uint8_t *>(from.data) + size_t(i0) * fromSize, from.dtype, {len}};
    TensorView t{static_cast<uint8_t *>(to.data) + size_t(i0) * toSize, to.dtype, {len}};
    if (!cpu::castTensor(f, t).isOk()) failed = true;
  });
  return failed ? sdError("cannot convert ", dtypeName(from.dtype), " to ", dtypeName(to.dtype)) : Status::ok();
}

Status runWidened(const KernelDef &def, const KernelContext &narrow, const HalfOperands &h) {
  for (size_t i : h.widenInputs) SD_RETURN_IF_ERROR(convertHalf(narrow.pool, narrow.inputs[i], h.wide.inputs[i]));
  SD_RETURN_IF_ERROR(def.run(h.wide));
  for (size_t o : h.roundOutputs) SD_RETURN_IF_ERROR(convertHalf(narrow.pool, h.wide.outputs[o], narrow.outputs[o]));
  return Status::ok();
}

Status runKernel(const KernelDef &def, const KernelContext &c) {
  if (!widensHalves(def, c)) return def.run(c);
  HalfOperands h = halfOperandsOf(c);
  std::vector<std::unique_ptr<float[]>> store; // uninitialized: every element is written before it is read
  auto allocate = [&](TensorView &t) {
    store.emplace_back(new float[size_t(t.numElements())]);
    t.data = store.back().get();
  };
  for (size_t i : h.widenInputs) allocate(h.wide.inputs[i]);
  for (size_t o : h.roundOutputs) allocate(h.wide.outputs[o]);
  return runWidened(def, c, h);
}

bool ShapeContext::constInts(size_t i, std::vector<int64_t> &out) const {
  const TensorView *t = constInput(i);
  return t && readIntegers(*t, out);
}

Status inferShapes(std::string_view op, ShapeContext &ctx) {
  const OpSchema *s = findSchema(op);
  if (!s || !s->shape) return sdError("no shape rule for op '", op, "'");
  int lo = s->minInputs, hi = s->maxInputs;
  if (hi == 0 && lo == 0) return sdError("op '", op, "' has no declared arity");
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
  SD_RETURN_IF_ERROR(s->shape(ctx));
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
