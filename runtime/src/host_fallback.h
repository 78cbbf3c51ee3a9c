// Steps with no kernel on the session's device (a GPU) run the CPU kernel on
// host copies of their operands, as ONNX Runtime falls back to its CPU
// provider: the device's queue is drained, operands copied to the host, the
// kernel run, results copied back. Slow, and an entry with such a step is
// never captured into a graph, but the whole plan runs.
#pragma once
#include "sd/ops/kernel.h"
#include "sd/runtime/device.h"
#include <cstdlib>
#include <memory>
#include <vector>

namespace sd {

struct HostCopies {
  struct Copy {
    void *device = nullptr, *host = nullptr;
    size_t bytes = 0;
  };
  std::unique_ptr<uint8_t, decltype(&std::free)> block{nullptr, &std::free}; // the copies, each 64-byte aligned
  std::vector<Copy> before;         // device -> host: every operand the kernel may read
  std::vector<Copy> after;          // host -> device: the results
};

// Points `ctx`'s operands at host copies and returns what to copy around each
// run. `hostConstants[i]` is input i's value already in host memory (the
// plan's copy of a frozen weight: read in place, never copied), or null.
// Operands at the same device address share one copy (an in-place update).
// Outputs are copied in too: a kernel may leave part of a result untouched.
StatusOr<std::unique_ptr<HostCopies>> stageOnHost(KernelContext &ctx, const std::vector<const void *> &hostConstants);

// One run of `def` over the staged operands, with the copies either side.
Status runOnHost(Device &dev, const KernelDef &def, const KernelContext &ctx, const HostCopies &copies);

} // namespace sd
