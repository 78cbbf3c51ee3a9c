// The Device interface's defaults: a copy on the device through the host,
// and plain host memory for staging. Also compiled into the CUDA plugin,
// whose device inherits them.
#include "sd/runtime/device.h"
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace sd {

Status Device::copyOnDevice(void *dst, const void *src, size_t bytes) {
  if (!bytes || dst == src) return Status::ok();
  std::vector<uint8_t> bounce(bytes);
  SD_RETURN_IF_ERROR(copyToHost(bounce.data(), src, bytes));
  return copyFromHost(dst, bounce.data(), bytes);
}

StatusOr<void *> Device::allocateStaging(size_t bytes) {
  void *p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  if (!p) return sdError("cannot allocate ", bytes, " bytes of staging memory");
  return p;
}

void Device::releaseStaging(void *ptr) { std::free(ptr); }

} // namespace sd
