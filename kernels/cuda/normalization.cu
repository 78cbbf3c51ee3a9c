// CUDA kernels for LayerNormalization and RMSNormalization and their backward,
// BatchNormalization (inference) and InstanceNormalization. Row statistics are summed in f64 as the
// CPU kernels sum them (rows up to 1024 wide: each lane's part in f32 first,
// see CachedWarp); the backward's scale and bias gradients
// are column sums over fixed chunks of rows, added in chunk order, so they do
// not depend on scheduling (no atomics).
#include "block_reduce.cuh"
#include "cuda_util.cuh"
#include "sd/ops/index_geometry.h"
#include <cmath>
#include <memory>
#include <type_traits>

namespace sd::cuda {
namespace {

struct RowSplit {
  int64_t outer = 1, n = 1;
};

// The CPU kernels' rows (index_geometry.h).
RowSplit splitRows(const TensorView &x, const AttrMap &attrs) {
  NormRows r = normRows(x.dims, attrs);
  RowSplit s;
  s.outer = r.outer;
  s.n = r.n;
  return s;
}

constexpr int kRowThreads = 256;
// Rows up to this wide are normalized by one warp each: no block-wide
// barrier between a row's sums, and 8 rows per block (a block per 768-wide
// row left the GPU waiting on its four barriers).
constexpr int64_t kWarpRowMax = 4096;

// The threads that normalize one row: a warp or the whole block. Sums are
// fixed shuffle trees (the xor butterfly gives every lane the same bits).
// Every pass over the row reads it again (from L1 after the first) and the
// math is f64, as on the CPU.
template <bool Warp> struct RowTeam {
  using Math = double;
  __device__ static int rank() { return Warp ? int(threadIdx.x & 31) : int(threadIdx.x); }
  __device__ static int size() { return Warp ? 32 : int(blockDim.x); }
  __device__ static int64_t first() {
    return Warp ? blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5) : int64_t(blockIdx.x);
  }
  __device__ static int64_t stride() { return Warp ? int64_t(gridDim.x) * (blockDim.x >> 5) : int64_t(gridDim.x); }
  __device__ static double sum(double v) {
    if constexpr (Warp) {
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      return v;
    } else {
      return blockReduce(v, SumOp(), 0.0);
    }
  }
  // f(slot, j) for the team's elements j of an n-wide row (slot: see CachedWarp).
  template <typename F> __device__ static void each(int64_t n, F &&f) {
    for (int64_t j = rank(); j < n; j += size()) f(0, j);
  }
  // A row's values, at(j) for element j, read where they are used.
  template <typename F> struct ReadThrough {
    F at;
    __device__ double operator()(int, int64_t j) const { return at(j); }
  };
  template <typename F> __device__ static ReadThrough<F> values(int64_t, F at) { return {at}; }
};

// Rows up to kCachedRowMax wide (GPT-2's 768, Llama's 1024) of f32 or half
// values: a warp per row holds the row in registers, element lane + 32 k in
// slot k, so the row is read from memory once with all its loads in flight
// together, and the element math runs in f32 (the lanes' partial sums are
// added in f64). The uncached passes issued a few loads at a time, three or
// four passes a row, with every element converted to f64 and back (on Hopper
// at a quarter of the f32 rate): GPT-2-small's LayerNormalizationGrad took
// 116 us an H200 step where its bytes take about 25 (session 54's profile).
constexpr int kCachedSlots = 32;
constexpr int64_t kCachedRowMax = 32 * kCachedSlots;
struct CachedWarp : RowTeam<true> {
  using Math = float;
  template <typename F> __device__ static void each(int64_t n, F &&f) {
    const int lane = rank();
#pragma unroll
    for (int k = 0; k < kCachedSlots; ++k)
      if (lane + 32 * int64_t(k) < n) f(k, lane + 32 * int64_t(k));
  }
  struct Held {
    float v[kCachedSlots];
    __device__ float operator()(int k, int64_t) const { return v[k]; }
  };
  template <typename F> __device__ static Held values(int64_t n, F at) {
    Held h;
#pragma unroll
    for (int k = 0; k < kCachedSlots; ++k) h.v[k] = 0.f;
    each(n, [&](int k, int64_t j) { h.v[k] = float(at(j)); });
    return h;
  }
};

// Calls launch(team, blocks): a warp per row holding it in registers where
// T's rows are narrow enough, a warp per row reading it through wider,
// else a block per row.
template <typename T, typename F> void launchRows(const RowSplit &rs, F &&launch) {
  constexpr int64_t rowsPerBlock = kRowThreads / 32;
  const unsigned warpBlocks = rowBlocks((rs.outer + rowsPerBlock - 1) / rowsPerBlock);
  if constexpr (!std::is_same_v<T, double>) // (f64 values would lose bits in f32 registers)
    if (rs.n <= kCachedRowMax) return launch(CachedWarp{}, warpBlocks);
  if (rs.n <= kWarpRowMax) launch(RowTeam<true>{}, warpBlocks);
  else launch(RowTeam<false>{}, rowBlocks(rs.outer));
}

// The row's mean and 1/sqrt(var + eps), two passes as on the CPU; every
// thread gets both. xv(slot, j): element j (Team::values).
template <typename Team, typename V>
__device__ void rowStats(const V &xv, int64_t n, double eps, double &mean, double &rstd) {
  using M = typename Team::Math;
  M s = 0;
  Team::each(n, [&](int k, int64_t j) { s += M(xv(k, j)); });
  mean = Team::sum(double(s)) / double(n);
  const M m = M(mean);
  M v = 0;
  Team::each(n, [&](int k, int64_t j) {
    const M d = M(xv(k, j)) - m;
    v += d * d;
  });
  rstd = 1.0 / std::sqrt(Team::sum(double(v)) / double(n) + eps);
}

// A row's x values as Team reads them.
template <typename Team, typename T> __device__ auto rowValues(const T *x, int64_t n) {
  return Team::values(n, [x](int64_t j) { return double(load(x[j])); });
}

// The f64 math's result as T's kernel computes it (f32 for f32 and halves),
// then stored as Y: for an out_type half Y of an f32 T, the f32 result
// rounded as a Cast after the step would round it.
template <typename Y, typename T> __device__ inline Y storeAs(double v) { return store<Y>(Compute<Y>(Compute<T>(v))); }

// The forward's mean or rstd output, of any float type (chosen per row, not
// compiled per type: each row writes two values).
struct StatOut {
  void *data = nullptr;
  DType type = DType::F32;
  __device__ void write(int64_t r, double v) const {
    if (!data) return;
    switch (type) {
    case DType::F64: static_cast<double *>(data)[r] = v; break;
    case DType::F16: static_cast<__half *>(data)[r] = store<__half>(Compute<__half>(v)); break;
    case DType::BF16: static_cast<__nv_bfloat16 *>(data)[r] = store<__nv_bfloat16>(Compute<__nv_bfloat16>(v)); break;
    default: static_cast<float *>(data)[r] = store<float>(Compute<float>(v));
    }
  }
};

Status statOutOf(const KernelContext &c, size_t index, StatOut &out) {
  if (c.outputs.size() <= index || !c.outputs[index].data) return Status::ok();
  out.data = c.outputs[index].data;
  out.type = c.outputs[index].dtype;
  return dispatchFloatStorage(out.type, [](auto) { return Status::ok(); });
}

template <typename Team, typename T, typename Y>
__global__ void layerNormKernel(RowSplit rs, double eps, const T *px, const T *g, const T *b, Y *py, StatOut meanOut,
                                StatOut rstdOut) {
  for (int64_t r = Team::first(); r < rs.outer; r += Team::stride()) {
    using M = typename Team::Math;
    const auto xv = rowValues<Team>(px + r * rs.n, rs.n);
    Y *y = py + r * rs.n;
    double mean, rstd;
    rowStats<Team>(xv, rs.n, eps, mean, rstd);
    const M m = M(mean), rs_ = M(rstd);
    Team::each(rs.n, [&](int k, int64_t j) {
      y[j] = storeAs<Y, T>((M(xv(k, j)) - m) * rs_ * M(load(g[j])) + (b ? M(load(b[j])) : M(0)));
    });
    if (Team::rank() == 0) {
      meanOut.write(r, mean);
      rstdOut.write(r, rstd);
    }
  }
}

Status LayerNormKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &scale = c.inputs[1];
  RowSplit rs = splitRows(x, c.attrs);
  bool hasBias = c.hasInput(2) && c.inputs[2].data;
  if (scale.numElements() != rs.n || (hasBias && c.inputs[2].numElements() != rs.n))
    return sdError("LayerNormalization on CUDA needs scale and bias covering the normalized axes");
  if (rs.outer * rs.n == 0) return Status::ok();
  StatOut mean, rstd;
  SD_RETURN_IF_ERROR(statOutOf(c, 1, mean));
  SD_RETURN_IF_ERROR(statOutOf(c, 2, rstd));
  double eps = c.attrs.getFloat("epsilon", 1e-5);
  return dispatchFloatPair(x.dtype, c.outputs[0].dtype, "LayerNormalization", [&](auto tag, auto ytag) {
    using T = decltype(tag);
    using Y = decltype(ytag);
    launchRows<T>(rs, [&](auto team, unsigned blocks) {
      layerNormKernel<decltype(team), T, Y><<<blocks, kRowThreads, 0, streamOf(c)>>>(
          rs, eps, x.as<T>(), scale.as<T>(), hasBias ? c.inputs[2].as<T>() : nullptr, c.outputs[0].as<Y>(), mean,
          rstd);
    });
    return launchStatus("LayerNormalization");
  });
}

// Rows per column partial of the scale and bias gradients: 64 gives 128
// chunks of a 8192-row step, enough threads to fill the GPU.
constexpr int64_t kChunkRows = 64;

// Per-row statistics and per-chunk column partials, allocated when the session is created.
struct LayerNormScratch {
  double *stats = nullptr;    // mean, rstd per row
  double *partials = nullptr; // [chunks][2][n]: dscale, dbias
  ~LayerNormScratch() {
    cudaFree(stats);
    cudaFree(partials);
  }
};

std::shared_ptr<const void> prepareLayerNormGrad(const PrepareContext &p) {
  RowSplit rs = splitRows(p.kernel.inputs[1], p.kernel.attrs);
  int64_t chunks = (rs.outer + kChunkRows - 1) / kChunkRows;
  auto s = std::make_shared<LayerNormScratch>();
  if (cudaMalloc(&s->stats, size_t(std::max<int64_t>(1, 2 * rs.outer)) * sizeof(double)) != cudaSuccess ||
      cudaMalloc(&s->partials, size_t(std::max<int64_t>(1, 2 * chunks * rs.n)) * sizeof(double)) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return s;
}

// dx rounded to its type, then added to the accumulate operand (when there
// is one: sd-norm-grad-sum) as the Add kernel it replaces adds: one rounded
// f32 or f64 addition. The host refuses an accumulate operand of a half type.
template <typename T> __device__ T plusAccumulate(const T *acc, int64_t k, T dx) {
  if constexpr (std::is_same_v<T, float>) return acc ? __fadd_rn(acc[k], dx) : dx;
  else if constexpr (std::is_same_v<T, double>) return acc ? __dadd_rn(acc[k], dx) : dx;
  else return dx;
}

// The narrowed copy of dx (narrow_type, sd-norm-grad-sum; f32 x only),
// rounded as the Cast kernel it replaces rounds.
struct NarrowedDx {
  void *data = nullptr;
  bool bf16 = true;
  template <typename T> __device__ void write(int64_t k, T dx) const {
    if constexpr (std::is_same_v<T, float>) {
      if (!data) return;
      if (bf16) static_cast<__nv_bfloat16 *>(data)[k] = store<__nv_bfloat16>(dx);
      else static_cast<__half *>(data)[k] = store<__half>(dx);
    }
  }
};

Status narrowedDxOf(const KernelContext &c, size_t index, const char *op, NarrowedDx &out) {
  if (c.outputs.size() <= index || !c.outputs[index].data) return Status::ok();
  const DType t = c.outputs[index].dtype;
  if (c.inputs[1].dtype != DType::F32 || (t != DType::BF16 && t != DType::F16))
    return sdError(op, ": a narrowed dx is bf16 or f16 of an f32 x, not ", dtypeName(t), " of ",
                   dtypeName(c.inputs[1].dtype));
  out.data = c.outputs[index].data;
  out.bf16 = t == DType::BF16;
  return Status::ok();
}

// dy as the kernels read it: the grad operand, or with further summands
// (operands 4.., sd-norm-grad-sum) their sum, added left to right as the
// Adds it replaces added: one rounded f32 addition of the widened values
// each (f64 for f64).
template <typename D> struct DyTerms {
  const D *term[kMaxNormGradTerms] = {};
  int count = 1;
  __device__ double operator()(int64_t k) const {
    Compute<D> sum = load(term[0][k]);
    for (int i = 1; i < count; ++i) {
      if constexpr (std::is_same_v<Compute<D>, double>) sum = __dadd_rn(sum, load(term[i][k]));
      else sum = __fadd_rn(sum, load(term[i][k]));
    }
    return double(sum);
  }
};

template <typename D> DyTerms<D> dyTermsOf(const KernelContext &c) {
  DyTerms<D> t;
  t.term[0] = c.inputs[0].as<D>();
  for (size_t i = 4; i < c.inputs.size() && i < 3 + kMaxNormGradTerms; ++i) t.term[t.count++] = c.inputs[i].as<D>();
  return t;
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * scale.
// D: dy's type (T, or a half with an f32 T).
template <typename Team, typename T, typename D>
__global__ void layerNormGradRows(RowSplit rs, double eps, DyTerms<D> dy, const T *px, const T *scale, const T *acc,
                                  T *pdx, NarrowedDx narrow, double *stats) {
  using M = typename Team::Math;
  for (int64_t r = Team::first(); r < rs.outer; r += Team::stride()) {
    const int64_t row = r * rs.n;
    const auto xv = rowValues<Team>(px + row, rs.n);
    const auto dv = Team::values(rs.n, [&](int64_t j) { return dy(row + j); });
    double mean, rstd;
    rowStats<Team>(xv, rs.n, eps, mean, rstd);
    const M m = M(mean), rs_ = M(rstd);
    M mg = 0, mgx = 0;
    Team::each(rs.n, [&](int k, int64_t j) {
      const M gj = M(dv(k, j)) * M(load(scale[j]));
      mg += gj;
      mgx += gj * (M(xv(k, j)) - m) * rs_;
    });
    const M mgMean = M(Team::sum(double(mg)) / double(rs.n)), mgxMean = M(Team::sum(double(mgx)) / double(rs.n));
    Team::each(rs.n, [&](int k, int64_t j) {
      const M xhat = (M(xv(k, j)) - m) * rs_;
      const T dx = store<T>(Compute<T>(rs_ * (M(dv(k, j)) * M(load(scale[j])) - mgMean - xhat * mgxMean)));
      const T sum = plusAccumulate(acc, row + j, dx);
      pdx[row + j] = sum;
      narrow.write(row + j, sum);
    });
    if (Team::rank() == 0) {
      stats[2 * r] = mean;
      stats[2 * r + 1] = rstd;
    }
  }
}

// One thread per (chunk, column): sums dy * xhat and dy over the chunk's rows in order.
template <typename T, typename D>
__global__ void layerNormGradColumns(RowSplit rs, DyTerms<D> dyAt, const T *px, const double *stats, double *partials) {
  int64_t chunks = (rs.outer + kChunkRows - 1) / kChunkRows;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < chunks * rs.n;
       t += int64_t(gridDim.x) * blockDim.x) {
    int64_t chunk = t / rs.n, j = t % rs.n;
    double ds = 0, db = 0;
    for (int64_t r = chunk * kChunkRows; r < rs.outer && r < (chunk + 1) * kChunkRows; ++r) {
      double dy = dyAt(r * rs.n + j);
      ds += dy * (double(load(px[r * rs.n + j])) - stats[2 * r]) * stats[2 * r + 1];
      db += dy;
    }
    partials[(chunk * 2) * rs.n + j] = ds;
    partials[(chunk * 2 + 1) * rs.n + j] = db;
  }
}

template <typename T>
__global__ void layerNormGradFinish(RowSplit rs, const double *partials, T *dscale, T *dbias) {
  int64_t chunks = (rs.outer + kChunkRows - 1) / kChunkRows;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < rs.n; j += int64_t(gridDim.x) * blockDim.x) {
    double s = 0, b = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      s += partials[(k * 2) * rs.n + j];
      b += partials[(k * 2 + 1) * rs.n + j];
    }
    if (dscale) dscale[j] = store<T>(Compute<T>(s));
    if (dbias) dbias[j] = store<T>(Compute<T>(b));
  }
}

// dy, x, scale[, accumulate[, dy summands]] -> dx (+ accumulate), dscale, dbias[, narrowed dx].
Status LayerNormGradKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &x = c.inputs[1], &scale = c.inputs[2];
  auto *scratch = static_cast<const LayerNormScratch *>(c.prepared);
  if (!scratch) return sdError("LayerNormalizationGrad: its device scratch could not be allocated");
  RowSplit rs = splitRows(x, c.attrs);
  if (scale.numElements() != rs.n)
    return sdError("LayerNormalizationGrad needs a scale covering the normalized axes");
  SD_RETURN_IF_ERROR(checkNormGradSums(c.inputs, "LayerNormalizationGrad"));
  NarrowedDx narrow;
  SD_RETURN_IF_ERROR(narrowedDxOf(c, 3, "LayerNormalizationGrad", narrow));
  double eps = c.attrs.getFloat("epsilon", 1e-5);
  int64_t chunks = (rs.outer + kChunkRows - 1) / kChunkRows;
  return dispatchFloatPair(x.dtype, dy.dtype, "LayerNormalizationGrad", [&](auto tag, auto dtag) {
    using T = decltype(tag);
    using D = decltype(dtag);
    // Neither written (param_grads = 0): the column pass over dy and x is skipped.
    T *dscale = writesNormParamGrad(c.attrs, c.outputs, 1) ? c.outputs[1].as<T>() : nullptr;
    T *dbias = writesNormParamGrad(c.attrs, c.outputs, 2) ? c.outputs[2].as<T>() : nullptr;
    if (rs.outer > 0) {
      launchRows<T>(rs, [&](auto team, unsigned blocks) {
        layerNormGradRows<decltype(team), T, D><<<blocks, kRowThreads, 0, streamOf(c)>>>(
            rs, eps, dyTermsOf<D>(c), x.as<T>(), scale.as<T>(), c.hasInput(3) ? c.inputs[3].as<T>() : nullptr,
            c.outputs[0].as<T>(), narrow, scratch->stats);
      });
      if ((dscale || dbias) && chunks * rs.n > 0)
        layerNormGradColumns<T, D><<<blocksFor(chunks * rs.n), kThreads, 0, streamOf(c)>>>(
            rs, dyTermsOf<D>(c), x.as<T>(), scratch->stats, scratch->partials);
    }
    if ((dscale || dbias) && rs.n > 0)
      layerNormGradFinish<T><<<blocksFor(rs.n), kThreads, 0, streamOf(c)>>>(rs, scratch->partials, dscale, dbias);
    return launchStatus("LayerNormalizationGrad");
  });
}

// RMSNormalization: y = x * rstd * scale, rstd = 1/sqrt(mean(x^2) + eps).
template <typename Team, typename V> __device__ double rowRstd(const V &xv, int64_t n, double eps) {
  using M = typename Team::Math;
  M s = 0;
  Team::each(n, [&](int k, int64_t j) { s += M(xv(k, j)) * M(xv(k, j)); });
  return 1.0 / std::sqrt(Team::sum(double(s)) / double(n > 0 ? n : 1) + eps);
}

// Where element j of a normalized row reads the scale, which may broadcast
// over the normalized dims (ONNX allows it).
struct ScaleIndex {
  int rank = 0;
  int64_t dims[kMaxRank] = {}, strides[kMaxRank] = {};
  __device__ int64_t operator()(int64_t j) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (j % dims[d]) * strides[d];
      j /= dims[d];
    }
    return off;
  }
};

template <typename Team, typename T, typename Y>
__global__ void rmsNormKernel(RowSplit rs, ScaleIndex si, double eps, const T *px, const T *g, Y *py) {
  for (int64_t r = Team::first(); r < rs.outer; r += Team::stride()) {
    using M = typename Team::Math;
    const auto xv = rowValues<Team>(px + r * rs.n, rs.n);
    const M rstd = M(rowRstd<Team>(xv, rs.n, eps));
    Team::each(rs.n, [&](int k, int64_t j) { py[r * rs.n + j] = storeAs<Y, T>(M(xv(k, j)) * rstd * M(load(g[si(j)]))); });
  }
}

Status RmsNormKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &scale = c.inputs[1];
  RowSplit rs = splitRows(x, c.attrs);
  if (rs.outer * rs.n == 0) return Status::ok();
  int64_t axis = c.attrs.getInt("axis", -1);
  if (axis < 0) axis += x.rank();
  Dims norm(x.dims.begin() + axis, x.dims.end());
  if (norm.size() > size_t(kMaxRank) || scale.dims.size() > norm.size())
    return sdError("RMSNormalization on CUDA: the scale must broadcast to the normalized dims (up to rank 8)");
  ScaleIndex si;
  si.rank = int(norm.size());
  int64_t stride = 1;
  for (size_t i = scale.dims.size(); i-- > 0;) {
    size_t d = norm.size() - scale.dims.size() + i;
    si.strides[d] = scale.dims[i] == 1 ? 0 : stride;
    stride *= scale.dims[i];
  }
  for (size_t d = 0; d < norm.size(); ++d) si.dims[d] = norm[d];
  double eps = c.attrs.getFloat("epsilon", 1e-5);
  return dispatchFloatPair(x.dtype, c.outputs[0].dtype, "RMSNormalization", [&](auto tag, auto ytag) {
    using T = decltype(tag);
    using Y = decltype(ytag);
    launchRows<T>(rs, [&](auto team, unsigned blocks) {
      rmsNormKernel<decltype(team), T, Y><<<blocks, kRowThreads, 0, streamOf(c)>>>(rs, si, eps, x.as<T>(),
                                                                                    scale.as<T>(), c.outputs[0].as<Y>());
    });
    return launchStatus("RMSNormalization");
  });
}

// Per-row rstd and per-chunk dscale partials, allocated when the session is created.
std::shared_ptr<const void> prepareRmsNormGrad(const PrepareContext &p) {
  RowSplit rs = splitRows(p.kernel.inputs[1], p.kernel.attrs);
  int64_t chunks = (rs.outer + kChunkRows - 1) / kChunkRows;
  auto s = std::make_shared<LayerNormScratch>();
  if (cudaMalloc(&s->stats, size_t(std::max<int64_t>(1, rs.outer)) * sizeof(double)) != cudaSuccess ||
      cudaMalloc(&s->partials, size_t(std::max<int64_t>(1, chunks * rs.n)) * sizeof(double)) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return s;
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * scale, xhat = x * rstd.
template <typename Team, typename T, typename D>
__global__ void rmsNormGradRows(RowSplit rs, double eps, DyTerms<D> dy, const T *px, const T *scale, const T *acc,
                                T *pdx, NarrowedDx narrow, double *rstds) {
  using M = typename Team::Math;
  for (int64_t r = Team::first(); r < rs.outer; r += Team::stride()) {
    const int64_t row = r * rs.n;
    const auto xv = rowValues<Team>(px + row, rs.n);
    const auto dv = Team::values(rs.n, [&](int64_t j) { return dy(row + j); });
    const double rstd = rowRstd<Team>(xv, rs.n, eps);
    const M rs_ = M(rstd);
    M mgx = 0;
    Team::each(rs.n, [&](int k, int64_t j) { mgx += M(dv(k, j)) * M(load(scale[j])) * M(xv(k, j)) * rs_; });
    const M mgxMean = M(Team::sum(double(mgx)) / double(rs.n));
    Team::each(rs.n, [&](int k, int64_t j) {
      const T dx = store<T>(Compute<T>(rs_ * (M(dv(k, j)) * M(load(scale[j])) - M(xv(k, j)) * rs_ * mgxMean)));
      const T sum = plusAccumulate(acc, row + j, dx);
      pdx[row + j] = sum;
      narrow.write(row + j, sum);
    });
    if (Team::rank() == 0) rstds[r] = rstd;
  }
}

template <typename T, typename D>
__global__ void rmsNormGradColumns(RowSplit rs, DyTerms<D> dy, const T *px, const double *rstds, double *partials) {
  int64_t chunks = (rs.outer + kChunkRows - 1) / kChunkRows;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < chunks * rs.n;
       t += int64_t(gridDim.x) * blockDim.x) {
    int64_t chunk = t / rs.n, j = t % rs.n;
    double ds = 0;
    for (int64_t r = chunk * kChunkRows; r < rs.outer && r < (chunk + 1) * kChunkRows; ++r)
      ds += dy(r * rs.n + j) * double(load(px[r * rs.n + j])) * rstds[r];
    partials[chunk * rs.n + j] = ds;
  }
}

template <typename T> __global__ void rmsNormGradFinish(RowSplit rs, const double *partials, T *dscale) {
  int64_t chunks = (rs.outer + kChunkRows - 1) / kChunkRows;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < rs.n; j += int64_t(gridDim.x) * blockDim.x) {
    double s = 0;
    for (int64_t k = 0; k < chunks; ++k) s += partials[k * rs.n + j];
    dscale[j] = store<T>(Compute<T>(s));
  }
}

// dy, x, scale[, accumulate[, dy summands]] -> dx (+ accumulate), dscale[, narrowed dx].
Status RmsNormGradKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &x = c.inputs[1], &scale = c.inputs[2];
  auto *scratch = static_cast<const LayerNormScratch *>(c.prepared);
  if (!scratch) return sdError("RMSNormalizationGrad: its device scratch could not be allocated");
  RowSplit rs = splitRows(x, c.attrs);
  if (scale.numElements() != rs.n) return sdError("RMSNormalizationGrad needs a scale covering the normalized axes");
  SD_RETURN_IF_ERROR(checkNormGradSums(c.inputs, "RMSNormalizationGrad"));
  NarrowedDx narrow;
  SD_RETURN_IF_ERROR(narrowedDxOf(c, 2, "RMSNormalizationGrad", narrow));
  double eps = c.attrs.getFloat("epsilon", 1e-5);
  int64_t chunks = (rs.outer + kChunkRows - 1) / kChunkRows;
  return dispatchFloatPair(x.dtype, dy.dtype, "RMSNormalizationGrad", [&](auto tag, auto dtag) {
    using T = decltype(tag);
    using D = decltype(dtag);
    T *dscale = writesNormParamGrad(c.attrs, c.outputs, 1) ? c.outputs[1].as<T>() : nullptr; // else its pass is skipped
    if (rs.outer > 0) {
      launchRows<T>(rs, [&](auto team, unsigned blocks) {
        rmsNormGradRows<decltype(team), T, D><<<blocks, kRowThreads, 0, streamOf(c)>>>(
            rs, eps, dyTermsOf<D>(c), x.as<T>(), scale.as<T>(), c.hasInput(3) ? c.inputs[3].as<T>() : nullptr,
            c.outputs[0].as<T>(), narrow, scratch->stats);
      });
      if (dscale && chunks * rs.n > 0)
        rmsNormGradColumns<T, D><<<blocksFor(chunks * rs.n), kThreads, 0, streamOf(c)>>>(
            rs, dyTermsOf<D>(c), x.as<T>(), scratch->stats, scratch->partials);
    }
    if (dscale && rs.n > 0) {
      if (rs.outer > 0)
        rmsNormGradFinish<T><<<blocksFor(rs.n), kThreads, 0, streamOf(c)>>>(rs, scratch->partials, dscale);
      else
        SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(dscale, 0, c.outputs[1].byteSize(), streamOf(c)),
                                     "RMSNormalizationGrad"));
    }
    return launchStatus("RMSNormalizationGrad");
  });
}

// BatchNormalization (inference): per channel y = x * a + s with
// a = scale / sqrt(var + eps), s = bias - mean * a, in f64 as the CPU kernel.
template <typename T>
__global__ void batchNormKernel(int64_t n, int64_t channels, int64_t spatial, double eps, const T *x, const T *scale,
                                const T *bias, const T *mean, const T *var, T *y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = (i / spatial) % channels;
    const double a = double(load(scale[k])) / sqrt(double(load(var[k])) + eps);
    const double s = double(load(bias[k])) - double(load(mean[k])) * a;
    y[i] = store<T>(Compute<T>(double(load(x[i])) * a + s));
  }
}

// x [N, C, ...], scale, bias, mean, var [C] -> y.
Status BatchNormKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  const int64_t channels = x.rank() > 1 ? x.dims[1] : 1, n = x.numElements();
  const int64_t spatial = n / std::max<int64_t>(x.dims.empty() ? 1 : x.dims[0] * channels, 1);
  for (size_t i = 1; i <= 4; ++i)
    if (!c.hasInput(i) || c.inputs[i].numElements() != channels)
      return sdError("BatchNormalization parameter ", i, " must have ", channels, " elements");
  if (n == 0) return Status::ok();
  const double eps = c.attrs.getFloat("epsilon", 1e-5);
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    batchNormKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(n, channels, std::max<int64_t>(spatial, 1), eps,
                                                                     x.as<T>(), c.inputs[1].as<T>(), c.inputs[2].as<T>(),
                                                                     c.inputs[3].as<T>(), c.inputs[4].as<T>(),
                                                                     c.outputs[0].as<T>());
    return launchStatus("BatchNormalization");
  });
}

// InstanceNormalization: a block per (item, channel) row of the spatial
// elements, the CPU kernel's math (f64 mean, then f64 variance, then
// (x - mean) * scale / sqrt(var + eps) + bias), the sums as block trees.
template <typename T>
__global__ void instanceNormKernel(const T *x, const T *scale, const T *bias, T *y, int64_t rows, int64_t channels,
                                   int64_t spatial, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * spatial;
    T *yr = y + r * spatial;
    double s = 0;
    for (int64_t j = threadIdx.x; j < spatial; j += blockDim.x) s += double(load(xr[j]));
    const double mean = blockReduce(s, SumOp(), 0.0) / double(spatial);
    double v = 0;
    for (int64_t j = threadIdx.x; j < spatial; j += blockDim.x) {
      const double d = double(load(xr[j])) - mean;
      v += d * d;
    }
    const double var = blockReduce(v, SumOp(), 0.0) / double(spatial);
    const double a = double(load(scale[r % channels])) / std::sqrt(var + eps), b = double(load(bias[r % channels]));
    for (int64_t j = threadIdx.x; j < spatial; j += blockDim.x)
      yr[j] = store<T>(Compute<T>((double(load(xr[j])) - mean) * a + b));
  }
}

Status InstanceNormKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  if (x.rank() < 2) return sdError("InstanceNormalization needs [N, C, ...]");
  const int64_t channels = x.dims[1], rows = x.dims[0] * channels;
  if (rows == 0) return Status::ok();
  const int64_t spatial = x.numElements() / rows;
  if (c.inputs[1].numElements() != channels || c.inputs[2].numElements() != channels)
    return sdError("InstanceNormalization scale and bias must have ", channels, " elements");
  if (spatial == 0) return Status::ok();
  const double eps = c.attrs.getFloat("epsilon", 1e-5);
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    instanceNormKernel<T><<<rowBlocks(rows), kRowThreads, 0, streamOf(c)>>>(
        x.as<T>(), c.inputs[1].as<T>(), c.inputs[2].as<T>(), c.outputs[0].as<T>(), rows, channels, spatial, eps);
    return launchStatus("InstanceNormalization");
  });
}

} // namespace

void registerNormalizationKernels() {
  registerKernel("InstanceNormalization", InstanceNormKernel, floatStorage());
  registerKernel("BatchNormalization", BatchNormKernel, floatStorage());
  registerKernel("LayerNormalization", LayerNormKernel, floatStorage());
  registerKernel("LayerNormalizationGrad", LayerNormGradKernel, floatStorage(), prepareLayerNormGrad, 1);
  registerKernel("RMSNormalization", RmsNormKernel, floatStorage());
  registerKernel("RMSNormalizationGrad", RmsNormGradKernel, floatStorage(), prepareRmsNormGrad, 1);
}

} // namespace sd::cuda
