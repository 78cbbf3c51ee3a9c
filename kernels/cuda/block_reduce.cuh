// Deterministic block-wide reductions: a fixed shuffle tree inside each warp,
// then warp 0 combines the warps' partials in order. No atomics, so a replay
// gives the same bits as the eager run.
#pragma once
#include <cuda_runtime.h>

namespace sd::cuda {

struct SumOp {
  template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T> __device__ T operator()(T a, T b) const { return a > b || a != a ? a : b; }
};

// One shuffle-down step of a reduction value: a builtin type moves in one
// __shfl_down_sync; a compound value (a softmax row's max and sum, loss.cu)
// specializes this with a shuffle per field.
template <typename T> struct Shuffle {
  __device__ static T down(T v, int offset) { return __shfl_down_sync(0xffffffffu, v, offset); }
};

// Every thread of the block gets the reduction of all threads' `v`.
// blockDim.x must be a multiple of 32 and at most 1024.
template <typename T, typename Op> __device__ T blockReduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  __shared__ T result;
  for (int off = 16; off > 0; off >>= 1) v = op(v, Shuffle<T>::down(v, off));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int warps = int(blockDim.x >> 5);
    v = lane < warps ? partial[lane] : identity;
    for (int off = 16; off > 0; off >>= 1) v = op(v, Shuffle<T>::down(v, off));
    if (lane == 0) result = v;
  }
  __syncthreads();
  T r = result;
  __syncthreads(); // partial/result may be reused by the caller's next reduction
  return r;
}

} // namespace sd::cuda
