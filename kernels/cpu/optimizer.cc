// CPU kernels of the optimizer contracts: AdamW and SGD updates (in place on
// parameter, moments and gradient, which they zero for the next window) and
// GradScale (token normalization and global-norm clipping as one factor).
// Semantics follow torch.optim.AdamW / SGD and clip_grad_norm_.
#include "cpu_util.h"
#include "sd/ops/communicator.h"
#include "sd/ops/math/optimizer.h"
#include <algorithm>
#include <cmath>
#include <cstring>

namespace sd::cpu {
namespace {

// The single values of operands [first, first + count) (step, lr, ...).
Status readScalars(const KernelContext &c, size_t first, size_t count, double *out) {
  std::vector<double> v;
  for (size_t i = 0; i < count; ++i) {
    if (!readDoubles(c.inputs[first + i], v) || v.size() != 1) return sdError("operand ", first + i, " must be one number");
    out[i] = v[0];
  }
  return Status::ok();
}

Status requireF32(const KernelContext &c, size_t tensors, const char *op) {
  for (size_t i = 0; i < tensors; ++i)
    if (c.inputs[i].dtype != DType::F32) return sdError(op, " updates f32 tensors only, operand ", i, " is ",
                                                        dtypeName(c.inputs[i].dtype));
  return Status::ok();
}

// A parameter another rank updates (--shard optimizer): its optimizer state
// lives there, and here only the gradient is zeroed for the next window.
Status zeroGradientOnly(const KernelContext &c, size_t gradOutput) {
  // With --shard grads the gradient lives on the owner too: nothing here.
  if (c.outputs[gradOutput].data) std::memset(c.outputs[gradOutput].data, 0, c.outputs[gradOutput].byteSize());
  return Status::ok();
}

// fp16's found-Inf flag (the optional operand `skipIndex`) is set: the
// update's state outputs keep their inputs' bits (nothing to write when they
// are the same buffers, as once bufferized) and the gradient is zeroed.
// False when the step updates.
StatusOr<bool> skippedStep(const KernelContext &c, size_t skipIndex, const std::vector<std::pair<size_t, size_t>> &kept,
                           const std::vector<size_t> &gradOutputs) {
  if (c.inputs.size() <= skipIndex || !c.inputs[skipIndex].data) return false;
  std::vector<double> flag;
  if (!readDoubles(c.inputs[skipIndex], flag) || flag.size() != 1)
    return sdError("operand ", skipIndex, " (skip) must be one value");
  if (flag[0] == 0) return false;
  for (auto [in, out] : kept)
    if (c.outputs[out].data != c.inputs[in].data)
      std::memcpy(c.outputs[out].data, c.inputs[in].data, c.outputs[out].byteSize());
  for (size_t g : gradOutputs) std::memset(c.outputs[g].data, 0, c.outputs[g].byteSize());
  return true;
}

// The element loops, built per instruction set (GCC target_clones; this file
// is compiled with -fno-math-errno so sqrt vectorizes, and -ffp-contract=off
// so no build fuses a multiply-add the others round twice). Scalar and vector
// sqrt and division round the same, so every build gives the same bits. The
// baseline x86-64 build ran the demo Llama's AdamW at about 10 cycles per
// parameter, one square root and two divisions at a time.
__attribute__((target_clones("avx512f", "avx2", "default"))) void
adamWRange(const math::AdamWStep &st, const float *pin, const float *gin, const float *min, const float *vin,
           float *p, float *m, float *v, float *gout, int64_t n) {
  // Blocks through local arrays: outputs may alias inputs (updates in place),
  // and with nine pointers GCC gives up proving the loop safe to vectorize.
  constexpr int64_t kBlock = 64;
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t len = n - b < kBlock ? n - b : kBlock;
    alignas(64) float pl[kBlock], gl[kBlock], ml[kBlock], vl[kBlock];
    for (int64_t i = 0; i < len; ++i) pl[i] = pin[b + i], gl[i] = gin[b + i], ml[i] = min[b + i], vl[i] = vin[b + i];
    for (int64_t i = 0; i < len; ++i) math::adamWElement(st, gl[i], pl[i], ml[i], vl[i]);
    for (int64_t i = 0; i < len; ++i) p[b + i] = pl[i], m[b + i] = ml[i], v[b + i] = vl[i], gout[b + i] = 0.0f;
  }
}

// The sum of squares of g[0, n) in double, in 8 interleaved partial sums
// (element i into sum i % 8) added in order at the end: a fixed order, so
// the same bits on every machine and thread count, without one long chain
// of dependent additions.
__attribute__((target_clones("avx512f", "avx2", "default"))) double sumOfSquares(const float *g, int64_t n) {
  double part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += double(g[i + j]) * double(g[i + j]);
  for (int j = 0; i < n; ++i, ++j) part[j] += double(g[i]) * double(g[i]);
  double s = 0;
  for (double x : part) s += x;
  return s;
}

// One tensor of an AdamW step: operands in, results out (the same buffers
// when updated in place), with its own weight-decay flag.
struct AdamWTensor {
  const float *pin, *gin, *min, *vin;
  float *p, *m, *v, *gout;
  int64_t n;
  bool decay;
};

// The AdamW step of `tensors` (the scalars from operands first..first+3:
// step, lr, weight_decay, grad_scale): one parallel loop over all their
// elements, so a group of small tensors is one dispatch, not one each.
Status adamW(const KernelContext &c, size_t first, const std::vector<AdamWTensor> &tensors, const char *op) {
  double s[4] = {}; // step, lr, weight_decay, grad_scale
  SD_RETURN_IF_ERROR(readScalars(c, first, 4, s));
  SD_CHECK_ARG(s[0] >= 1, op, " step counter must be >= 1, got ", s[0]);
  auto stepWith = [&](double wd) {
    return math::adamWStep(s[0], float(s[1]), float(wd), c.attrs.getFloat("beta1", 0.9),
                           c.attrs.getFloat("beta2", 0.999), float(c.attrs.getFloat("epsilon", 1e-8)), float(s[3]));
  };
  const math::AdamWStep decayed = stepWith(s[2]), undecayed = stepWith(0.0);
  std::vector<int64_t> start(tensors.size() + 1, 0); // element offsets of the tensors in one index space
  for (size_t t = 0; t < tensors.size(); ++t) start[t + 1] = start[t] + tensors[t].n;
  parallelFor(c.pool, start.back(), 16384, [&](int64_t b, int64_t e) {
    size_t t = size_t(std::upper_bound(start.begin(), start.end(), b) - start.begin()) - 1;
    for (; b < e; ++t) {
      const AdamWTensor &x = tensors[t];
      int64_t i = b - start[t], len = std::min(e, start[t + 1]) - b;
      adamWRange(x.decay ? decayed : undecayed, x.pin + i, x.gin + i, x.min + i, x.vin + i, x.p + i, x.m + i,
                 x.v + i, x.gout + i, len);
      b += len;
    }
  });
  return Status::ok();
}

// param, grad, m, v, step, lr, weight_decay, grad_scale[, skip] -> param, m, v, grad.
Status AdamWKernel(const KernelContext &c) {
  if (ownedByAnotherRank(c)) return zeroGradientOnly(c, 3);
  SD_RETURN_IF_ERROR(requireF32(c, 4, "AdamW"));
  StatusOr<bool> skipped = skippedStep(c, 8, {{0, 0}, {2, 1}, {3, 2}}, {3});
  if (!skipped.isOk() || *skipped) return skipped.status().withContext("AdamW: ");
  const std::vector<AdamWTensor> one = {{c.inputs[0].as<float>(), c.inputs[1].as<float>(), c.inputs[2].as<float>(),
                                         c.inputs[3].as<float>(), c.outputs[0].as<float>(), c.outputs[1].as<float>(),
                                         c.outputs[2].as<float>(), c.outputs[3].as<float>(),
                                         c.outputs[0].numElements(), c.attrs.getInt("decay", 1) != 0}};
  return adamW(c, 4, one, "AdamW");
}

// step, lr, weight_decay, grad_scale, skip | none, params..., grads..., exp_avgs..., exp_avg_sqs...
// -> params..., exp_avgs..., exp_avg_sqs..., grads... (N of each).
Status GroupedAdamWKernel(const KernelContext &c) {
  const size_t first = math::kGroupedAdamWScalars, n = c.inputs.size() > first ? (c.inputs.size() - first) / 4 : 0;
  std::vector<int64_t> decay = c.attrs.getInts("decay");
  SD_CHECK_ARG(n > 0 && c.inputs.size() == first + 4 * n && c.outputs.size() == 4 * n && decay.size() == n,
               "GroupedAdamW: ", c.inputs.size(), " operands, ", c.outputs.size(), " results and ", decay.size(),
               " decay flags do not describe one group of tensors");
  for (size_t i = first; i < c.inputs.size(); ++i)
    SD_CHECK_ARG(c.inputs[i].dtype == DType::F32, "GroupedAdamW updates f32 tensors only, operand ", i, " is ",
                 dtypeName(c.inputs[i].dtype));
  std::vector<std::pair<size_t, size_t>> kept; // operand -> result pairs a skipped step keeps
  std::vector<size_t> grads;
  std::vector<AdamWTensor> tensors;
  for (size_t i = 0; i < n; ++i) {
    const size_t in[4] = {first + i, first + n + i, first + 2 * n + i, first + 3 * n + i}; // param, grad, m, v
    const size_t out[4] = {i, n + i, 2 * n + i, 3 * n + i};                               // param, m, v, grad
    for (size_t k = 0; k < 4; ++k)
      SD_CHECK_ARG(c.inputs[in[k]].numElements() == c.inputs[in[0]].numElements() &&
                       c.outputs[out[k]].numElements() == c.inputs[in[0]].numElements(),
                   "GroupedAdamW: tensor ", i, "'s operands and results differ in size");
    kept.insert(kept.end(), {{in[0], out[0]}, {in[2], out[1]}, {in[3], out[2]}});
    grads.push_back(out[3]);
    tensors.push_back({c.inputs[in[0]].as<float>(), c.inputs[in[1]].as<float>(), c.inputs[in[2]].as<float>(),
                       c.inputs[in[3]].as<float>(), c.outputs[out[0]].as<float>(), c.outputs[out[1]].as<float>(),
                       c.outputs[out[2]].as<float>(), c.outputs[out[3]].as<float>(), c.inputs[in[0]].numElements(),
                       decay[i] != 0});
  }
  StatusOr<bool> skipped = skippedStep(c, first - 1, kept, grads);
  if (!skipped.isOk() || *skipped) return skipped.status().withContext("GroupedAdamW: ");
  return adamW(c, 0, tensors, "GroupedAdamW");
}

// param, grad, momentum_buffer, step, lr, weight_decay, grad_scale[, skip] -> param, buffer, grad.
Status SgdKernel(const KernelContext &c) {
  if (ownedByAnotherRank(c)) return zeroGradientOnly(c, 2);
  SD_RETURN_IF_ERROR(requireF32(c, 3, "SGD"));
  StatusOr<bool> skipped = skippedStep(c, 7, {{0, 0}, {2, 1}}, {2});
  if (!skipped.isOk() || *skipped) return skipped.status().withContext("SGD: ");
  float *p = c.outputs[0].as<float>(), *buf = c.outputs[1].as<float>(), *gout = c.outputs[2].as<float>();
  const float *pin = c.inputs[0].as<float>(), *gin = c.inputs[1].as<float>(), *bin = c.inputs[2].as<float>();
  double s[4] = {}; // step, lr, weight_decay, grad_scale
  SD_RETURN_IF_ERROR(readScalars(c, 3, 4, s));
  math::SgdStep st;
  st.first = s[0] <= 1.0;
  st.lr = float(s[1]);
  st.weightDecay = c.attrs.getInt("decay", 1) ? float(s[2]) : 0.0f;
  st.gradScale = float(s[3]);
  st.momentum = float(c.attrs.getFloat("momentum", 0));
  st.dampening = float(c.attrs.getFloat("dampening", 0));
  st.nesterov = c.attrs.getInt("nesterov", 0) != 0;
  parallelFor(c.pool, c.outputs[0].numElements(), 16384, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float pi = pin[i], bi = bin[i];
      math::sgdElement(st, gin[i], pi, bi);
      p[i] = pi;
      buf[i] = bi;
      gout[i] = 0.0f;
    }
  });
  return Status::ok();
}

// tokens, max_norm, grads... -> scale, norm. The grads hold sums over the
// window's counted tokens; scale = 1/tokens * min(1, max_norm / (norm + 1e-6))
// where norm is the global L2 norm of grads/tokens (no clipping if max_norm <= 0).
// Fixed-size chunks summed in order keep the norm independent of thread count.
Status GradScaleKernel(const KernelContext &c) {
  double s[2] = {}; // tokens, max_norm
  SD_RETURN_IF_ERROR(readScalars(c, 0, 2, s));
  double tokens = std::max(1.0, s[0]), maxNorm = s[1];
  double sumsq = 0;
  constexpr int64_t kChunk = 1 << 16;
  for (size_t t = 2; t < c.inputs.size(); ++t) {
    const TensorView &g = c.inputs[t];
    if (!g.data && g.numElements()) continue; // --shard grads: another rank holds it and adds its part below
    SD_CHECK_ARG(g.dtype == DType::F32, "GradScale takes f32 gradients");
    const float *pg = g.as<float>();
    int64_t n = g.numElements(), chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> part(size_t(chunks), 0.0);
    parallelFor(c.pool, chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) part[size_t(k)] = sumOfSquares(pg + k * kChunk, std::min(n, (k + 1) * kChunk) - k * kChunk);
    });
    for (double s : part) sumsq += s;
  }
  // --shard grads: each rank summed the squares of the gradients it holds.
  if (c.attrs.getInt("sharded_grads", 0) && c.comm && c.comm->size() > 1)
    SD_RETURN_IF_ERROR(c.comm->allReduce(&sumsq, &sumsq, 1, DType::F64, ReduceOp::Sum).withContext("GradScale: "));
  double norm = 0;
  c.outputs[0].as<float>()[0] = float(math::gradScaleFactor(sumsq, tokens, maxNorm, norm));
  c.outputs[1].as<float>()[0] = float(norm);
  return Status::ok();
}

} // namespace

void registerOptimizerKernels() {
  registerCpuKernel("AdamW", AdamWKernel, TypeSet{DType::F32});
  registerCpuKernel("GroupedAdamW", GroupedAdamWKernel, TypeSet{DType::F32});
  registerCpuKernel("SGD", SgdKernel, TypeSet{DType::F32});
  registerCpuKernel("GradScale", GradScaleKernel, TypeSet{DType::F32}, nullptr, 2);
}

} // namespace sd::cpu
