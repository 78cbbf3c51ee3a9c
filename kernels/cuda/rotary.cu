// CUDA kernel of Rotary (see SDOps.td and kernels/cpu/rotary.cc, whose pair
// layout it follows): one thread per rotated pair. The host cannot look at
// device positions without a sync, so a position outside the table gives a
// NaN row, which the loss then shows, instead of a read out of bounds.
#include "cuda_util.cuh"
#include <cmath>

namespace sd::cuda {
namespace {

// tableRows: rows of W angles in the table ([P, W] with positions, [Bc, S, W]
// without); tables: Bc (1: one table shared by the batch).
struct RotaryGeometry {
  int64_t pairs, d, half, w, seq, perBatch, tableRows, tables;
  int64_t rowsPerToken; // rows of one token: 1, or H for token-major x [B, S, H, D] (seq_axis 1)
  int64_t rotatedHeads; // rows (heads) of a token from this one on pass through; 0: all rotate
  bool interleaved, halfWidth, transposed;
};

// T: x's type; Y: y's (T, or with out_type a half of an f32 T or f32 of a
// half T); A: the tables' (T, or f32 with a half T: the math is f32 either way).
template <typename T, typename Y, typename A>
__global__ void rotaryKernel(const T *x, const A *cosT, const A *sinT, const int64_t *pos, Y *y, RotaryGeometry g) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < g.pairs; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = k / g.half, i = k % g.half;
    const int64_t b = r / g.perBatch, t = (r / g.rowsPerToken) % g.seq;
    const int64_t angle = pos ? pos[b * g.seq + t] : (g.tables == 1 ? 0 : b) * g.seq + t;
    const int64_t p = g.interleaved ? 2 * i : i, q = g.interleaved ? 2 * i + 1 : i + g.half;
    Y *yr = y + r * g.d;
    if (g.rotatedHeads > 0 && r % g.rowsPerToken >= g.rotatedHeads) { // a value head of a fused q|k|v
      const T *xr = x + r * g.d;
      yr[p] = store<Y>(Compute<Y>(load(xr[p])));
      yr[q] = store<Y>(Compute<Y>(load(xr[q])));
      continue;
    }
    if (angle < 0 || angle >= g.tableRows) {
      yr[p] = store<Y>(Compute<Y>(NAN));
      yr[q] = store<Y>(Compute<Y>(NAN));
      continue;
    }
    const int64_t cp = g.halfWidth ? i : p, cq = g.halfWidth ? i : q;
    const T *xr = x + r * g.d;
    const A *c = cosT + angle * g.w, *s = sinT + angle * g.w;
    const Compute<T> xp = load(xr[p]), xq = load(xr[q]);
    // The math is f32 for every pairing (f64 for f64), so rounding it to Y
    // once gives the bits of the f32 step and a Cast after (or before) it.
    if (!g.transposed) {
      yr[p] = store<Y>(Compute<Y>(xp * load(c[cp]) - xq * load(s[cp])));
      yr[q] = store<Y>(Compute<Y>(xq * load(c[cq]) + xp * load(s[cq])));
    } else {
      yr[p] = store<Y>(Compute<Y>(xp * load(c[cp]) + xq * load(s[cq])));
      yr[q] = store<Y>(Compute<Y>(xq * load(c[cq]) - xp * load(s[cp])));
    }
  }
}

Status RotaryKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &cosT = c.inputs[1], &sinT = c.inputs[2];
  const bool hasPositions = c.hasInput(3) && c.inputs[3].data;
  const int64_t rank = x.rank();
  if (rank < 3 || cosT.dims.empty()) return sdError("Rotary takes an input [B, ..., S, D]");
  RotaryGeometry g{};
  const int64_t seqAxis = c.attrs.getInt("seq_axis", rank - 2);
  if (seqAxis < 1 || seqAxis > rank - 2)
    return sdError("Rotary: seq_axis ", seqAxis, " is not between the batch and the features");
  g.d = x.dims[size_t(rank - 1)];
  g.seq = x.dims[size_t(seqAxis)];
  g.rowsPerToken = 1;
  for (int64_t a = seqAxis + 1; a < rank - 1; ++a) g.rowsPerToken *= x.dims[size_t(a)];
  g.half = g.d / 2;
  g.rotatedHeads = c.attrs.getInt("rotated_heads", 0);
  g.w = cosT.dims.back();
  g.tables = cosT.dims[0];
  g.tableRows = g.w ? cosT.numElements() / g.w : 0;
  g.interleaved = c.attrs.getInt("interleaved", 0) != 0;
  g.transposed = c.attrs.getInt("transposed", 0) != 0;
  g.halfWidth = 2 * g.w == g.d;
  const int64_t rows = g.d ? x.numElements() / g.d : 0;
  g.pairs = rows * g.half;
  g.perBatch = x.dims[0] ? rows / x.dims[0] : 0;
  if (g.pairs == 0) return Status::ok();
  auto run = [&](auto xTag, auto yTag, auto tableTag) {
    using T = decltype(xTag);
    using Y = decltype(yTag);
    using A = decltype(tableTag);
    rotaryKernel<T, Y, A><<<blocksFor(g.pairs), kThreads, 0, streamOf(c)>>>(
        x.as<T>(), cosT.as<A>(), sinT.as<A>(), hasPositions ? c.inputs[3].as<int64_t>() : nullptr,
        c.outputs[0].as<Y>(), g);
    return launchStatus("Rotary");
  };
  // Tables of x's type, or f32 (sd-half-elementwise: a half x, or an x and y
  // of different types through out_type).
  if (cosT.dtype != x.dtype && cosT.dtype != DType::F32)
    return sdError("Rotary's cos and sin must be ", dtypeName(x.dtype), " or f32, not ", dtypeName(cosT.dtype));
  return dispatchFloatPair(x.dtype, c.outputs[0].dtype, "Rotary", [&](auto xTag, auto yTag) {
    return cosT.dtype == x.dtype ? run(xTag, yTag, xTag) : run(xTag, yTag, float{});
  });
}

} // namespace

void registerRotaryKernels() { registerKernel("Rotary", RotaryKernel, floatStorage()); }

} // namespace sd::cuda
