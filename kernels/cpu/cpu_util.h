// Helpers shared by the CPU kernels: dtype dispatch and broadcast iteration.
#pragma once
#include "sd/ops/index_geometry.h"
#include "sd/ops/dispatch.h"
#include "sd/ops/registry.h"
#include "sd/ops/threadpool.h"
#include <cstdint>
#include <cstring>

namespace sd::cpu {

// Adds a CPU kernel computing element types `types` of input `typeOperand`
// (-1: of output 0).
void registerCpuKernel(const char *op, KernelFn fn, TypeSet types, PrepareFn prepare = nullptr,
                       int typeOperand = 0);

// Calls fn(T{}) with T matching dtype. Unsupported dtypes return an error.
template <typename F> Status dispatchFloat(DType t, F &&fn) {
  switch (t) {
  case DType::F32: return fn(float{});
  case DType::F64: return fn(double{});
  default: return sdError("no CPU kernel for dtype ", dtypeName(t));
  }
}

template <typename F> Status dispatchNumeric(DType t, F &&fn) {
  switch (t) {
  case DType::F32: return fn(float{});
  case DType::F64: return fn(double{});
  case DType::I64: return fn(int64_t{});
  case DType::I32: return fn(int32_t{});
  case DType::I16: return fn(int16_t{});
  case DType::I8: return fn(int8_t{});
  case DType::U8: return fn(uint8_t{});
  case DType::U16: return fn(uint16_t{});
  case DType::U32: return fn(uint32_t{});
  case DType::U64: return fn(uint64_t{});
  default: return sdError("no CPU kernel for dtype ", dtypeName(t));
  }
}

// Any fixed-size element type, by width only (data movement kernels).
template <typename F> Status dispatchBytes(DType t, F &&fn) { return dispatchByWidth(t, std::forward<F>(fn)); }

// Strides of `in` broadcast against `out` dims (0 on broadcast axes).
Dims broadcastStrides(const Dims &in, const Dims &out);

// Iterates the output of an N-ary broadcast in row-major order, calling
// fn(outOffset, inOffsets[], innerCount, innerStrides[]) for each run of the
// innermost dimension. Parallel over outer rows. Adjacent dims that every
// input walks alike (contiguously, or broadcast across both) are merged
// first, so a per-channel scale over an [N, C, H, W] image runs rows of H*W.
template <size_t N, typename F>
void forEachBroadcastRow(ThreadPool *pool, const Dims &outDims,
                         const Dims (&strides)[N], F &&fn) {
  Dims out;
  Dims inStrides[N];
  for (size_t d = 0; d < outDims.size(); ++d) {
    bool merge = !out.empty();
    for (size_t k = 0; k < N && merge; ++k)
      merge = inStrides[k].back() == strides[k][d] * outDims[d];
    if (merge) {
      out.back() *= outDims[d];
      for (size_t k = 0; k < N; ++k) inStrides[k].back() = strides[k][d];
    } else {
      out.push_back(outDims[d]);
      for (size_t k = 0; k < N; ++k) inStrides[k].push_back(strides[k][d]);
    }
  }
  int64_t rank = int64_t(out.size());
  int64_t inner = rank ? out[size_t(rank - 1)] : 1;
  int64_t rows = inner ? product(out) / inner : 0;
  if (rank == 0) rows = 1;
  int64_t innerStride[N];
  for (size_t k = 0; k < N; ++k)
    innerStride[k] = rank ? inStrides[k][size_t(rank - 1)] : 0;
  int64_t grain = inner >= 4096 ? 1 : (16384 / (inner + 1)) + 1;
  parallelFor(pool, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t rem = r, off[N] = {};
      for (int64_t d = rank - 2; d >= 0; --d) {
        int64_t idx = rem % out[size_t(d)];
        rem /= out[size_t(d)];
        for (size_t k = 0; k < N; ++k) off[k] += idx * inStrides[k][size_t(d)];
      }
      fn(r * inner, off, inner, innerStride);
    }
  });
}

} // namespace sd::cpu
