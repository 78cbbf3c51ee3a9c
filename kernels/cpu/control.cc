// CPU kernels of IfSelect and LoopGuard (see shapes/control_shapes.cc).
#include "cpu_util.h"
#include <cstring>

namespace sd::cpu {

static Status copyInto(const TensorView &from, const TensorView &to) {
  if (to.data != from.data) std::memcpy(to.data, from.data, from.byteSize());
  return Status::ok();
}

Status IfSelectKernel(const KernelContext &c) {
  bool cond = *c.inputs[0].as<uint8_t>() != 0;
  return copyInto(c.inputs[cond ? 1 : 2], c.outputs[0]);
}

// The run stops here instead of reading past what the unrolled loop computed.
Status LoopGuardKernel(const KernelContext &c) {
  if (*c.inputs[1].as<uint8_t>()) return sdError(c.attrs.getString("message", "loop ran past --max-trip"));
  return copyInto(c.inputs[0], c.outputs[0]);
}

void registerControlKernels() {
  registerCpuKernel("IfSelect", IfSelectKernel, TypeSet::all(), nullptr, 1);
  registerCpuKernel("LoopGuard", LoopGuardKernel, TypeSet::all());
}

} // namespace sd::cpu
