// CUDA kernels of the optimizer contracts: AdamW and SGD (the shared
// sd::math element updates, in place on parameter, moments and gradient,
// which they zero) and GradScale (global-norm clipping and token
// normalization as one factor). Per-step scalars (step, lr, ...) are read on
// the device, so a captured graph replays with the values of each step.
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include "tensor_table.cuh"
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
};

// One tensor of an AdamW step (results may be the operands' buffers: in place).
struct AdamWSlot {
  const float *pin, *gin, *min, *vin;
  float *p, *m, *v, *gout;
  int64_t n;
  int64_t firstBlock; // GroupedAdamW: the first block of the launch that updates it
  int decay;
  bool sameTensors(const AdamWSlot &o) const {
    return pin == o.pin && gin == o.gin && min == o.min && vin == o.vin && p == o.p && m == o.m && v == o.v &&
           gout == o.gout && n == o.n;
  }
};

// The step's constants with and without weight decay, by thread 0 into shared memory.
__device__ void adamWSteps(const AdamWHyper &h, const DeviceScalar &step, const DeviceScalar &lr,
                           const DeviceScalar &wd, const DeviceScalar &gscale, math::AdamWStep *s) {
  if (threadIdx.x == 0) {
    const double lrf = double(float(lr.get())), eps = double(float(h.eps)), scale = double(float(gscale.get()));
    s[0] = math::adamWStep(step.get(), lrf, 0.0, h.beta1, h.beta2, eps, scale);
    s[1] = math::adamWStep(step.get(), lrf, double(float(wd.get())), h.beta1, h.beta2, eps, scale);
  }
  __syncthreads();
}

// Elements begin, begin + stride, ... below end of one tensor: updated, or
// on a skipped step kept (copied when not in place) with the gradient zeroed.
__device__ void adamWElements(const AdamWSlot &x, const math::AdamWStep &s, bool skip, int64_t begin, int64_t end,
                              int64_t stride) {
  for (int64_t i = begin; i < end; i += stride) {
    float pi = x.pin[i], mi = x.min[i], vi = x.vin[i];
    if (!skip) math::adamWElement(s, x.gin[i], pi, mi, vi);
    if (!skip || x.p != x.pin) x.p[i] = pi;
    if (!skip || x.m != x.min) x.m[i] = mi;
    if (!skip || x.v != x.vin) x.v[i] = vi;
    x.gout[i] = 0.0f;
  }
}

__global__ void adamWKernel(AdamWHyper h, DeviceScalar step, DeviceScalar lr, DeviceScalar wd, DeviceScalar gscale,
                            DeviceScalar skip, AdamWSlot x) {
  __shared__ math::AdamWStep s[2];
  adamWSteps(h, step, lr, wd, gscale, s);
  adamWElements(x, s[x.decay], skipping(skip), blockIdx.x * int64_t(blockDim.x) + threadIdx.x, x.n,
                int64_t(gridDim.x) * blockDim.x);
}

// GroupedAdamW: every tensor of the group in one launch. Tensor t gets the
// blocks from its firstBlock on, each updating kGroupChunk elements.
constexpr int64_t kGroupChunk = int64_t(kThreads) * 4;

__global__ void groupedAdamWKernel(AdamWHyper h, DeviceScalar step, DeviceScalar lr, DeviceScalar wd,
                                   DeviceScalar gscale, DeviceScalar skip, const AdamWSlot *slots, int count) {
  __shared__ math::AdamWStep s[2];
  adamWSteps(h, step, lr, wd, gscale, s);
  const AdamWSlot x = slots[blockSlot(slots, count)];
  const int64_t begin = (int64_t(blockIdx.x) - x.firstBlock) * kGroupChunk;
  adamWElements(x, s[x.decay], skipping(skip), begin + threadIdx.x, std::min(x.n, begin + kGroupChunk), blockDim.x);
}

AdamWHyper adamWHyper(const KernelContext &c) {
  return {c.attrs.getFloat("beta1", 0.9), c.attrs.getFloat("beta2", 0.999), c.attrs.getFloat("epsilon", 1e-8)};
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
  int64_t n = c.outputs[0].numElements();
  if (n == 0) return Status::ok();
  AdamWSlot x{c.inputs[0].as<float>(),  c.inputs[1].as<float>(),  c.inputs[2].as<float>(),
              c.inputs[3].as<float>(),  c.outputs[0].as<float>(), c.outputs[1].as<float>(),
              c.outputs[2].as<float>(), c.outputs[3].as<float>(), n,
              0,                        c.attrs.getInt("decay", 1) != 0};
  adamWKernel<<<blocksFor(n), kThreads, 0, streamOf(c)>>>(adamWHyper(c), sc[0], sc[1], sc[2], sc[3], *skip, x);
  return launchStatus("AdamW");
}

// The group's slots from the step's operands and results (which the shape
// rule checked: 4 per tensor, one size each), null when they are not that.
std::vector<AdamWSlot> groupSlots(const KernelContext &c, int64_t &blocks) {
  const size_t first = math::kGroupedAdamWScalars, n = c.inputs.size() > first ? (c.inputs.size() - first) / 4 : 0;
  std::vector<int64_t> decay = c.attrs.getInts("decay");
  std::vector<AdamWSlot> slots;
  blocks = 0;
  if (n == 0 || c.inputs.size() != first + 4 * n || c.outputs.size() != 4 * n || decay.size() != n) return slots;
  for (size_t i = 0; i < n; ++i) {
    const TensorView *in[4] = {&c.inputs[first + i], &c.inputs[first + n + i], &c.inputs[first + 2 * n + i],
                               &c.inputs[first + 3 * n + i]}; // param, grad, m, v
    const TensorView *out[4] = {&c.outputs[i], &c.outputs[n + i], &c.outputs[2 * n + i], &c.outputs[3 * n + i]};
    const int64_t count = in[0]->numElements();
    for (size_t k = 0; k < 4; ++k)
      if (in[k]->dtype != DType::F32 || out[k]->dtype != DType::F32 || in[k]->numElements() != count ||
          out[k]->numElements() != count)
        return {};
    slots.push_back({in[0]->as<float>(), in[1]->as<float>(), in[2]->as<float>(), in[3]->as<float>(),
                     out[0]->as<float>(), out[1]->as<float>(), out[2]->as<float>(), out[3]->as<float>(), count,
                     blocks, decay[i] != 0});
    blocks += (count + kGroupChunk - 1) / kGroupChunk;
  }
  return slots;
}

// The table is laid out once, when the session is prepared.
std::shared_ptr<const void> prepareGroupedAdamW(const PrepareContext &p) {
  return prepareTable<AdamWSlot>(p, groupSlots);
}

// step, lr, weight_decay, grad_scale, skip | none, params..., grads..., exp_avgs..., exp_avg_sqs...
// -> params..., exp_avgs..., exp_avg_sqs..., grads...: one launch for all.
Status GroupedAdamWKernel(const KernelContext &c) {
  StatusOr<const TensorTable<AdamWSlot> *> prepared =
      preparedTable<AdamWSlot>(c, groupSlots, "GroupedAdamW", "its tensors are not f32 groups of four of one size");
  if (!prepared.isOk()) return prepared.status();
  const TensorTable<AdamWSlot> *group = *prepared;
  DeviceScalar sc[4]; // step, lr, weight_decay, grad_scale
  SD_RETURN_IF_ERROR(scalarOperands(c, 0, 4, sc, "GroupedAdamW"));
  StatusOr<DeviceScalar> skip = skipOperand(c, math::kGroupedAdamWScalars - 1, "GroupedAdamW");
  if (!skip.isOk()) return skip.status();
  if (group->blocks == 0) return Status::ok();
  groupedAdamWKernel<<<unsigned(group->blocks), kThreads, 0, streamOf(c)>>>(
      adamWHyper(c), sc[0], sc[1], sc[2], sc[3], *skip, group->device, int(group->slots.size()));
  return launchStatus("GroupedAdamW");
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
// One launch covers every gradient: block b works for the gradient whose
// blocks include it, as the b - firstBlock'th of its `blocks`.
struct NormSlot {
  const float *g; // null: --shard grads, another rank holds it and adds its part
  int64_t n;
  int64_t firstBlock;
  unsigned blocks;
  bool sameTensors(const NormSlot &o) const { return g == o.g && n == o.n; }
};

struct NormScratch {
  double *partials = nullptr; // then, after them, the sum of squares
  TensorTable<NormSlot> table; // its blocks: the partial sums
  ~NormScratch() { cudaFree(partials); }
};

constexpr int kNormThreads = 256;

unsigned normBlocks(int64_t n) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kNormThreads * 16 - 1) / (kNormThreads * 16), 1024)));
}

std::vector<NormSlot> normSlots(const KernelContext &c) {
  std::vector<NormSlot> slots;
  int64_t first = 0;
  for (size_t t = 2; t < c.inputs.size(); ++t) {
    const TensorView &g = c.inputs[t];
    slots.push_back({g.as<float>(), g.numElements(), first, normBlocks(g.numElements())});
    first += slots.back().blocks;
  }
  return slots;
}

// Allocated when the session is created, never during a (captured) step.
std::shared_ptr<const void> prepareGradScale(const PrepareContext &p) {
  auto s = std::make_shared<NormScratch>();
  s->table.slots = normSlots(p.kernel);
  for (const NormSlot &slot : s->table.slots) s->table.blocks += slot.blocks;
  if (cudaMalloc(&s->partials, size_t(s->table.blocks + 1) * sizeof(double)) != cudaSuccess)
    return cudaGetLastError(), nullptr;
  if (!s->table.upload()) return nullptr;
  return s;
}

__global__ void sumSquaresKernel(const NormSlot *slots, int count, double *partials) {
  const NormSlot x = slots[blockSlot(slots, count)];
  double s = 0;
  if (x.g)
    for (int64_t i = (int64_t(blockIdx.x) - x.firstBlock) * blockDim.x + threadIdx.x; i < x.n;
         i += int64_t(x.blocks) * blockDim.x)
      s += double(x.g[i]) * double(x.g[i]);
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
  const std::vector<NormSlot> now = normSlots(c);
  for (size_t t = 2; t < c.inputs.size(); ++t)
    if (c.inputs[t].dtype != DType::F32) return sdError("GradScale takes f32 gradients");
  if (!scratch->table.describes(now))
    return sdError("GradScale: its gradients are not where they were when the session was prepared");
  const int64_t blocks = scratch->table.blocks;
  if (blocks > 0)
    sumSquaresKernel<<<unsigned(blocks), kNormThreads, 0, streamOf(c)>>>(scratch->table.device, int(now.size()),
                                                                        scratch->partials);
  double *sum = scratch->partials + blocks;
  sumPartials<<<1, 1024, 0, streamOf(c)>>>(scratch->partials, blocks, sum);
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
  registerKernel("GroupedAdamW", GroupedAdamWKernel, TypeSet{DType::F32}, prepareGroupedAdamW);
  registerKernel("SGD", SgdKernel, TypeSet{DType::F32});
  registerKernel("GradScale", GradScaleKernel, TypeSet{DType::F32}, prepareGradScale, 2);
}

} // namespace sd::cuda
