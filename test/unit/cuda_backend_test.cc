// The CUDA backend plugin (libsdcuda.so) as the runtime loads it: found
// where the build put it, its registry usable without a GPU, a caller of
// another ABI refused, and opening the device without a GPU a clean error.
#include "sd/runtime/cuda_backend.h"
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <string>
#include <unistd.h>

namespace {

TEST(CudaBackend, LoadsAndListsKernelsWithoutAGpu) {
  sd::StatusOr<const sd::CudaBackend *> backend = sd::cudaBackend();
  ASSERT_TRUE(backend.isOk()) << backend.status().message();
  const sd::KernelRegistry &kernels = backend.value()->kernels();
  EXPECT_EQ(kernels.backend(), "cuda");
  EXPECT_NE(kernels.find("MatMul"), nullptr);
  EXPECT_NE(kernels.find("LinearGelu"), nullptr);
  EXPECT_EQ(kernels.find("NoSuchOp"), nullptr);
  // The runtime's own lookup goes through the same plugin.
  EXPECT_EQ(sd::kernelRegistry("cuda"), &kernels);
}

TEST(CudaBackend, RefusesACallerOfAnotherAbi) {
  void *lib = dlopen(SD_CUDA_BACKEND_BUILD_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  using Entry = const sd::CudaBackend *(*)(const sd::CudaBackendAbi *, char *, size_t);
  auto entry = reinterpret_cast<Entry>(dlsym(lib, "sd_cuda_backend"));
  ASSERT_NE(entry, nullptr);
  char error[256] = "";
  sd::CudaBackendAbi abi = sd::cudaBackendAbi();
  EXPECT_NE(entry(&abi, error, sizeof error), nullptr);
  for (int field = 0; field < 2; ++field) {
    sd::CudaBackendAbi other = sd::cudaBackendAbi();
    if (field == 0) other.version += 1;
    else other.sizes[0] += 8; // a KernelDef of another layout
    error[0] = '\0';
    EXPECT_EQ(entry(&other, error, sizeof error), nullptr);
    EXPECT_NE(std::string(error).find("another build"), std::string::npos) << error;
  }
  EXPECT_EQ(entry(nullptr, error, sizeof error), nullptr);
}

TEST(CudaBackend, OpeningTheDeviceWithoutAGpuIsAnError) {
  if (access("/dev/nvidia0", F_OK) == 0) GTEST_SKIP() << "this machine has a GPU";
  sd::StatusOr<std::shared_ptr<sd::Device>> device = sd::openDevice("cuda");
  ASSERT_FALSE(device.isOk());
  EXPECT_NE(device.status().message().find("no usable CUDA GPU"), std::string::npos) << device.status().message();
  // auto falls back to the CPU.
  sd::StatusOr<std::shared_ptr<sd::Device>> any = sd::openDevice("auto");
  ASSERT_TRUE(any.isOk());
  EXPECT_EQ(any.value()->name(), "cpu");
}

} // namespace
