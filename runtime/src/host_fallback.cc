// Host fallback for steps the session's device has no kernel for (host_fallback.h).
#include "host_fallback.h"
#include "sd/ops/registry.h"
#include <map>

namespace sd {

StatusOr<std::unique_ptr<HostCopies>> stageOnHost(KernelContext &ctx, const std::vector<const void *> &hostConstants) {
  auto copies = std::make_unique<HostCopies>();
  struct Slot {
    size_t offset = 0, bytes = 0;
    bool result = false;
  };
  std::map<void *, Slot> slots; // by device address
  auto claim = [&](TensorView &v, bool result) {
    if (!v.data || !v.byteSize()) return;
    Slot &s = slots[v.data];
    s.bytes = std::max(s.bytes, v.byteSize());
    s.result |= result;
  };
  for (size_t i = 0; i < ctx.inputs.size(); ++i)
    if (!(i < hostConstants.size() && hostConstants[i])) claim(ctx.inputs[i], false);
  for (TensorView &v : ctx.outputs) claim(v, true);
  size_t total = 0;
  for (auto &[address, s] : slots) {
    s.offset = total;
    total += (s.bytes + 63) / 64 * 64;
  }
  if (total) {
    copies->block.reset(static_cast<uint8_t *>(std::aligned_alloc(64, total)));
    if (!copies->block) return sdError("out of host memory for ", total, " bytes of operand copies");
  }
  for (auto &[address, s] : slots) {
    HostCopies::Copy c{address, copies->block.get() + s.offset, s.bytes};
    copies->before.push_back(c);
    if (s.result) copies->after.push_back(c);
  }
  auto repoint = [&](TensorView &v) {
    if (v.data && v.byteSize()) v.data = copies->block.get() + slots.at(v.data).offset;
  };
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    if (i < hostConstants.size() && hostConstants[i]) ctx.inputs[i].data = const_cast<void *>(hostConstants[i]);
    else repoint(ctx.inputs[i]);
  }
  for (TensorView &v : ctx.outputs) repoint(v);
  ctx.stream = nullptr; // a CPU kernel
  return copies;
}

Status runOnHost(Device &dev, const KernelDef &def, const KernelContext &ctx, const HostCopies &copies) {
  for (const HostCopies::Copy &c : copies.before) // each waits for the device's queue
    SD_RETURN_IF_ERROR(dev.copyToHost(c.host, c.device, c.bytes));
  SD_RETURN_IF_ERROR(runKernel(def, ctx));
  for (const HostCopies::Copy &c : copies.after) SD_RETURN_IF_ERROR(dev.copyFromHost(c.device, c.host, c.bytes));
  return Status::ok();
}

} // namespace sd
