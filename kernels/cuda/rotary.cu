// CUDA kernel of Rotary (see SDOps.td and kernels/cpu/rotary.cc, whose pair
// layout it follows): one thread per rotated pair, or per pack of kPack
// pairs in the rotate-half layout (vector loads). The host cannot look at
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

// Where row r of x (its pairs, rotated or not) finds its angle: -1 when it
// passes through unrotated (a value head of a fused q|k|v), -2 when its
// position is outside the table (a NaN row).
template <typename I> __device__ inline int64_t rowAngle(I r, const int64_t *pos, const RotaryGeometry &g) {
  const I rowsPerToken = I(g.rowsPerToken);
  if (g.rotatedHeads > 0 && r % rowsPerToken >= I(g.rotatedHeads)) return -1;
  const I b = r / I(g.perBatch), t = (r / rowsPerToken) % I(g.seq);
  const int64_t angle = pos ? pos[int64_t(b) * g.seq + t] : int64_t(g.tables == 1 ? 0 : b) * g.seq + t;
  return angle < 0 || angle >= g.tableRows ? -2 : angle;
}

// The rotation of the pair (xp, xq) with (cos, sin) at p and q, in C (x's
// compute type: f32 for every pairing, f64 for f64), so rounding it to Y
// once gives the bits of the f32 step and a Cast after (or before) it.
template <typename Y, typename C>
__device__ inline void rotatePair(C xp, C xq, C cp, C sp, C cq, C sq, bool transposed, Y &yp, Y &yq) {
  if (!transposed) {
    yp = store<Y>(Compute<Y>(xp * cp - xq * sp));
    yq = store<Y>(Compute<Y>(xq * cq + xp * sq));
  } else {
    yp = store<Y>(Compute<Y>(xp * cp + xq * sq));
    yq = store<Y>(Compute<Y>(xq * cq - xp * sp));
  }
}

// T: x's type; Y: y's (T, or with out_type a half of an f32 T or f32 of a
// half T); A: the tables' (T, or f32 with a half T: the math is f32 either
// way). I: the index type, 32-bit where every index fits (64-bit divisions
// cost the GPU dozens of instructions each). One thread per rotated pair.
template <typename T, typename Y, typename A, typename I>
__global__ void rotaryKernel(const T *x, const A *cosT, const A *sinT, const int64_t *pos, Y *y, RotaryGeometry g) {
  const I half = I(g.half), d = I(g.d);
  for (I k = blockIdx.x * I(blockDim.x) + threadIdx.x; k < I(g.pairs); k += I(gridDim.x) * blockDim.x) {
    const I r = k / half, i = k % half;
    const int64_t angle = rowAngle(r, pos, g);
    const I p = g.interleaved ? 2 * i : i, q = g.interleaved ? 2 * i + 1 : i + half;
    const T *xr = x + int64_t(r) * d;
    Y *yr = y + int64_t(r) * d;
    if (angle == -1) { // a value head of a fused q|k|v
      yr[p] = store<Y>(Compute<Y>(load(xr[p])));
      yr[q] = store<Y>(Compute<Y>(load(xr[q])));
      continue;
    }
    if (angle == -2) {
      yr[p] = store<Y>(Compute<Y>(NAN));
      yr[q] = store<Y>(Compute<Y>(NAN));
      continue;
    }
    const I cp = g.halfWidth ? i : p, cq = g.halfWidth ? i : q;
    const A *c = cosT + angle * g.w, *s = sinT + angle * g.w;
    rotatePair<Y, Compute<T>>(load(xr[p]), load(xr[q]), load(c[cp]), load(s[cp]), load(c[cq]), load(s[cq]),
                              g.transposed, yr[p], yr[q]);
  }
}

// The rotate-half layout (pairs i and i + D/2) in packs of V consecutive
// pairs: x, y and the tables read and written as vectors (V divides D/2 and
// the table width; every pointer aligned for it), the row's angle found once
// per pack.
template <int V, typename T, typename Y, typename A, typename I>
__global__ void rotaryHalvesKernel(const T *x, const A *cosT, const A *sinT, const int64_t *pos, Y *y,
                                   RotaryGeometry g) {
  using PT = Pack<T, V>;
  using PY = Pack<Y, V>;
  using PA = Pack<A, V>;
  const I packsPerRow = I(g.half / V), d = I(g.d), half = I(g.half);
  const I packs = I(g.pairs / V);
  for (I k = blockIdx.x * I(blockDim.x) + threadIdx.x; k < packs; k += I(gridDim.x) * blockDim.x) {
    const I r = k / packsPerRow, i = (k - r * packsPerRow) * V;
    const int64_t angle = rowAngle(r, pos, g);
    const T *xr = x + int64_t(r) * d;
    Y *yr = y + int64_t(r) * d;
    const PT xp = *reinterpret_cast<const PT *>(xr + i), xq = *reinterpret_cast<const PT *>(xr + i + half);
    PY yp, yq;
    if (angle < 0) { // -1: passed through; -2: outside the table
#pragma unroll
      for (int j = 0; j < V; ++j) {
        yp.v[j] = store<Y>(angle == -1 ? Compute<Y>(load(xp.v[j])) : Compute<Y>(NAN));
        yq.v[j] = store<Y>(angle == -1 ? Compute<Y>(load(xq.v[j])) : Compute<Y>(NAN));
      }
    } else {
      const A *c = cosT + angle * g.w, *s = sinT + angle * g.w;
      const I cq = g.halfWidth ? i : i + half;
      const PA cp = *reinterpret_cast<const PA *>(c + i), sp = *reinterpret_cast<const PA *>(s + i),
               cqv = *reinterpret_cast<const PA *>(c + cq), sqv = *reinterpret_cast<const PA *>(s + cq);
#pragma unroll
      for (int j = 0; j < V; ++j)
        rotatePair<Y, Compute<T>>(load(xp.v[j]), load(xq.v[j]), load(cp.v[j]), load(sp.v[j]), load(cqv.v[j]),
                                  load(sqv.v[j]), g.transposed, yp.v[j], yq.v[j]);
    }
    *reinterpret_cast<PY *>(yr + i) = yp;
    *reinterpret_cast<PY *>(yr + i + half) = yq;
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
  // 32-bit indices where the pairs, with a grid's stride past the last, fit.
  const bool narrow = g.pairs + int64_t(blocksFor(g.pairs)) * kThreads < (int64_t(1) << 31);
  auto run = [&](auto xTag, auto yTag, auto tableTag) {
    using T = decltype(xTag);
    using Y = decltype(yTag);
    using A = decltype(tableTag);
    const T *xp = x.as<T>();
    const A *cp = cosT.as<A>(), *sp = sinT.as<A>();
    const int64_t *pos = hasPositions ? c.inputs[3].as<int64_t>() : nullptr;
    Y *yp = c.outputs[0].as<Y>();
    const bool halves = !g.interleaved && g.half % kPack == 0 && g.w % kPack == 0 && allPackAligned<T>({xp}) &&
                        allPackAligned<Y>({yp}) && allPackAligned<A>({cp, sp});
    if (halves && narrow)
      rotaryHalvesKernel<kPack, T, Y, A, uint32_t>
          <<<packBlocks<kPack>(g.pairs), kThreads, 0, streamOf(c)>>>(xp, cp, sp, pos, yp, g);
    else if (halves)
      rotaryHalvesKernel<kPack, T, Y, A, int64_t>
          <<<packBlocks<kPack>(g.pairs), kThreads, 0, streamOf(c)>>>(xp, cp, sp, pos, yp, g);
    else if (narrow)
      rotaryKernel<T, Y, A, uint32_t><<<blocksFor(g.pairs), kThreads, 0, streamOf(c)>>>(xp, cp, sp, pos, yp, g);
    else
      rotaryKernel<T, Y, A, int64_t><<<blocksFor(g.pairs), kThreads, 0, streamOf(c)>>>(xp, cp, sp, pos, yp, g);
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
