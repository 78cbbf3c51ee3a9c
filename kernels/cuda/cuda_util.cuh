// What every CUDA kernel file shares: the session's stream, launch checks,
// grid sizing, storage-type conversions and dtype dispatch. Element storage
// is f32, f64, f16 or bf16; f16/bf16 compute in f32 (f64 in f64).
#pragma once
#include "sd/ops/kernel.h"
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace sd::cuda {

inline cudaStream_t streamOf(const KernelContext &c) { return static_cast<cudaStream_t>(c.stream); }

// The status of the launches the kernel just enqueued; an error names the op.
Status launchStatus(const char *op);
// A CUDA runtime call's status as ours.
Status cudaCheck(cudaError_t e, const char *what);
// `to` gets `from`'s bytes (to's size), queued on the stream; nothing to do
// when they are the same memory (a result stored in place) or empty.
Status copyTensor(const TensorView &from, const TensorView &to, cudaStream_t stream, const char *op);

// resultTypes: the element types result 0 may take, where the kernel does not
// produce every type (Cast); empty: any.
void registerKernel(const char *op, KernelFn fn, TypeSet types, PrepareFn prepare = nullptr, int typeOperand = 0,
                    TypeSet resultTypes = {});

constexpr int kThreads = 256;
// Blocks for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned blocksFor(int64_t n) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(1) << 16)));
}

// Blocks for one block (or one team of threads) per row, capped: the kernel's
// grid-stride loop over rows covers the rest.
inline unsigned rowBlocks(int64_t rows) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(rows, int64_t(1) << 20)));
}

// Streaming kernels move kPack consecutive elements per thread as one vector
// load and store (16 bytes for f32): one element per thread leaves too few
// bytes in flight to reach HBM's bandwidth.
constexpr int kPack = 4;
template <typename T, int N> struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
// Whether p may be read as Pack<T, kPack>s.
template <typename T> inline bool packAligned(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kPack) == 0;
}
template <typename T> bool allPackAligned(std::initializer_list<const void *> pointers) {
  for (const void *p : pointers)
    if (!packAligned<T>(p)) return false;
  return true;
}

// Grid-stride over n elements in packs of V: pack(p) for each whole pack the
// thread takes, then one(i) for the element after the last pack that is its
// own (threads 0 .. n % V - 1). V = 1: one element per thread, no remainder.
template <int V, typename PackFn, typename OneFn> __device__ inline void forEachPack(int64_t n, PackFn pack, OneFn one) {
  const int64_t packs = n / V, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t p = first; p < packs; p += int64_t(gridDim.x) * blockDim.x) pack(p);
  if (first < n - packs * V) one(packs * V + first);
}
// Blocks for forEachPack<V> over n elements.
template <int V> unsigned packBlocks(int64_t n) { return blocksFor(std::max<int64_t>(n / V, 1)); }

// The type a storage type computes in.
template <typename T> struct ComputeOf { using type = float; };
template <> struct ComputeOf<double> { using type = double; };
template <> struct ComputeOf<int64_t> { using type = int64_t; }; // integer arithmetic stays exact
template <> struct ComputeOf<int32_t> { using type = int32_t; };
template <typename T> using Compute = typename ComputeOf<T>::type;

template <typename T> __device__ inline Compute<T> load(T x) { return Compute<T>(x); }
template <> __device__ inline float load(__half x) { return __half2float(x); }
template <> __device__ inline float load(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ inline T store(Compute<T> x) { return T(x); }
template <> __device__ inline __half store(float x) { return __float2half_rn(x); }
template <> __device__ inline __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }

inline TypeSet floatStorage() { return {DType::F32, DType::F64, DType::F16, DType::BF16}; }

// Calls f(T{}) with T the storage type of `t` (floatStorage() only).
template <typename F> Status dispatchFloatStorage(DType t, F &&f) {
  switch (t) {
  case DType::F32: return f(float{});
  case DType::F64: return f(double{});
  case DType::F16: return f(__half{});
  case DType::BF16: return f(__nv_bfloat16{});
  default: return sdError("the CUDA backend does not compute ", dtypeName(t), " here");
  }
}

// Calls f(A{}, B{}) with A and B the storage types of `a` and `b`: the same
// type, or f32 and a half in either order (a step whose input and result, or
// input and gradient, differ under sd-half-elementwise: out_type, a half dy).
template <typename F> Status dispatchFloatPair(DType a, DType b, const char *op, F &&f) {
  if (a == b) return dispatchFloatStorage(a, [&](auto tag) { return f(tag, tag); });
  if (a == DType::F32 && b == DType::BF16) return f(float{}, __nv_bfloat16{});
  if (a == DType::F32 && b == DType::F16) return f(float{}, __half{});
  if (a == DType::BF16 && b == DType::F32) return f(__nv_bfloat16{}, float{});
  if (a == DType::F16 && b == DType::F32) return f(__half{}, float{});
  return sdError(op, " on CUDA pairs ", dtypeName(a), " with ", dtypeName(b), ": only one type, or f32 with a half");
}

// A scalar operand (step, lr, ...) read on the device, whatever its numeric
// type, so no kernel needs the host to look at device memory.
struct DeviceScalar {
  const void *ptr = nullptr;
  DType dtype = DType::Undefined;
  __device__ double get() const {
    switch (dtype) {
    case DType::F32: return double(*static_cast<const float *>(ptr));
    case DType::F64: return *static_cast<const double *>(ptr);
    case DType::I64: return double(*static_cast<const int64_t *>(ptr));
    case DType::I32: return double(*static_cast<const int32_t *>(ptr));
    case DType::F16: return double(__half2float(*static_cast<const __half *>(ptr)));
    case DType::BF16: return double(__bfloat162float(*static_cast<const __nv_bfloat16 *>(ptr)));
    case DType::Bool: return *static_cast<const uint8_t *>(ptr) ? 1.0 : 0.0;
    default: return 0.0;
    }
  }
};

// Operand i as a device scalar, or an error when it is not one number of a supported type.
StatusOr<DeviceScalar> scalarOperand(const KernelContext &c, size_t i);

// Up to rank-8 shapes passed by value to kernels.
constexpr int kMaxRank = 8;
struct Shape8 {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
};

} // namespace sd::cuda

namespace sd::cuda {
// Writes `src` broadcast (numpy rules) to `dst`'s shape: Expand, and Gemm's C.
Status broadcastInto(const TensorView &src, const TensorView &dst, cudaStream_t stream);
// y = x with its dims permuted (y's dim i is x's dim perm[i]): Transpose, and
// Attention's K between the op's [d, S] and cuDNN's [S, d] layouts.
Status permute(const TensorView &x, const TensorView &y, const std::vector<int64_t> &perm, cudaStream_t s,
               const char *op);
} // namespace sd::cuda

namespace sd::cuda {
// Calls f with the C++ type of an index tensor's elements (i64 or i32).
template <typename F> Status dispatchIndex(DType t, F &&f) {
  if (t == DType::I64) return f(int64_t{});
  if (t == DType::I32) return f(int32_t{});
  return sdError("indices must be i32 or i64 on CUDA, got ", dtypeName(t));
}
// An index as ONNX reads it: negative counts from the end of a `dim`-long axis.
template <typename I> __device__ inline int64_t wrapIndex(I v, int64_t dim) {
  const int64_t i = int64_t(v);
  return i < 0 ? i + dim : i;
}

// Operand i as a view of its host copy at prepare time (`view` null when the
// operand is absent); false when it is not a constant the host can read.
bool hostView(const PrepareContext &p, size_t i, TensorView &storage, const TensorView *&view);
// Operand i's integers read on the host at prepare time (a constant's plan
// copy); an absent operand gives an empty list. False when the operand is not
// a constant, so a GPU kernel cannot see its values before the step runs.
bool hostIntegers(const PrepareContext &p, size_t i, std::vector<int64_t> &out);
// The same for an operand's numbers as doubles (Resize's roi and scales).
bool hostDoubles(const PrepareContext &p, size_t i, std::vector<double> &out);

// A host vector copied into fresh device memory (room for one element when
// empty) when the session is created; false when it cannot be (the CUDA error
// is left for the caller to clear).
template <typename V> bool uploadVector(const std::vector<V> &host, V *&device) {
  if (cudaMalloc(&device, std::max<size_t>(host.size(), 1) * sizeof(V)) != cudaSuccess) return false;
  return host.empty() || cudaMemcpy(device, host.data(), host.size() * sizeof(V), cudaMemcpyHostToDevice) == cudaSuccess;
}

// Device memory a step keeps for its whole session (a kernel's scratch),
// allocated by its prepare function before any capture.
struct DeviceScratch {
  void *data = nullptr;
  ~DeviceScratch() { cudaFree(data); }
  template <typename T> T *as() const { return static_cast<T *>(data); }
};
// `bytes` of scratch (at least one), or null when the device cannot hold it.
std::shared_ptr<DeviceScratch> deviceScratch(size_t bytes);
// A step's scratch from its prepared value; null when preparing could not allocate it.
inline const DeviceScratch *scratchOf(const KernelContext &c) { return static_cast<const DeviceScratch *>(c.prepared); }

// What a prepare function derived, or why it could not (reported by the step).
struct PreparedError {
  std::string error;
};
} // namespace sd::cuda
