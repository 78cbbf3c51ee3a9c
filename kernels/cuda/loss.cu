// CUDA kernels for SoftmaxCrossEntropyLoss (log-softmax over axis 1, then
// NLL with class weights, ignore_index and mean/sum/none) and its backward
// for the scalar reductions, and NegativeLogLikelihoodLoss. One block per (sample, position) row, its
// softmax statistics gathered in one pass; the scalar reductions sum per-row
// partials in row order (no atomics).
// A target outside [0, classes) makes the loss NaN (the CPU kernel refuses it
// with an error; a GPU cannot stop mid-step to say so).
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include "sd/ops/math/online_softmax.h"
#include <cmath>
#include <memory>

namespace sd::cuda {

using math::RowStats;

// A row's statistics cross the warp a field at a time (blockReduce merges
// them in its fixed order, so the same bits every run).
template <typename C> struct Shuffle<RowStats<C>> {
  __device__ static RowStats<C> down(RowStats<C> s, int offset) {
    RowStats<C> o;
    o.max = __shfl_down_sync(0xffffffffu, s.max, offset);
    o.sum = __shfl_down_sync(0xffffffffu, s.sum, offset);
    return o;
  }
};

namespace {

struct LossRows {
  int64_t n = 0, cls = 0, inner = 1;
  __device__ int64_t rows() const { return n * inner; }
  __device__ int64_t at(int64_t r, int64_t k) const {
    return inner == 1 ? r * cls + k : ((r / inner) * cls + k) * inner + r % inner;
  }
};

LossRows rowsOf(const TensorView &x) {
  LossRows r;
  r.n = x.dims[0];
  r.cls = x.dims[1];
  r.inner = x.numElements() / std::max<int64_t>(r.n * r.cls, 1);
  return r;
}

// Whether every row is contiguous and can be read (and written) as
// Pack<T, kPack>s: a 32000-wide vocabulary row then streams in 8- or 16-byte
// accesses instead of one element per thread.
template <typename T> bool rowsPack(const LossRows &rs, std::initializer_list<const void *> pointers) {
  return rs.inner == 1 && rs.cls % kPack == 0 && allPackAligned<T>(pointers);
}

// Threads per row: enough for one pack each up to 256 (a 10-class row gets one warp).
unsigned rowThreads(const LossRows &rs) {
  int64_t packs = (rs.cls + kPack - 1) / kPack;
  return unsigned(std::min<int64_t>(256, std::max<int64_t>(32, (packs + 31) / 32 * 32)));
}

struct LossAttrs {
  bool hasIgnore = false;
  int64_t ignore = 0;
};

LossAttrs lossAttrs(const KernelContext &c) { return {c.attrs.has("ignore_index"), c.attrs.getInt("ignore_index", 0)}; }

// Per-row loss and weight, summed in row order by the finishing kernel
// (forward); the number of counted targets (backward).
std::shared_ptr<const void> lossScratch(const TensorView &x) {
  LossRows r = rowsOf(x);
  return deviceScratch(size_t(2 * r.n * r.inner) * sizeof(double));
}

std::shared_ptr<const void> prepareLoss(const PrepareContext &p) { return lossScratch(p.kernel.inputs[0]); }
std::shared_ptr<const void> prepareLossGrad(const PrepareContext &p) { return lossScratch(p.kernel.inputs[1]); }

template <typename I> __device__ inline int64_t targetAt(const I *t, int64_t r) { return int64_t(t[r]); }

// Merges two pieces' statistics (blockReduce's operation).
struct MergeStats {
  template <typename S> __device__ S operator()(S a, S b) const { return a.merged(b); }
};

// Calls f(k, x_k) for each class of row r this thread takes; Packed: the row
// read as Pack<T, kPack>s (rowsPack), so f gets kPack neighbours in turn.
template <bool Packed, typename T, typename F>
__device__ inline void forRowClasses(const T *x, const LossRows &rs, int64_t r, F &&f) {
  if constexpr (Packed) {
    const auto *row = reinterpret_cast<const Pack<T, kPack> *>(x + r * rs.cls);
    for (int64_t p = threadIdx.x; p < rs.cls / kPack; p += blockDim.x) {
      Pack<T, kPack> v = row[p];
#pragma unroll
      for (int j = 0; j < kPack; ++j) f(p * kPack + j, load(v.v[j]));
    }
  } else {
    for (int64_t k = threadIdx.x; k < rs.cls; k += blockDim.x) f(k, load(x[rs.at(r, k)]));
  }
}

template <bool Packed, typename T> __device__ RowStats<Compute<T>> rowStats(const T *x, const LossRows &rs, int64_t r) {
  RowStats<Compute<T>> s;
  forRowClasses<Packed>(x, rs, r, [&](int64_t, Compute<T> v) { s.add(v); });
  return blockReduce(s, MergeStats(), RowStats<Compute<T>>{});
}

// T: the scores' storage type; L: the loss's and log_prob's (f32 for half
// scores with f32_loss, else T). The math is Compute<T>'s either way.
template <bool Packed, typename T, typename L, typename I>
__global__ void sceRows(LossRows rs, LossAttrs la, const T *x, const I *target, const T *weights, L *logp,
                        L *lossNone, double *rowValues) {
  for (int64_t r = blockIdx.x; r < rs.rows(); r += gridDim.x) {
    const Compute<T> shift = rowStats<Packed>(x, rs, r).shift();
    if (logp) // rarely asked for: one class per thread
      for (int64_t k = threadIdx.x; k < rs.cls; k += blockDim.x)
        logp[rs.at(r, k)] = store<L>(Compute<L>(Compute<T>(load(x[rs.at(r, k)]) - shift)));
    if (threadIdx.x != 0) continue;
    int64_t k = targetAt(target, r);
    double l = 0, w = 0;
    if (!(la.hasIgnore && k == la.ignore)) {
      if (k < 0 || k >= rs.cls) l = NAN;
      else {
        w = weights ? double(load(weights[k])) : 1.0;
        l = -w * (double(load(x[rs.at(r, k)])) - shift);
      }
    }
    if (lossNone) lossNone[r] = store<L>(Compute<L>(Compute<T>(l)));
    else {
      rowValues[r] = l;
      rowValues[rs.rows() + r] = w;
    }
  }
}

template <typename T>
__global__ void sceFinish(LossRows rs, bool mean, bool divideByWeights, const double *rowValues, T *loss) {
  double l = 0, w = 0;
  for (int64_t r = threadIdx.x; r < rs.rows(); r += blockDim.x) {
    l += rowValues[r];
    w += rowValues[rs.rows() + r];
  }
  l = blockReduce(l, SumOp(), 0.0);
  w = blockReduce(w, SumOp(), 0.0);
  if (threadIdx.x == 0)
    loss[0] = store<T>(Compute<T>(!mean ? l : divideByWeights ? l / w : l / double(rs.rows())));
}

template <typename F> Status dispatchTarget(DType t, F &&f) {
  if (t == DType::I64) return f(int64_t{});
  if (t == DType::I32) return f(int32_t{});
  return sdError("loss targets must be i32 or i64 on CUDA, got ", dtypeName(t));
}

// logits [n, classes, ...], target, weights? -> loss, log_prob?
Status SceKernel(const KernelContext &c) {
  const DeviceScratch *scratch = scratchOf(c);
  if (!scratch) return sdError("SoftmaxCrossEntropyLoss: its device scratch could not be allocated");
  const TensorView &x = c.inputs[0];
  LossRows rs = rowsOf(x);
  std::string red = c.attrs.getString("reduction", "mean");
  bool none = red == "none";
  if (!none && red != "sum" && red != "mean") return sdError("unknown reduction '", red, "'");
  LossAttrs la = lossAttrs(c);
  bool hasWeights = c.hasInput(2) && c.inputs[2].data;
  int64_t rows = rs.n * rs.inner;
  auto run = [&](auto scoresTag, auto lossTag) {
    using T = decltype(scoresTag);
    using L = decltype(lossTag);
    return dispatchTarget(c.inputs[1].dtype, [&](auto itag) {
      using I = decltype(itag);
      L *logp = c.outputs.size() > 1 && c.outputs[1].data ? c.outputs[1].as<L>() : nullptr;
      if (rows > 0) {
        auto launch = [&](auto kernel) {
          kernel<<<rowBlocks(rows), rowThreads(rs), 0, streamOf(c)>>>(
              rs, la, x.as<T>(), c.inputs[1].as<I>(), hasWeights ? c.inputs[2].as<T>() : nullptr, logp,
              none ? c.outputs[0].as<L>() : nullptr, scratch->as<double>());
        };
        if (rowsPack<T>(rs, {x.data})) launch(sceRows<true, T, L, I>);
        else launch(sceRows<false, T, L, I>);
      }
      if (!none)
        sceFinish<L><<<1, 1024, 0, streamOf(c)>>>(rs, red == "mean", hasWeights || la.hasIgnore, scratch->as<double>(),
                                                   c.outputs[0].as<L>());
      return launchStatus("SoftmaxCrossEntropyLoss");
    });
  };
  // f32_loss (sd-half-elementwise): half scores, an f32 loss.
  if (c.outputs[0].dtype == DType::F32 && x.dtype != DType::F32)
    return dispatchFloatStorage(x.dtype, [&](auto tag) { return run(tag, float{}); });
  return dispatchFloatStorage(x.dtype, [&](auto tag) { return run(tag, tag); });
}

// NegativeLogLikelihoodLoss: x holds log-probabilities already; a thread per
// row writes its loss and weight as sceRows does, sceFinish reduces them.
template <typename T, typename I>
__global__ void nllRows(LossRows rs, LossAttrs la, const T *x, const I *target, const T *weights, T *lossNone,
                        double *rowValues) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rs.rows(); r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = targetAt(target, r);
    double l = 0, w = 0;
    if (!(la.hasIgnore && k == la.ignore)) {
      if (k < 0 || k >= rs.cls) l = NAN;
      else {
        w = weights ? double(load(weights[k])) : 1.0;
        l = -w * double(load(x[rs.at(r, k)]));
      }
    }
    if (lossNone) lossNone[r] = store<T>(Compute<T>(l));
    else {
      rowValues[r] = l;
      rowValues[rs.rows() + r] = w;
    }
  }
}

// log_prob [n, classes, ...], target, weights? -> loss.
Status NllKernel(const KernelContext &c) {
  const DeviceScratch *scratch = scratchOf(c);
  if (!scratch) return sdError("NegativeLogLikelihoodLoss: its device scratch could not be allocated");
  const TensorView &x = c.inputs[0];
  if (x.rank() < 2) return sdError("NegativeLogLikelihoodLoss needs [N, C, ...] input, got rank ", x.rank());
  const LossRows rs = rowsOf(x);
  const std::string red = c.attrs.getString("reduction", "mean");
  const bool none = red == "none";
  if (!none && red != "sum" && red != "mean") return sdError("unknown reduction '", red, "'");
  const LossAttrs la = lossAttrs(c);
  const bool hasWeights = c.hasInput(2) && c.inputs[2].data;
  const int64_t rows = rs.n * rs.inner;
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    return dispatchTarget(c.inputs[1].dtype, [&](auto itag) {
      using I = decltype(itag);
      if (rows > 0)
        nllRows<T, I><<<blocksFor(rows), kThreads, 0, streamOf(c)>>>(
            rs, la, x.as<T>(), c.inputs[1].as<I>(), hasWeights ? c.inputs[2].as<T>() : nullptr,
            none ? c.outputs[0].as<T>() : nullptr, scratch->as<double>());
      if (!none)
        sceFinish<T><<<1, 1024, 0, streamOf(c)>>>(rs, red == "mean", hasWeights || la.hasIgnore, scratch->as<double>(),
                                                   c.outputs[0].as<T>());
      return launchStatus("NegativeLogLikelihoodLoss");
    });
  });
}

template <typename I> __global__ void countTargets(LossRows rs, LossAttrs la, const I *target, double *counted) {
  double n = 0;
  for (int64_t r = threadIdx.x; r < rs.rows(); r += blockDim.x)
    n += la.hasIgnore && targetAt(target, r) == la.ignore ? 0.0 : 1.0;
  n = blockReduce(n, SumOp(), 0.0);
  if (threadIdx.x == 0) counted[0] = n;
}

// dlogits = (softmax(logits) - onehot(target)) * dloss (/ counted for mean); ignored rows 0.
// D: dloss's type (f32 with half scores after sd-half-elementwise, else T).
// Each row is read twice (statistics, then the gradient) and written once.
template <bool Packed, typename T, typename D, typename I>
__global__ void sceGradRows(LossRows rs, LossAttrs la, bool mean, const D *dloss, const T *x, const I *target,
                            const double *counted, T *dx) {
  using C = Compute<T>;
  C dl = C(load(dloss[0]));
  if (mean) dl = counted[0] > 0 ? C(dl / C(counted[0])) : C(0);
  for (int64_t r = blockIdx.x; r < rs.rows(); r += gridDim.x) {
    const int64_t k = targetAt(target, r);
    const bool ignored = la.hasIgnore && k == la.ignore;
    RowStats<C> s;
    if (!ignored) s = rowStats<Packed>(x, rs, r);
    // As the CPU: exp(x - max) * (1 / sum) * dloss, minus dloss at the target.
    const C max = s.max, scale = ignored ? C(0) : k < 0 || k >= rs.cls ? C(NAN) : s.inverseSum() * dl;
    auto grad = [&](int64_t q, C v) {
      return ignored ? C(0) : std::exp(v - max) * scale - (q == k ? dl : C(0));
    };
    if constexpr (Packed) {
      const auto *in = reinterpret_cast<const Pack<T, kPack> *>(x + r * rs.cls);
      auto *out = reinterpret_cast<Pack<T, kPack> *>(dx + r * rs.cls);
      for (int64_t p = threadIdx.x; p < rs.cls / kPack; p += blockDim.x) {
        Pack<T, kPack> v = ignored ? Pack<T, kPack>{} : in[p], g;
#pragma unroll
        for (int j = 0; j < kPack; ++j) g.v[j] = store<T>(grad(p * kPack + j, load(v.v[j])));
        out[p] = g;
      }
    } else {
      for (int64_t q = threadIdx.x; q < rs.cls; q += blockDim.x)
        dx[rs.at(r, q)] = store<T>(grad(q, ignored ? C(0) : load(x[rs.at(r, q)])));
    }
  }
}

// dloss, logits, target -> dlogits (no class weights, as on the CPU).
Status SceGradKernel(const KernelContext &c) {
  const DeviceScratch *scratch = scratchOf(c);
  if (!scratch) return sdError("SoftmaxCrossEntropyLossGrad: its device scratch could not be allocated");
  const TensorView &x = c.inputs[1];
  LossRows rs = rowsOf(x);
  LossAttrs la = lossAttrs(c);
  bool mean = c.attrs.getString("reduction", "mean") == "mean";
  int64_t rows = rs.n * rs.inner;
  if (rows == 0) return Status::ok();
  auto run = [&](auto scoresTag, auto dlossTag) {
    using T = decltype(scoresTag);
    using D = decltype(dlossTag);
    return dispatchTarget(c.inputs[2].dtype, [&](auto itag) {
      using I = decltype(itag);
      countTargets<I><<<1, 1024, 0, streamOf(c)>>>(rs, la, c.inputs[2].as<I>(), scratch->as<double>());
      auto launch = [&](auto kernel) {
        kernel<<<rowBlocks(rows), rowThreads(rs), 0, streamOf(c)>>>(rs, la, mean, c.inputs[0].as<D>(), x.as<T>(),
                                                                    c.inputs[2].as<I>(), scratch->as<double>(),
                                                                    c.outputs[0].as<T>());
      };
      if (rowsPack<T>(rs, {x.data, c.outputs[0].data})) launch(sceGradRows<true, T, D, I>);
      else launch(sceGradRows<false, T, D, I>);
      return launchStatus("SoftmaxCrossEntropyLossGrad");
    });
  };
  // An f32 dloss with half scores (sd-half-elementwise).
  if (c.inputs[0].dtype == DType::F32 && x.dtype != DType::F32)
    return dispatchFloatStorage(x.dtype, [&](auto tag) { return run(tag, float{}); });
  return dispatchFloatStorage(x.dtype, [&](auto tag) { return run(tag, tag); });
}

} // namespace

void registerLossKernels() {
  registerKernel("SoftmaxCrossEntropyLoss", SceKernel, floatStorage(), prepareLoss);
  registerKernel("NegativeLogLikelihoodLoss", NllKernel, floatStorage(), prepareLoss);
  registerKernel("SoftmaxCrossEntropyLossGrad", SceGradKernel, floatStorage(), prepareLossGrad, 1);
}

} // namespace sd::cuda
