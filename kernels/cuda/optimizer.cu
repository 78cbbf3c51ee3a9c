// CUDA kernels of the optimizer contracts: AdamW and SGD (the shared
// sd::math element updates, in place on parameter, moments and gradient,
// which they zero) and GradScale (global-norm clipping and token
// normalization as one factor). Per-step scalars (step, lr, ...) are read on
// the device, so a captured graph replays with the values of each step.
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include "sd/ops/communicator.h"
#include "sd/ops/math/optimizer.h"
#include <memory>
#include <vector>

namespace sd::cuda {
namespace {

// Operands [first, first + count) as device scalars (step, lr, ...), as the CPU kernels' readScalars.
Status scalarOperands(const KernelContext &c, size_t first, size_t count, DeviceScalar *out, const char *op) {
  for (size_t i = 0; i < count; ++i) {
    StatusOr<DeviceScalar> s = scalarOperand(c, first + i);
    if (!s.isOk()) return s.status().withContext(std::string(op) + ": ");
    out[i] = *s;
  }
  return Status::ok();
}

Status requireF32(const KernelContext &c, size_t tensors, const char *op) {
  for (size_t i = 0; i < tensors; ++i)
    if (c.inputs[i].dtype != DType::F32)
      return sdError(op, " updates f32 tensors only, operand ", i, " is ", dtypeName(c.inputs[i].dtype));
  return Status::ok();
}

// A parameter another rank updates (--shard optimizer): its state lives
// there; here only the gradient is zeroed (with --shard grads not even that).
Status zeroGradientOnly(const KernelContext &c, size_t gradOutput, const char *op) {
  const TensorView &g = c.outputs[gradOutput];
  if (!g.data || g.byteSize() == 0) return Status::ok();
  return cudaMemsetAsync(g.data, 0, g.byteSize(), streamOf(c)) == cudaSuccess ? Status::ok() : launchStatus(op);
}

// fp16's found-Inf flag, operand `i` when present: read on the device, so a
// captured step skips or not with each replay's value. No flag: never skips.
StatusOr<DeviceScalar> skipOperand(const KernelContext &c, size_t i, const char *op) {
  if (c.inputs.size() <= i || !c.inputs[i].data) return DeviceScalar{};
  StatusOr<DeviceScalar> s = scalarOperand(c, i);
  if (!s.isOk()) return s.status().withContext(std::string(op) + " skip: ");
  return s;
}

// A skipped step keeps the state's bits; outputs that are not the inputs'
// buffers (not in place) get copies.
__device__ bool skipping(const DeviceScalar &skip) { return skip.ptr && skip.get() != 0.0; }

struct AdamWHyper {
  double beta1, beta2, eps;
  bool decay;
};

__global__ void adamWKernel(AdamWHyper h, DeviceScalar step, DeviceScalar lr, DeviceScalar wd, DeviceScalar gscale,
                            DeviceScalar skip, const float *pin, const float *gin, const float *min,
                            const float *vin, float *p, float *m, float *v, float *gout, int64_t n) {
  if (skipping(skip)) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
      if (p != pin) p[i] = pin[i];
      if (m != min) m[i] = min[i];
      if (v != vin) v[i] = vin[i];
      gout[i] = 0.0f;
    }
    return;
  }
  __shared__ math::AdamWStep s;
  if (threadIdx.x == 0)
    s = math::adamWStep(step.get(), double(float(lr.get())), h.decay ? double(float(wd.get())) : 0.0, h.beta1,
                        h.beta2, double(float(h.eps)), double(float(gscale.get())));
  __syncthreads();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float pi = pin[i], mi = min[i], vi = vin[i];
    math::adamWElement(s, gin[i], pi, mi, vi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    gout[i] = 0.0f;
  }
}

// param, grad, m, v, step, lr, weight_decay, grad_scale[, skip] -> param, m, v, grad.
// The step counter is checked (>= 1) by the CPU kernel; here a step below 1
// yields non-finite bias corrections, which the trainer's loss check reports.
Status AdamWKernel(const KernelContext &c) {
  if (ownedByAnotherRank(c)) return zeroGradientOnly(c, 3, "AdamW");
  SD_RETURN_IF_ERROR(requireF32(c, 4, "AdamW"));
  DeviceScalar sc[4]; // step, lr, weight_decay, grad_scale
  SD_RETURN_IF_ERROR(scalarOperands(c, 4, 4, sc, "AdamW"));
  StatusOr<DeviceScalar> skip = skipOperand(c, 8, "AdamW");
  if (!skip.isOk()) return skip.status();
  AdamWHyper h{c.attrs.getFloat("beta1", 0.9), c.attrs.getFloat("beta2", 0.999), c.attrs.getFloat("epsilon", 1e-8),
               c.attrs.getInt("decay", 1) != 0};
  int64_t n = c.outputs[0].numElements();
  if (n == 0) return Status::ok();
  adamWKernel<<<blocksFor(n), kThreads, 0, streamOf(c)>>>(
      h, sc[0], sc[1], sc[2], sc[3], *skip, c.inputs[0].as<float>(), c.inputs[1].as<float>(), c.inputs[2].as<float>(),
      c.inputs[3].as<float>(), c.outputs[0].as<float>(), c.outputs[1].as<float>(), c.outputs[2].as<float>(),
      c.outputs[3].as<float>(), n);
  return launchStatus("AdamW");
}

struct SgdHyper {
  float momentum, dampening;
  bool nesterov, decay;
};

__global__ void sgdKernel(SgdHyper h, DeviceScalar step, DeviceScalar lr, DeviceScalar wd, DeviceScalar gscale,
                          DeviceScalar skip, const float *pin, const float *gin, const float *bin, float *p,
                          float *buf, float *gout, int64_t n) {
  if (skipping(skip)) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
      if (p != pin) p[i] = pin[i];
      if (buf != bin) buf[i] = bin[i];
      gout[i] = 0.0f;
    }
    return;
  }
  math::SgdStep s;
  s.first = step.get() <= 1.0;
  s.lr = float(lr.get());
  s.weightDecay = h.decay ? float(wd.get()) : 0.0f;
  s.gradScale = float(gscale.get());
  s.momentum = h.momentum;
  s.dampening = h.dampening;
  s.nesterov = h.nesterov;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float pi = pin[i], bi = bin[i];
    math::sgdElement(s, gin[i], pi, bi);
    p[i] = pi;
    buf[i] = bi;
    gout[i] = 0.0f;
  }
}

// param, grad, momentum_buffer, step, lr, weight_decay, grad_scale[, skip] -> param, buffer, grad.
Status SgdKernel(const KernelContext &c) {
  if (ownedByAnotherRank(c)) return zeroGradientOnly(c, 2, "SGD");
  SD_RETURN_IF_ERROR(requireF32(c, 3, "SGD"));
  DeviceScalar sc[4]; // step, lr, weight_decay, grad_scale
  SD_RETURN_IF_ERROR(scalarOperands(c, 3, 4, sc, "SGD"));
  StatusOr<DeviceScalar> skip = skipOperand(c, 7, "SGD");
  if (!skip.isOk()) return skip.status();
  SgdHyper h{float(c.attrs.getFloat("momentum", 0)), float(c.attrs.getFloat("dampening", 0)),
             c.attrs.getInt("nesterov", 0) != 0, c.attrs.getInt("decay", 1) != 0};
  int64_t n = c.outputs[0].numElements();
  if (n == 0) return Status::ok();
  sgdKernel<<<blocksFor(n), kThreads, 0, streamOf(c)>>>(h, sc[0], sc[1], sc[2], sc[3], *skip, c.inputs[0].as<float>(),
                                                        c.inputs[1].as<float>(), c.inputs[2].as<float>(),
                                                        c.outputs[0].as<float>(), c.outputs[1].as<float>(),
                                                        c.outputs[2].as<float>(), n);
  return launchStatus("SGD");
}

// GradScale's partial sums: a fixed number of blocks per gradient, each
// writing its own slot, so the norm is summed in the same order every run.
struct NormScratch {
  double *partials = nullptr; // then, after them, the sum of squares
  std::vector<unsigned> blocks; // per gradient
  size_t count = 0;             // partial sums
  ~NormScratch() { cudaFree(partials); }
};

constexpr int kNormThreads = 256;

unsigned normBlocks(int64_t n) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kNormThreads * 16 - 1) / (kNormThreads * 16), 1024)));
}

// Allocated when the session is created, never during a (captured) step.
std::shared_ptr<const void> prepareGradScale(const PrepareContext &p) {
  auto s = std::make_shared<NormScratch>();
  size_t total = 0;
  for (size_t t = 2; t < p.kernel.inputs.size(); ++t) {
    s->blocks.push_back(normBlocks(p.kernel.inputs[t].numElements()));
    total += s->blocks.back();
  }
  s->count = total;
  if (cudaMalloc(&s->partials, (total + 1) * sizeof(double)) != cudaSuccess) return nullptr;
  return s;
}

__global__ void sumSquaresKernel(const float *g, int64_t n, double *partials) {
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    s += double(g[i]) * double(g[i]);
  s = blockReduce(s, SumOp(), 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// The sum of squares, in a fixed order: `sum` = the partials' total.
__global__ void sumPartials(const double *partials, int64_t count, double *sum) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = blockReduce(s, SumOp(), 0.0);
  if (threadIdx.x == 0) sum[0] = s;
}

// scale = 1/tokens * min(1, max_norm / (norm + 1e-6)), norm = ||grads|| / tokens.
__global__ void gradScaleFinish(const double *sum, DeviceScalar tokens, DeviceScalar maxNorm, float *scale,
                                float *normOut) {
  double norm = 0;
  scale[0] = float(math::gradScaleFactor(sum[0], tokens.get(), maxNorm.get(), norm));
  normOut[0] = float(norm);
}

// tokens, max_norm, grads... -> scale, norm.
Status GradScaleKernel(const KernelContext &c) {
  auto *scratch = static_cast<const NormScratch *>(c.prepared);
  if (!scratch) return sdError("GradScale: its device scratch could not be allocated");
  DeviceScalar sc[2]; // tokens, max_norm
  SD_RETURN_IF_ERROR(scalarOperands(c, 0, 2, sc, "GradScale"));
  size_t offset = 0;
  for (size_t t = 2; t < c.inputs.size(); ++t) {
    const TensorView &g = c.inputs[t];
    if (g.dtype != DType::F32) return sdError("GradScale takes f32 gradients");
    unsigned blocks = scratch->blocks[t - 2];
    if (!g.data && g.numElements()) { // --shard grads: another rank holds it and adds its part
      SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(scratch->partials + offset, 0, blocks * sizeof(double), streamOf(c)),
                                   "GradScale"));
      offset += blocks;
      continue;
    }
    sumSquaresKernel<<<blocks, kNormThreads, 0, streamOf(c)>>>(g.as<float>(), g.numElements(),
                                                               scratch->partials + offset);
    offset += blocks;
  }
  double *sum = scratch->partials + scratch->count;
  sumPartials<<<1, 1024, 0, streamOf(c)>>>(scratch->partials, int64_t(offset), sum);
  SD_RETURN_IF_ERROR(launchStatus("GradScale"));
  // --shard grads|params: each rank summed the squares of the gradients (or
  // rows) it holds; the norm is the ranks' total, so every rank clips and
  // skips alike (the CPU kernel's allReduce, here on the stream).
  if (c.attrs.getInt("sharded_grads", 0) && c.comm && c.comm->size() > 1) {
    StreamCollectives *sc2 = c.comm->onStreams();
    if (!sc2) return sdError("GradScale over ", c.comm->size(), " ranks on CUDA needs the NCCL backend");
    SD_RETURN_IF_ERROR(sc2->join(c.stream).withContext("GradScale: "));
    SD_RETURN_IF_ERROR(sc2->allReduce(sum, sum, 1, DType::F64, ReduceOp::Sum, c.stream).withContext("GradScale: "));
  }
  gradScaleFinish<<<1, 1, 0, streamOf(c)>>>(sum, sc[0], sc[1], c.outputs[0].as<float>(), c.outputs[1].as<float>());
  return launchStatus("GradScale");
}

} // namespace

void registerOptimizerKernels() {
  registerKernel("AdamW", AdamWKernel, TypeSet{DType::F32});
  registerKernel("SGD", SgdKernel, TypeSet{DType::F32});
  registerKernel("GradScale", GradScaleKernel, TypeSet{DType::F32}, prepareGradScale, 2);
}

} // namespace sd::cuda
