// CUDA kernels of the GEMM-epilogue ops (sd-fuse-gemm-epilogues) through
// cuBLASLt's epilogues: LinearGelu as GELU_AUX_BIAS (the GELU applied to the
// product's tiles in registers, the product itself kept for the backward),
// GemmDGelu as DGELU_BGRAD (the GELU's gradient, and the bias gradient as
// the row sums). LinearGelu's addend and GemmDGelu's c are cuBLASLt's C
// (beta 1): the epilogue applies to product + C, as the ops define. In half
// types the GELU reads the f32 accumulator, before any rounding.
// cuBLASLt's GELU is the tanh form. The exact (erf) GELU, f64,
// an aux leading dimension cuBLASLt refuses (not a multiple of 8), a missing
// algorithm or misaligned pointers run the ops' parts instead, in order: the
// GEMM (LinearAdd's, or Gemm's with a C, when there is an addend), then this
// backend's Gelu / GeluGrad and ReduceSum kernels; in half types these read
// the product rounded to the half type (within the ops' tolerance).
#include "gemm_lt.h"
#include "sd/ops/attrs.h"
#include <atomic>
#include <optional>

namespace sd::cuda {
namespace {

// A kernel these ops fall back to; registered with them, so always there.
const KernelDef &part(const char *op) { return *cudaKernels().find(op); }

struct EpiloguePrepared : PreparedError {
  std::shared_ptr<LtGemm> fused; // null: no epilogue plan, the parts run
  std::shared_ptr<LtGemm> plain; // the product alone (Linear: with its bias)
  // Set when cublasLtMatmul refused the epilogue with a C (beta 1): cuBLASLt
  // chooses the algorithm without knowing beta, so that is only known at the
  // first run, which then (and every later one) runs the parts. A refused
  // call enqueues nothing, so nothing is half done.
  mutable std::atomic<bool> refusedWithC{false};
  // The fused call with C (beta 1) or without; nullopt when the parts must
  // run instead: a C cuBLASLt refused, now or at an earlier run.
  std::optional<Status> runFused(const void *a, const void *b, void *out, const void *c, cudaStream_t stream) const {
    if (c && refusedWithC) return std::nullopt;
    Status st = fused->run(a, b, out, 1.0, c ? 1.0 : 0.0, stream, c);
    if (st.isOk() || !c) return st;
    refusedWithC = true;
    return std::nullopt;
  }
  // GemmDGelu's bias gradient without the epilogue: ReduceSum over axis 0.
  AttrMap reduceAttrs;
  std::shared_ptr<const void> reducePrepared;
};

// ReduceSum's axes operand for a sum over rows, read on the host only.
constexpr int64_t kRowsAxis = 0;
TensorView rowsAxis() { return TensorView{const_cast<int64_t *>(&kRowsAxis), DType::I64, {1}}; }

bool tanhGelu(const KernelContext &c) { return c.attrs.getString("approximate", "none") == "tanh"; }

// The epilogue's plan when cuBLASLt can take this shape, else null.
std::shared_ptr<LtGemm> planFused(const PrepareContext &p, GemmShape shape) {
  if (!tanhGelu(p.kernel) || shape.dtype == DType::F64 || shape.k == 0 || shape.ldc % 8 != 0) return nullptr;
  std::shared_ptr<LtGemm> g = planGemm(p, shape);
  return g->error.empty() && !g->builtin ? g : nullptr;
}

std::shared_ptr<const void> prepareLinearGelu(const PrepareContext &p) {
  auto s = std::make_shared<EpiloguePrepared>();
  const KernelContext &c = p.kernel;
  GemmShape shape = linearShapeOf(c);
  s->plain = planGemm(p, shape);
  shape.epilogue = GemmShape::Epilogue::Gelu;
  shape.aux = c.outputs.size() > 1 ? c.outputs[1].data : nullptr;
  s->fused = planFused(p, shape);
  return s;
}

Status LinearGeluKernel(const KernelContext &c) {
  auto *s = static_cast<const EpiloguePrepared *>(c.prepared);
  if (!s) return sdError("LinearGelu was not prepared");
  if (c.outputs[0].numElements() == 0) return Status::ok();
  const TensorView &x = c.inputs[0], &w = c.inputs[1], &out = c.outputs[0];
  const TensorView &pre = c.outputs.size() > 1 ? c.outputs[1] : out;
  const void *addend = c.hasInput(3) ? c.inputs[3].data : nullptr;
  // The plan holds the addresses it was prepared for (aux, bias).
  if (s->fused && s->fused->runsOnLt(x.data, w.data, out.data, addend) &&
      s->fused->shape.aux == (&pre == &out ? nullptr : pre.data))
    if (std::optional<Status> st = s->runFused(x.data, w.data, out.data, addend, streamOf(c))) return *st;
  KernelContext linear{c.attrs, c.inputs, {pre}, c.pool, s->plain.get(), c.stream, c.comm, c.shardOwner};
  SD_RETURN_IF_ERROR(part(addend ? "LinearAdd" : "Linear").run(linear));
  KernelContext gelu{c.attrs, {pre}, {out}, c.pool, nullptr, c.stream, c.comm, c.shardOwner};
  return part("Gelu").run(gelu);
}

std::shared_ptr<const void> prepareGemmDGelu(const PrepareContext &p) {
  auto s = std::make_shared<EpiloguePrepared>();
  const KernelContext &c = p.kernel;
  GemmShape shape = gemmShapeOf(c);
  s->plain = planGemm(p, shape);
  const bool biasGrad = c.outputs.size() > 1;
  shape.epilogue = GemmShape::Epilogue::DGelu;
  shape.aux = c.inputs[2].data;
  shape.biasGrad = biasGrad ? c.outputs[1].data : nullptr;
  s->fused = planFused(p, shape);
  if (biasGrad) { // the parts' ReduceSum, prepared as a session would: axes [0] read on the host
    s->reduceAttrs.setInt("keepdims", 0);
    KernelContext sum{s->reduceAttrs, {c.outputs[0], rowsAxis()}, {c.outputs[1]}, c.pool, nullptr, c.stream};
    PrepareContext sp{sum, {false, true}, {nullptr, &kRowsAxis}, p.shared};
    const KernelDef &reduce = part("ReduceSum");
    if (reduce.prepare) s->reducePrepared = reduce.prepare(sp);
  }
  return s;
}

Status GemmDGeluKernel(const KernelContext &c) {
  auto *s = static_cast<const EpiloguePrepared *>(c.prepared);
  if (!s) return sdError("GemmDGelu was not prepared");
  const TensorView &a = c.inputs[0], &b = c.inputs[1], &pre = c.inputs[2], &grad = c.outputs[0];
  if (grad.numElements() == 0) return Status::ok();
  const bool biasGrad = c.outputs.size() > 1;
  const bool hasC = c.hasInput(3);
  const void *addend = hasC ? c.inputs[3].data : nullptr;
  if (s->fused && s->fused->runsOnLt(a.data, b.data, grad.data, addend) && s->fused->shape.aux == pre.data &&
      s->fused->shape.biasGrad == (biasGrad ? c.outputs[1].data : nullptr))
    if (std::optional<Status> st = s->runFused(a.data, b.data, grad.data, addend, streamOf(c))) return *st;
  std::vector<TensorView> operands{a, b};
  if (hasC) operands.push_back(c.inputs[3]); // Gemm's C, beta 1 (its default)
  KernelContext gemm{c.attrs, operands, {grad}, c.pool, s->plain.get(), c.stream, c.comm, c.shardOwner};
  SD_RETURN_IF_ERROR(part("Gemm").run(gemm));
  KernelContext geluGrad{c.attrs, {grad, pre}, {grad}, c.pool, nullptr, c.stream, c.comm, c.shardOwner};
  SD_RETURN_IF_ERROR(part("GeluGrad").run(geluGrad));
  if (!biasGrad) return Status::ok();
  KernelContext sum{s->reduceAttrs, {grad, rowsAxis()}, {c.outputs[1]}, c.pool, s->reducePrepared.get(), c.stream,
                    c.comm, c.shardOwner};
  return part("ReduceSum").run(sum);
}

} // namespace

void registerGemmEpilogueKernels() {
  TypeSet t = floatStorage();
  registerKernel("LinearGelu", LinearGeluKernel, t, prepareLinearGelu);
  registerKernel("GemmDGelu", GemmDGeluKernel, t, prepareGemmDGelu);
}

} // namespace sd::cuda
