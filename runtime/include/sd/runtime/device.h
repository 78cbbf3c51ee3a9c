// A device a session runs on: its kernels and its memory. The CPU device hands
// out host memory; a GPU device will hand out device memory, so the session
// only ever moves bytes through these calls and never dereferences them itself.
#pragma once
#include "sd/format/status.h"
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace sd {

class KernelRegistry;

class Device {
public:
  virtual ~Device() = default;
  virtual const std::string &name() const = 0; // "cpu"
  virtual const KernelRegistry &kernels() const = 0;
  // True when the host can read and write device addresses directly (the
  // session then points frozen weights at the mapped plan, with no copy).
  virtual bool hostAddressable() const = 0;

  // 64-byte-aligned memory; null with an error when there is not enough.
  virtual StatusOr<void *> allocate(size_t bytes) = 0;
  virtual void release(void *ptr) = 0;
  virtual Status copyFromHost(void *dst, const void *src, size_t bytes) = 0;
  virtual Status copyToHost(void *dst, const void *src, size_t bytes) = 0;
  virtual Status zero(void *dst, size_t bytes) = 0;
  // Waits until all work queued on the device is done.
  virtual Status synchronize() = 0;
};

// The host CPU, running the CPU kernel registry.
std::shared_ptr<Device> cpuDevice();

// A device by name: "cpu", or "auto" (the best device this build and machine
// have; today the CPU). Anything else is an error listing the devices there are.
StatusOr<std::shared_ptr<Device>> openDevice(std::string_view name);

} // namespace sd
