// CUDA steps whose every operand is a constant of the plan, such as
// MelWeightMatrix's five scalars: the CPU kernel computes the result once,
// when the session is created, into device memory, and each run copies it
// into the step's result. The same values as the CPU's, and nothing to
// compute per step. Operands the host cannot read (run-time values) are
// refused when the step runs, naming the op.
#include "cuda_util.cuh"
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace sd::cuda {
namespace {

struct HostComputed {
  void *device = nullptr;
  size_t bytes = 0;
  std::string error;
  ~HostComputed() { cudaFree(device); }
};

std::shared_ptr<const void> computeOnHost(const PrepareContext &p, const char *op) {
  auto s = std::make_shared<HostComputed>();
  const KernelContext &c = p.kernel;
  const KernelDef *cpu = cpuKernels().find(op);
  if (!cpu) {
    s->error = std::string("no CPU kernel computes ") + op;
    return s;
  }
  std::vector<TensorView> inputs = c.inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorView *host;
    if (!hostView(p, i, inputs[i], host)) {
      s->error = std::string(op) + " on CUDA needs constant operands; operand " + std::to_string(i) + " is not";
      return s;
    }
  }
  if (c.outputs.size() != 1) {
    s->error = std::string(op) + " on CUDA: one result expected";
    return s;
  }
  TensorView out = c.outputs[0];
  std::vector<uint8_t> host(out.byteSize());
  out.data = host.data();
  KernelContext hostContext{c.attrs, inputs, {out}, nullptr};
  Status st = runKernel(*cpu, hostContext);
  if (!st.isOk()) {
    s->error = st.message();
    return s;
  }
  s->bytes = host.size();
  if (cudaMalloc(&s->device, std::max<size_t>(1, s->bytes)) != cudaSuccess ||
      cudaMemcpy(s->device, host.data(), s->bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
    cudaGetLastError();
    s->error = std::string(op) + " on CUDA: cannot hold its " + std::to_string(s->bytes) + "-byte result";
  }
  return s;
}

Status copyComputed(const KernelContext &c, const char *op) {
  auto *s = static_cast<const HostComputed *>(c.prepared);
  if (!s) return sdError(op, " was not prepared");
  if (!s->error.empty()) return sdError(s->error);
  if (s->bytes != c.outputs[0].byteSize()) return sdError(op, ": the prepared result has another size");
  if (s->bytes == 0) return Status::ok();
  return cudaCheck(cudaMemcpyAsync(c.outputs[0].data, s->device, s->bytes, cudaMemcpyDeviceToDevice, streamOf(c)), op);
}

std::shared_ptr<const void> prepareMelWeightMatrix(const PrepareContext &p) {
  return computeOnHost(p, "MelWeightMatrix");
}
Status MelWeightMatrixKernel(const KernelContext &c) { return copyComputed(c, "MelWeightMatrix"); }

} // namespace

void registerHostComputedKernels() {
  registerKernel("MelWeightMatrix", MelWeightMatrixKernel, {DType::F32, DType::F64}, prepareMelWeightMatrix, -1);
}

} // namespace sd::cuda
