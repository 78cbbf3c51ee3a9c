// The CUDA device: device memory from cudaMalloc (never managed memory), one
// non-blocking stream per device object (a session opens its own), and copies
// queued on that stream. Kernels enqueue on the same stream, so a copy back to
// the host is ordered after the step that produced the data. This file is the
// CUDA backend plugin's entry (sd/runtime/cuda_backend.h).
#include "sd/comm/world.h"
#include "sd/ops/kernel.h"
#include "sd/runtime/cuda_backend.h"
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <string>
#include <dlfcn.h>
#include <cuda_runtime_api.h>

namespace sd {
namespace {

std::string describeError(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

class CudaDevice final : public Device {
public:
  CudaDevice(int ordinal, cudaStream_t stream, std::string description)
      : ordinal_(ordinal), stream_(stream), description_(std::move(description)) {}
  ~CudaDevice() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  const std::string &name() const override { return name_; }
  std::string describe() const override { return description_; }
  const KernelRegistry &kernels() const override { return cudaKernels(); }
  bool hostAddressable() const override { return false; }
  void *stream() override { return stream_; }

  std::optional<size_t> freeBytes() const override {
    size_t free = 0, total = 0;
    if (cudaSetDevice(ordinal_) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    return free;
  }

  StatusOr<void *> allocate(size_t bytes) override {
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1); // cudaMalloc aligns to 256 bytes
    if (e != cudaSuccess) {
      cudaGetLastError(); // clear the sticky-free error so later calls are not blamed
      std::optional<size_t> free = freeBytes();
      char buf[96] = "";
      if (free) std::snprintf(buf, sizeof buf, "; %.1f MiB free", double(*free) / double(1 << 20));
      return sdError("cannot allocate ", bytes, " bytes on device 'cuda' (", describeError(e), ")", buf);
    }
    return p;
  }
  void release(void *ptr) override {
    if (ptr) cudaFree(ptr);
  }
  // The host buffer may be reused as soon as these return, so they wait for
  // the copy (pageable memory; a session's runs use the staging copies below).
  Status copyFromHost(void *dst, const void *src, size_t bytes) override {
    return copy(dst, src, bytes, cudaMemcpyHostToDevice, true);
  }
  Status copyToHost(void *dst, const void *src, size_t bytes) override {
    return copy(dst, src, bytes, cudaMemcpyDeviceToHost, true);
  }
  Status zero(void *dst, size_t bytes) override {
    if (!bytes) return Status::ok();
    return check(cudaMemsetAsync(dst, 0, bytes, stream_), "memset", false);
  }
  Status copyOnDevice(void *dst, const void *src, size_t bytes) override {
    return dst == src ? Status::ok() : copy(dst, src, bytes, cudaMemcpyDeviceToDevice, false);
  }
  Status synchronize() override { return check(cudaSuccess, "synchronize", true); }

  StatusOr<void *> allocateStaging(size_t bytes) override {
    void *p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return sdError("cannot allocate ", bytes, " bytes of page-locked staging memory (", describeError(e), ")");
    }
    return p;
  }
  void releaseStaging(void *ptr) override {
    if (ptr) cudaFreeHost(ptr);
  }
  // Page-locked memory: the copies are queued on the session's stream and
  // return at once (ordered with the kernels; synchronize() waits).
  Status copyFromStaging(void *dst, const void *src, size_t bytes) override {
    return copy(dst, src, bytes, cudaMemcpyHostToDevice, false);
  }
  Status copyToStaging(void *dst, const void *src, size_t bytes) override {
    return copy(dst, src, bytes, cudaMemcpyDeviceToHost, false);
  }

  StatusOr<std::shared_ptr<void>> fence() override {
    cudaEvent_t event = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDefault); // timed: elapsedMs
    if (e == cudaSuccess && (e = cudaEventRecord(event, stream_)) != cudaSuccess) cudaEventDestroy(event);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return sdError("device 'cuda': cannot record an event (", describeError(e), ")");
    }
    return std::shared_ptr<void>(event, [](void *ev) { cudaEventDestroy(static_cast<cudaEvent_t>(ev)); });
  }
  // An error of any kernel queued before the fence shows here, as at a synchronize().
  Status waitFor(void *fence) override {
    return fence ? check(cudaEventSynchronize(static_cast<cudaEvent_t>(fence)), "wait for a run", false) : Status::ok();
  }

  std::optional<double> elapsedMs(void *from, void *to) const override {
    float ms = 0;
    if (!from || !to || cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    return double(ms);
  }

  StatusOr<std::shared_ptr<void>> capture(const std::function<Status()> &enqueue) override {
    // Thread-local mode: a call that would synchronize or allocate fails the
    // capture instead of silently breaking it.
    cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return sdError("cannot start a CUDA graph capture (", describeError(e), ")");
    }
    Status st = enqueue();
    cudaGraph_t graph = nullptr;
    e = cudaStreamEndCapture(stream_, &graph); // always ends, so the stream is usable again
    if (!st.isOk() || e != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      return st.isOk() ? sdError("CUDA graph capture failed (", describeError(e), ")") : st;
    }
    // SD_CUDA_GRAPH_DOT=PREFIX: each captured graph as PREFIX<n>.dot, to see
    // what a replay runs (the NCCL test looks for the all-reduce in it).
    if (const char *prefix = std::getenv("SD_CUDA_GRAPH_DOT"); prefix && *prefix) {
      static int captured = 0;
      cudaGraphDebugDotPrint(graph, (std::string(prefix) + std::to_string(captured++) + ".dot").c_str(),
                             cudaGraphDebugDotFlagsVerbose);
    }
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return sdError("cannot instantiate the captured CUDA graph (", describeError(e), ")");
    }
    return std::shared_ptr<void>(exec, [](void *g) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g)); });
  }
  Status replay(void *graph) override {
    return check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), stream_), "graph launch", false);
  }

private:
  // A copy queued on the session's stream; with `wait`, done when it returns.
  Status copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, bool wait) {
    if (!bytes) return Status::ok();
    const char *what = kind == cudaMemcpyHostToDevice   ? "copy to device"
                       : kind == cudaMemcpyDeviceToHost ? "copy from device"
                                                        : "device copy";
    return check(cudaMemcpyAsync(dst, src, bytes, kind, stream_), what, wait);
  }
  // A failed call, or (when `wait`) an error of any kernel queued before it,
  // which CUDA reports only at the next synchronization.
  Status check(cudaError_t e, const char *what, bool wait) {
    if (e == cudaSuccess && wait) e = cudaStreamSynchronize(stream_);
    if (e == cudaSuccess) return Status::ok();
    return sdError("device 'cuda': ", what, " failed: ", describeError(e));
  }

  std::string name_ = "cuda";
  int ordinal_;
  cudaStream_t stream_;
  std::string description_;
};

StatusOr<std::shared_ptr<Device>> openCudaDevice() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    // Without a driver at all the runtime says "insufficient driver"; say what is missing instead.
    if (void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) dlclose(driver);
    else return sdError("no usable CUDA GPU (no NVIDIA driver: libcuda.so.1 is not installed)");
    return sdError("no usable CUDA GPU (", describeError(e), ")");
  }
  if (count == 0) return sdError("no usable CUDA GPU (the driver reports none)");
  // One GPU per process: a rank takes the GPU of its rank on this machine
  // (the NCCL plugin picks the same one).
  const int ordinal = detectLaunch().localRank % count;
  cudaDeviceProp prop{};
  if ((e = cudaSetDevice(ordinal)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, ordinal)) != cudaSuccess)
    return sdError("CUDA GPU ", ordinal, " cannot be used (", describeError(e), ")");
  if (prop.major < 8)
    return sdError("CUDA GPU ", ordinal, " (", prop.name, ") has compute capability ", prop.major, ".", prop.minor,
                   "; this build needs 8.0 or newer");
  cudaStream_t stream = nullptr;
  if ((e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess)
    return sdError("cannot create a CUDA stream (", describeError(e), ")");
  char desc[320];
  std::snprintf(desc, sizeof desc, "cuda (GPU %d: %s, %.1f GiB, compute capability %d.%d)", ordinal, prop.name,
                double(prop.totalGlobalMem) / double(1ull << 30), prop.major, prop.minor);
  return std::shared_ptr<Device>(std::make_shared<CudaDevice>(ordinal, stream, desc));
}

} // namespace
} // namespace sd

extern "C" __attribute__((visibility("default"))) const sd::CudaBackend *
sd_cuda_backend(const sd::CudaBackendAbi *caller, char *error, size_t errorBytes) {
  static const sd::CudaBackend backend{&sd::cudaKernels, &sd::openCudaDevice, &sd::cuda::compareGemmsWithCublasLt};
  const sd::CudaBackendAbi mine = sd::cudaBackendAbi();
  if (!caller || std::memcmp(caller, &mine, sizeof mine) != 0) {
    std::snprintf(error, errorBytes, "built by another build of sdc than this program (rebuild both)");
    return nullptr;
  }
  return &backend;
}
