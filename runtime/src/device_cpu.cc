// The CPU device (aligned host memory and memcpy) and the choice of device by name.
#include "sd/runtime/device.h"
#include "sd/runtime/cuda_backend.h"
#include "sd/ops/kernel.h"
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace sd {
namespace {

class CpuDevice final : public Device {
public:
  const std::string &name() const override { return name_; }
  const KernelRegistry &kernels() const override { return cpuKernels(); }
  bool hostAddressable() const override { return true; }

  StatusOr<void *> allocate(size_t bytes) override {
    void *p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) return sdError("cannot allocate ", bytes, " bytes on device 'cpu'");
    return p;
  }
  void release(void *ptr) override { std::free(ptr); }
  Status copyFromHost(void *dst, const void *src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Status copyToHost(void *dst, const void *src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Status zero(void *dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
    return Status::ok();
  }
  Status copyOnDevice(void *dst, const void *src, size_t bytes) override {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
    return Status::ok();
  }
  Status synchronize() override { return Status::ok(); }

private:
  std::string name_ = "cpu";
};

} // namespace

std::shared_ptr<Device> cpuDevice() {
  static std::shared_ptr<Device> cpu = std::make_shared<CpuDevice>();
  return cpu;
}

const KernelRegistry *kernelRegistry(std::string_view backend) {
  if (backend == "cpu") return &cpuKernels();
  if (backend == "cuda") {
    StatusOr<const CudaBackend *> cuda = cudaBackend();
    return cuda.isOk() ? &cuda.value()->kernels() : nullptr;
  }
  return nullptr;
}

StatusOr<std::shared_ptr<Device>> openDevice(std::string_view name) {
  if (name == "cpu") return cpuDevice();
  if (name == "cuda") {
    StatusOr<std::shared_ptr<Device>> gpu = cudaDevice();
    if (!gpu.isOk()) return gpu.status().withContext("device 'cuda': ");
    return gpu;
  }
  if (name == "auto") {
    StatusOr<std::shared_ptr<Device>> gpu = cudaDevice();
    return gpu.isOk() ? gpu : StatusOr<std::shared_ptr<Device>>(cpuDevice());
  }
  return sdError("unknown device '", name, "' (devices: cpu, cuda, auto)");
}

} // namespace sd
