// CUDA kernel of SeededDropout(x, rng) {ratio, stream}: the CPU kernel's mask
// (sd/ops/counter_rng.h, the same functions), so a GPU run draws the bits a
// CPU run draws. rng = [seed, counter, row offset, rows] lives in device
// memory (the trainer and accumulate advance it), so each thread reads it.
#include "cuda_util.cuh"
#include "sd/ops/counter_rng.h"

namespace sd::cuda {
namespace {

template <typename T>
__global__ void dropoutKernel(const T *x, T *y, int64_t n, const int64_t *rng, int64_t rngSize, uint64_t stream,
                              uint32_t threshold, double scale) {
  const uint64_t key = counterRngKey(uint64_t(rng[0]), uint64_t(rng[1]), stream);
  // A tensor that is not whole rows (offset -1; every dropout site is a
  // batch-major activation) cannot be refused mid-step here, as the CPU
  // kernel refuses it: its mask then falls back to the rank-local index.
  const int64_t offset = max(dropoutElementOffset(rng, rngSize, n), int64_t(0));
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = dropoutKeeps(key, uint64_t(offset + i), threshold) ? store<T>(load(x[i]) * Compute<T>(scale)) : store<T>(0.0f);
}

Status SeededDropoutKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &rng = c.inputs[1], &y = c.outputs[0];
  if (rng.dtype != DType::I64 || (rng.numElements() != 2 && rng.numElements() != 4))
    return sdError("SeededDropout: rng must be int64[4] (seed, counter, row offset, rows) or int64[2] (seed, counter)");
  double ratio = c.attrs.getFloat("ratio", 0.0);
  if (!(ratio >= 0.0 && ratio < 1.0)) return sdError("SeededDropout: ratio ", ratio, " is outside [0, 1)");
  int64_t n = x.numElements();
  if (n == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    dropoutKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(
        x.as<T>(), y.as<T>(), n, rng.as<int64_t>(), rng.numElements(), uint64_t(c.attrs.getInt("stream", 0)),
        dropoutThreshold(ratio), 1.0 / (1.0 - ratio)); // rounded to T's compute type, as on the CPU
    return launchStatus("SeededDropout");
  });
}

template <typename T>
__global__ void randomKernel(T *y, int64_t n, const int64_t *rng, int64_t rngSize, uint64_t stream, bool normal,
                             float a, float b) {
  const uint64_t key = counterRngKey(uint64_t(rng[0]), uint64_t(rng[1]), stream);
  const int64_t offset = max(dropoutElementOffset(rng, rngSize, n), int64_t(0)); // as dropoutKernel
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t at = uint64_t(offset + i);
    y[i] = store<T>(normal ? a + b * counterNormal(key, at) : a + (b - a) * counterUniform(key, at));
  }
}

Status SeededRandomKernel(const KernelContext &c) {
  const TensorView &rng = c.inputs[1], &y = c.outputs[0];
  if (rng.dtype != DType::I64 || (rng.numElements() != 2 && rng.numElements() != 4))
    return sdError("SeededRandom: rng must be int64[4] (seed, counter, row offset, rows) or int64[2] (seed, counter)");
  int64_t n = y.numElements();
  if (n == 0) return Status::ok();
  return dispatchFloatStorage(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    randomKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(
        y.as<T>(), n, rng.as<int64_t>(), rng.numElements(), uint64_t(c.attrs.getInt("stream", 0)),
        c.attrs.getInt("normal", 0) != 0, float(c.attrs.getFloat("a", 0.0)), float(c.attrs.getFloat("b", 1.0)));
    return launchStatus("SeededRandom");
  });
}

} // namespace

void registerDropoutKernels() {
  registerKernel("SeededDropout", SeededDropoutKernel, TypeSet::floats() | TypeSet::halves());
  registerKernel("SeededRandom", SeededRandomKernel, TypeSet::floats() | TypeSet::halves());
}

} // namespace sd::cuda
