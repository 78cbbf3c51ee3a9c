// CUDA kernels of CachedAttention (see SDOps.td and
// kernels/cpu/cached_attention.cc): one thread per element writes this
// step's keys and values into their cache slots, then one block per
// (row, head, token) query scores slots 0..position in shared memory, takes
// the softmax with block reductions and sums the values. Reductions are
// fixed trees (block_reduce.cuh), so a CUDA-graph replay gives the same bits.
// The host cannot look at device positions without a sync: a position
// outside the cache writes nothing and gives a NaN output row instead.
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include <cmath>

namespace sd::cuda {
namespace {

struct CacheGeometry {
  int64_t batch, heads, kvHeads, steps, d, dv, len;
};

__global__ void writeCacheKernel(const float *k, const float *v, const int64_t *pos, float *kc, float *vc,
                                 CacheGeometry g) {
  const int64_t width = g.d + g.dv, n = g.batch * g.kvHeads * g.steps * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i % width, row = i / width; // row = (b * kvHeads + h) * steps + t
    const int64_t t = row % g.steps, bh = row / g.steps, b = bh / g.kvHeads;
    const int64_t slot = pos[b * g.steps + t];
    if (slot < 0 || slot >= g.len) continue;
    if (e < g.d) kc[(bh * g.len + slot) * g.d + e] = k[row * g.d + e];
    else vc[(bh * g.len + slot) * g.dv + (e - g.d)] = v[row * g.dv + (e - g.d)];
  }
}

__global__ void attendKernel(const float *q, const float *kc, const float *vc, const int64_t *pos, float *y,
                             CacheGeometry g, float scale) {
  extern __shared__ float scores[];
  const int64_t i = blockIdx.x; // (b * heads + h) * steps + t
  const int64_t t = i % g.steps, h = (i / g.steps) % g.heads, b = i / (g.steps * g.heads);
  const int64_t last = pos[b * g.steps + t], bh = b * g.kvHeads + h / (g.heads / g.kvHeads);
  float *yi = y + i * g.dv;
  if (last < 0 || last >= g.len) {
    for (int64_t e = threadIdx.x; e < g.dv; e += blockDim.x) yi[e] = NAN;
    return;
  }
  const float *qi = q + i * g.d, *keys = kc + bh * g.len * g.d, *values = vc + bh * g.len * g.dv;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= last; j += blockDim.x) {
    float s = 0;
    for (int64_t e = 0; e < g.d; ++e) s += qi[e] * keys[j * g.d + e];
    scores[j] = s * scale;
    mx = fmaxf(mx, scores[j]);
  }
  mx = blockReduce(mx, MaxOp{}, -INFINITY);
  float sum = 0;
  for (int64_t j = threadIdx.x; j <= last; j += blockDim.x) sum += scores[j] = expf(scores[j] - mx);
  sum = blockReduce(sum, SumOp{}, 0.0f);
  __syncthreads();
  for (int64_t e = threadIdx.x; e < g.dv; e += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j <= last; ++j) acc += scores[j] * values[j * g.dv + e];
    yi[e] = acc / sum;
  }
}

// Scores live in shared memory: 48 KiB without an opt-in.
constexpr int64_t kMaxCachedPositions = 12288;

Status CachedAttentionKernel(const KernelContext &c) {
  const TensorView &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2], &kcIn = c.inputs[3], &vcIn = c.inputs[4];
  const TensorView &kc = c.outputs[1], &vc = c.outputs[2];
  CacheGeometry g{q.dims[0], q.dims[1], k.dims[1], q.dims[2], q.dims[3], v.dims[3], kc.dims[2]};
  if (g.len > kMaxCachedPositions)
    return sdError("CachedAttention on CUDA holds at most ", kMaxCachedPositions, " cached positions, the plan has ",
                   g.len);
  cudaStream_t stream = streamOf(c);
  if (kc.data != kcIn.data)
    cudaMemcpyAsync(kc.data, kcIn.data, size_t(kc.numElements()) * sizeof(float), cudaMemcpyDeviceToDevice, stream);
  if (vc.data != vcIn.data)
    cudaMemcpyAsync(vc.data, vcIn.data, size_t(vc.numElements()) * sizeof(float), cudaMemcpyDeviceToDevice, stream);
  const int64_t *pos = c.inputs[5].as<int64_t>();
  const int64_t writes = g.batch * g.kvHeads * g.steps * (g.d + g.dv);
  if (writes) writeCacheKernel<<<blocksFor(writes), kThreads, 0, stream>>>(k.as<float>(), v.as<float>(), pos,
                                                                            kc.as<float>(), vc.as<float>(), g);
  const int64_t queries = g.batch * g.heads * g.steps;
  const float scale = float(c.attrs.getFloat("scale", 1.0 / std::sqrt(double(g.d))));
  if (queries)
    attendKernel<<<unsigned(queries), 128, size_t(g.len) * sizeof(float), stream>>>(
        q.as<float>(), kc.as<float>(), vc.as<float>(), pos, c.outputs[0].as<float>(), g, scale);
  return launchStatus("CachedAttention");
}

} // namespace

void registerCachedAttentionKernels() { registerKernel("CachedAttention", CachedAttentionKernel, {DType::F32}); }

} // namespace sd::cuda
