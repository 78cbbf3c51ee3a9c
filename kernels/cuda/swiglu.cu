// CUDA kernels of SwiGLU, y = silu(gate) * up, and its gradient (see
// kernels/cpu/swiglu.cc), separate or with gate and up packed in one tensor:
// grid-stride, kPack elements per thread as vectors.
#include "cuda_util.cuh"

namespace sd::cuda {
namespace {

template <typename T> __device__ inline T swigluOne(T gate, T up) {
  const Compute<T> g = load(gate), s = Compute<T>(1) / (Compute<T>(1) + exp(-g));
  return store<T>(g * s * load(up));
}

template <typename T> __device__ inline void swigluGradOne(T dy, T gate, T up, T &dgate, T &dup) {
  const Compute<T> g = load(gate), d = load(dy), s = Compute<T>(1) / (Compute<T>(1) + exp(-g));
  dup = store<T>(d * g * s);
  dgate = store<T>(d * load(up) * (s + g * s * (Compute<T>(1) - s)));
}

// V elements per thread as one vector (V = kPack where every pointer is
// aligned for it, else 1).
template <int V, typename T> __global__ void swigluKernel(const T *gate, const T *up, T *y, int64_t n) {
  using P = Pack<T, V>;
  forEachPack<V>(
      n,
      [&](int64_t p) {
        const P g = reinterpret_cast<const P *>(gate)[p], u = reinterpret_cast<const P *>(up)[p];
        P out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = swigluOne(g.v[k], u.v[k]);
        reinterpret_cast<P *>(y)[p] = out;
      },
      [&](int64_t i) { y[i] = swigluOne(gate[i], up[i]); });
}

template <int V, typename T>
__global__ void swigluGradKernel(const T *dy, const T *gate, const T *up, T *dgate, T *dup, int64_t n) {
  using P = Pack<T, V>;
  forEachPack<V>(
      n,
      [&](int64_t p) {
        const P d = reinterpret_cast<const P *>(dy)[p], g = reinterpret_cast<const P *>(gate)[p],
                u = reinterpret_cast<const P *>(up)[p];
        P dg, du;
#pragma unroll
        for (int k = 0; k < V; ++k) swigluGradOne(d.v[k], g.v[k], u.v[k], dg.v[k], du.v[k]);
        reinterpret_cast<P *>(dgate)[p] = dg;
        reinterpret_cast<P *>(dup)[p] = du;
      },
      [&](int64_t i) { swigluGradOne(dy[i], gate[i], up[i], dgate[i], dup[i]); });
}

Status SwiGLUKernel(const KernelContext &c) {
  const TensorView &gate = c.inputs[0], &up = c.inputs[1];
  if (up.dims != gate.dims) return sdError("SwiGLU: gate and up differ in shape");
  const int64_t n = gate.numElements();
  if (n == 0) return Status::ok();
  return dispatchFloatStorage(gate.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *g = gate.as<T>(), *u = up.as<T>();
    T *y = c.outputs[0].as<T>();
    if (allPackAligned<T>({g, u, y}))
      swigluKernel<kPack, T><<<packBlocks<kPack>(n), kThreads, 0, streamOf(c)>>>(g, u, y, n);
    else
      swigluKernel<1, T><<<packBlocks<1>(n), kThreads, 0, streamOf(c)>>>(g, u, y, n);
    return launchStatus("SwiGLU");
  });
}

Status SwiGLUGradKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &gate = c.inputs[1], &up = c.inputs[2];
  if (up.dims != gate.dims || dy.dims != gate.dims) return sdError("SwiGLUGrad: operands differ in shape");
  const int64_t n = gate.numElements();
  if (n == 0) return Status::ok();
  return dispatchFloatStorage(gate.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *d = dy.as<T>(), *g = gate.as<T>(), *u = up.as<T>();
    T *dg = c.outputs[0].as<T>(), *du = c.outputs[1].as<T>();
    if (allPackAligned<T>({d, g, u, dg, du}))
      swigluGradKernel<kPack, T><<<packBlocks<kPack>(n), kThreads, 0, streamOf(c)>>>(d, g, u, dg, du, n);
    else
      swigluGradKernel<1, T><<<packBlocks<1>(n), kThreads, 0, streamOf(c)>>>(d, g, u, dg, du, n);
    return launchStatus("SwiGLUGrad");
  });
}

// Packed gate and up (SwiGLUPacked): element j of row r reads x[r][j] and
// x[r][F + j]; consecutive threads take consecutive packs of V elements
// along j (V divides F, every pointer aligned for it; else V = 1), so both
// reads and the write coalesce as vectors. I: the index type, 32-bit where
// every index fits (a 64-bit division costs the GPU dozens of instructions).
template <int V, typename I, typename T>
__global__ void swigluPackedKernel(const T *x, T *y, int64_t rows, int64_t f) {
  using P = Pack<T, V>;
  const I packsPerRow = I(f / V), packs = I(rows) * packsPerRow;
  for (I k = blockIdx.x * I(blockDim.x) + threadIdx.x; k < packs; k += I(gridDim.x) * blockDim.x) {
    const I r = k / packsPerRow, j = (k - r * packsPerRow) * V;
    const T *xr = x + int64_t(r) * 2 * f;
    const P g = *reinterpret_cast<const P *>(xr + j), u = *reinterpret_cast<const P *>(xr + f + j);
    P out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = swigluOne(g.v[e], u.v[e]);
    *reinterpret_cast<P *>(y + int64_t(r) * f + j) = out;
  }
}

template <int V, typename I, typename T>
__global__ void swigluPackedGradKernel(const T *dy, const T *x, T *dx, int64_t rows, int64_t f) {
  using P = Pack<T, V>;
  const I packsPerRow = I(f / V), packs = I(rows) * packsPerRow;
  for (I k = blockIdx.x * I(blockDim.x) + threadIdx.x; k < packs; k += I(gridDim.x) * blockDim.x) {
    const I r = k / packsPerRow, j = (k - r * packsPerRow) * V;
    const int64_t g = int64_t(r) * 2 * f + j;
    const P d = *reinterpret_cast<const P *>(dy + int64_t(r) * f + j), gate = *reinterpret_cast<const P *>(x + g),
            up = *reinterpret_cast<const P *>(x + g + f);
    P dg, du;
#pragma unroll
    for (int e = 0; e < V; ++e) swigluGradOne(d.v[e], gate.v[e], up.v[e], dg.v[e], du.v[e]);
    *reinterpret_cast<P *>(dx + g) = dg;
    *reinterpret_cast<P *>(dx + g + f) = du;
  }
}

// Launches `launch` as kernel<V, I> with V = kPack where f and every
// pointer allow it (else 1) and I 32-bit where rows * f (with a grid's
// stride past the end) fits.
template <typename Launch>
void launchPacked(int64_t rows, int64_t f, std::initializer_list<const void *> pointers, size_t elementSize,
                  Launch launch) {
  bool aligned = f % kPack == 0;
  for (const void *p : pointers) aligned = aligned && reinterpret_cast<uintptr_t>(p) % (elementSize * kPack) == 0;
  const int64_t n = rows * f;
  const bool narrow = n + int64_t(blocksFor(n)) * kThreads < (int64_t(1) << 31);
  if (aligned && narrow) launch(std::integral_constant<int, kPack>{}, uint32_t{}, packBlocks<kPack>(n));
  else if (aligned) launch(std::integral_constant<int, kPack>{}, int64_t{}, packBlocks<kPack>(n));
  else if (narrow) launch(std::integral_constant<int, 1>{}, uint32_t{}, blocksFor(n));
  else launch(std::integral_constant<int, 1>{}, int64_t{}, blocksFor(n));
}

Status SwiGLUPackedKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  if (x.rank() < 1 || x.dims.back() % 2) return sdError("SwiGLUPacked: x must be [..., 2F]");
  const int64_t f = x.dims.back() / 2, rows = f ? x.numElements() / (2 * f) : 0;
  if (rows * f == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *xp = x.as<T>();
    T *y = c.outputs[0].as<T>();
    launchPacked(rows, f, {xp, y}, sizeof(T), [&](auto v, auto index, unsigned blocks) {
      swigluPackedKernel<decltype(v)::value, decltype(index), T><<<blocks, kThreads, 0, streamOf(c)>>>(xp, y, rows, f);
    });
    return launchStatus("SwiGLUPacked");
  });
}

Status SwiGLUPackedGradKernel(const KernelContext &c) {
  const TensorView &dy = c.inputs[0], &x = c.inputs[1];
  if (x.rank() < 1 || x.dims.back() % 2) return sdError("SwiGLUPackedGrad: x must be [..., 2F]");
  const int64_t f = x.dims.back() / 2, rows = f ? x.numElements() / (2 * f) : 0;
  if (dy.numElements() != rows * f) return sdError("SwiGLUPackedGrad: the gradient does not fit x");
  if (rows * f == 0) return Status::ok();
  return dispatchFloatStorage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *d = dy.as<T>(), *xp = x.as<T>();
    T *dx = c.outputs[0].as<T>();
    launchPacked(rows, f, {d, xp, dx}, sizeof(T), [&](auto v, auto index, unsigned blocks) {
      swigluPackedGradKernel<decltype(v)::value, decltype(index), T>
          <<<blocks, kThreads, 0, streamOf(c)>>>(d, xp, dx, rows, f);
    });
    return launchStatus("SwiGLUPackedGrad");
  });
}

} // namespace

void registerSwiGLUKernels() {
  registerKernel("SwiGLU", SwiGLUKernel, floatStorage());
  registerKernel("SwiGLUGrad", SwiGLUGradKernel, floatStorage());
  registerKernel("SwiGLUPacked", SwiGLUPackedKernel, floatStorage());
  registerKernel("SwiGLUPackedGrad", SwiGLUPackedGradKernel, floatStorage(), nullptr, 1);
}

} // namespace sd::cuda
