// CPU kernels of the GEMM-epilogue ops (sd-fuse-gemm-epilogues). Each runs
// the kernels of the ops it replaced, in their order, on the same operands:
// a fused f32 plan computes what the unfused one computes, bit for bit. Half
// types are computed through f32 (runKernel widens them), so the product
// reaches the GELU unrounded, as in cuBLASLt's epilogue.
#include "cpu_util.h"
#include "sd/ops/kernel.h"

namespace sd::cpu {
namespace {

// A kernel these ops are made of; registered with them, so always there.
const KernelDef &part(const char *op) { return *cpuKernels().find(op); }

// LinearGelu(x, w, bias, addend) -> gelu(x w + bias [+ addend]) [, its input].
std::shared_ptr<const void> prepareLinearGelu(const PrepareContext &p) {
  const KernelDef &linear = part("Linear");
  return linear.prepare ? linear.prepare(p) : nullptr; // the weight packed as Linear packs it
}

Status LinearGeluKernel(const KernelContext &c) {
  const TensorView &pre = c.outputs.size() > 1 ? c.outputs[1] : c.outputs[0];
  // Linear's kernel is LinearAdd's too: it sums in an addend (inputs[3]) when there is one.
  KernelContext linear{c.attrs, c.inputs, {pre}, c.pool, c.prepared};
  SD_RETURN_IF_ERROR(part("Linear").run(linear));
  KernelContext gelu{c.attrs, {pre}, {c.outputs[0]}, c.pool};
  return part("Gelu").run(gelu);
}

// GemmDGelu(a, b, pre, c) -> GeluGrad(op(a) op(b) [+ c], pre) [, its sum over rows].
std::shared_ptr<const void> prepareGemmDGelu(const PrepareContext &p) {
  const KernelDef &gemm = part("Gemm");
  return gemm.prepare ? gemm.prepare(p) : nullptr;
}

Status GemmDGeluKernel(const KernelContext &c) {
  const TensorView &grad = c.outputs[0];
  std::vector<TensorView> operands{c.inputs[0], c.inputs[1]};
  if (c.hasInput(3)) operands.push_back(c.inputs[3]); // Gemm's C, beta 1 (its default)
  KernelContext gemm{c.attrs, operands, {grad}, c.pool, c.prepared};
  SD_RETURN_IF_ERROR(part("Gemm").run(gemm));
  KernelContext geluGrad{c.attrs, {grad, c.inputs[2]}, {grad}, c.pool};
  SD_RETURN_IF_ERROR(part("GeluGrad").run(geluGrad));
  if (c.outputs.size() < 2) return Status::ok();
  int64_t axis = 0;
  AttrMap rows;
  rows.setInt("keepdims", 0);
  KernelContext sum{rows, {grad, TensorView{&axis, DType::I64, {1}}}, {c.outputs[1]}, c.pool};
  return part("ReduceSum").run(sum);
}

} // namespace

void registerGemmEpilogueKernels() {
  registerCpuKernel("LinearGelu", LinearGeluKernel, TypeSet::floats(), prepareLinearGelu);
  registerCpuKernel("GemmDGelu", GemmDGeluKernel, TypeSet::floats(), prepareGemmDGelu);
}

} // namespace sd::cpu
