// Numpy broadcasting for the CUDA elementwise kernels: an output index's
// offsets into up to three operands (stride 0 on broadcast dims), passed by
// value to the kernels.
#pragma once
#include "cuda_util.cuh"
#include <vector>

namespace sd::cuda {

// Output index -> operand offsets for numpy broadcasting (stride 0 on broadcast dims).
struct Broadcast {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strideA[kMaxRank] = {}, strideB[kMaxRank] = {}, strideC[kMaxRank] = {};
  bool same = false; // every operand has the output's shape: offset = index
};

inline Dims stridesFor(const Dims &in, const Dims &out) {
  Dims s(out.size(), 0);
  int64_t acc = 1;
  for (size_t i = in.size(); i-- > 0;) {
    size_t o = out.size() - in.size() + i;
    s[o] = in[i] == 1 ? 0 : acc;
    acc *= in[i];
  }
  return s;
}

inline StatusOr<Broadcast> broadcastOf(const Dims &out, const std::vector<const Dims *> &ins) {
  Broadcast b;
  if (out.size() > size_t(kMaxRank)) return sdError("the CUDA backend broadcasts up to rank ", kMaxRank);
  b.rank = int(out.size());
  b.same = true;
  int64_t *strides[3] = {b.strideA, b.strideB, b.strideC};
  for (size_t k = 0; k < ins.size(); ++k) {
    if (ins[k]->size() > out.size()) return sdError("operand ", k, " has a higher rank than the result");
    b.same = b.same && *ins[k] == out;
    Dims s = stridesFor(*ins[k], out);
    for (size_t i = 0; i < out.size(); ++i) strides[k][i] = s[i];
  }
  for (size_t i = 0; i < out.size(); ++i) b.dims[i] = out[i];
  return b;
}

__device__ inline void offsets(const Broadcast &b, int64_t i, int64_t &a, int64_t &bb, int64_t &cc) {
  if (b.same) {
    a = bb = cc = i;
    return;
  }
  a = bb = cc = 0;
  for (int d = b.rank - 1; d >= 0; --d) {
    int64_t idx = i % b.dims[d];
    i /= b.dims[d];
    a += idx * b.strideA[d];
    bb += idx * b.strideB[d];
    cc += idx * b.strideC[d];
  }
}

} // namespace sd::cuda
