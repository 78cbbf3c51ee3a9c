// A device a session runs on: its kernels and its memory. The CPU device hands
// out host memory; a GPU device will hand out device memory, so the session
// only ever moves bytes through these calls and never dereferences them itself.
#pragma once
#include "sd/format/status.h"
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace sd {

class KernelRegistry;

class Device {
public:
  virtual ~Device() = default;
  virtual const std::string &name() const = 0; // "cpu", "cuda"
  // For messages: the name plus what the device is ("cuda (GPU 0: ...)").
  virtual std::string describe() const { return name(); }
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
  // Device memory to device memory, ordered with the device's other work.
  // The default goes through the host; devices override it with a direct copy.
  virtual Status copyOnDevice(void *dst, const void *src, size_t bytes);
  // Waits until all work queued on the device is done.
  virtual Status synchronize() = 0;

  // Staging memory for a session's inputs and outputs: page-locked on a GPU,
  // so copies between it and the device are queued without waiting. The
  // defaults are plain host memory and the waiting copies.
  virtual StatusOr<void *> allocateStaging(size_t bytes);
  virtual void releaseStaging(void *ptr);
  // Queued copies between staging memory and the device: they may return
  // before the copy is done; synchronize() waits for them.
  virtual Status copyFromStaging(void *dst, const void *src, size_t bytes) { return copyFromHost(dst, src, bytes); }
  virtual Status copyToStaging(void *dst, const void *src, size_t bytes) { return copyToHost(dst, src, bytes); }
  // A mark after the work queued so far, and a wait until the device has
  // passed it, so the host can wait for one run while later ones stay queued.
  // Devices whose work is done when queued (the CPU) give null and wait for nothing.
  virtual StatusOr<std::shared_ptr<void>> fence() { return std::shared_ptr<void>(); }
  virtual Status waitFor(void *fence) { return fence ? synchronize() : Status::ok(); }
  // Milliseconds of device time between two passed fences, where the device
  // times them (a GPU); nullopt otherwise.
  virtual std::optional<double> elapsedMs(void *from, void *to) const { return std::nullopt; }
  // The queue kernels enqueue on (KernelContext::stream); null on the CPU.
  virtual void *stream() { return nullptr; }
  // Bytes the device can still allocate, where it knows (a GPU does; the CPU
  // leaves it to the allocator and the memory limit). A session checks its
  // whole footprint against it before allocating anything.
  virtual std::optional<size_t> freeBytes() const { return std::nullopt; }

  // Whole-entry capture (CUDA graphs): records what `enqueue` puts on the
  // queue, without running it, into a graph that replay() runs; an error when
  // the device cannot capture (the CPU) or the capture failed.
  virtual StatusOr<std::shared_ptr<void>> capture(const std::function<Status()> &enqueue) {
    return sdError("device '", name(), "' does not capture graphs");
  }
  virtual Status replay(void *graph) { return sdError("device '", name(), "' does not replay graphs"); }
};

// The host CPU, running the CPU kernel registry.
std::shared_ptr<Device> cpuDevice();

// A device by name: "cpu"; "cuda" (GPU 0; an error naming the reason when this
// build has no CUDA or the machine no usable GPU); "auto" (the GPU when there
// is a usable one, else the CPU). Anything else is an error listing the names.
StatusOr<std::shared_ptr<Device>> openDevice(std::string_view name);

// A backend's kernel registry by name ("cpu", "cuda" in builds with CUDA),
// without opening a device (no GPU needed); null for others.
const KernelRegistry *kernelRegistry(std::string_view backend);

// The CUDA device, or why there is none (no CUDA in this build, no driver, no GPU).
StatusOr<std::shared_ptr<Device>> cudaDevice();

} // namespace sd
