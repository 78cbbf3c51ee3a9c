// CPU kernel of SeededDropout(x, rng) {ratio, stream}: training-time dropout
// whose mask comes from the counter-based generator (sd/ops/counter_rng.h)
// keyed by rng = [seed, counter, row offset, rows] and the op site's stream. The op is linear
// in x, so its gradient is the same op applied to dy with the same rng.
#include "cpu_util.h"
#include "sd/ops/counter_rng.h"

namespace sd::cpu {
namespace {

Status SeededDropoutKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &rng = c.inputs[1], &y = c.outputs[0];
  SD_CHECK_ARG(rng.dtype == DType::I64 && (rng.numElements() == 2 || rng.numElements() == 4),
               "SeededDropout: rng must be int64[4] (seed, counter, row offset, rows) or int64[2] (seed, counter)");
  double ratio = c.attrs.getFloat("ratio", 0.0);
  SD_CHECK_ARG(ratio >= 0.0 && ratio < 1.0, "SeededDropout: ratio ", ratio, " is outside [0, 1)");
  const int64_t *state = rng.as<int64_t>();
  uint64_t key = counterRngKey(uint64_t(state[0]), uint64_t(state[1]), uint64_t(c.attrs.getInt("stream", 0)));
  uint32_t threshold = dropoutThreshold(ratio);
  const int64_t offset = dropoutElementOffset(state, rng.numElements(), x.numElements());
  SD_CHECK_ARG(offset >= 0, "SeededDropout: ", x.numElements(), " elements are not ", state[3], " whole rows");
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *src = x.as<T>();
    T *dst = y.as<T>();
    T scale = T(1.0 / (1.0 - ratio));
    parallelFor(c.pool, x.numElements(), 4096, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) dst[i] = dropoutKeeps(key, uint64_t(offset + i), threshold) ? src[i] * scale : T(0);
    });
    return Status::ok();
  });
}

Status SeededRandomKernel(const KernelContext &c) {
  const TensorView &rng = c.inputs[1], &y = c.outputs[0];
  SD_CHECK_ARG(rng.dtype == DType::I64 && (rng.numElements() == 2 || rng.numElements() == 4),
               "SeededRandom: rng must be int64[4] (seed, counter, row offset, rows) or int64[2] (seed, counter)");
  const int64_t *state = rng.as<int64_t>();
  const uint64_t key = counterRngKey(uint64_t(state[0]), uint64_t(state[1]), uint64_t(c.attrs.getInt("stream", 0)));
  const int64_t offset = dropoutElementOffset(state, rng.numElements(), y.numElements());
  SD_CHECK_ARG(offset >= 0, "SeededRandom: ", y.numElements(), " elements are not ", state[3], " whole rows");
  const bool normal = c.attrs.getInt("normal", 0) != 0;
  const float a = float(c.attrs.getFloat("a", 0.0)), b = float(c.attrs.getFloat("b", 1.0));
  return dispatchFloat(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    T *dst = y.as<T>();
    parallelFor(c.pool, y.numElements(), 4096, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const uint64_t at = uint64_t(offset + i);
        dst[i] = T(normal ? a + b * counterNormal(key, at) : a + (b - a) * counterUniform(key, at));
      }
    });
    return Status::ok();
  });
}

} // namespace

void registerDropoutKernels() {
  registerCpuKernel("SeededDropout", SeededDropoutKernel, TypeSet::floats());
  registerCpuKernel("SeededRandom", SeededRandomKernel, TypeSet::floats());
}

} // namespace sd::cpu
