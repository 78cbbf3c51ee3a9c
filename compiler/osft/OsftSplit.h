// The SVD split of orthogonal subspace fine-tuning, shared by the compiler
// pass (sd-peft-osft) and sdc merge: W [out, in] = U diag(S) V with the top
// `k` singular triplets as the frozen high part and the rest as the
// trainable low part. Computed in fp64 by LAPACK's divide-and-conquer SVD;
// each pair (u, v) has its sign fixed (the largest |u| entry positive), so
// the split is deterministic whatever the LAPACK build.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sd {

struct SvdFactors {
  int64_t out = 0, in = 0, rank = 0; // rank = min(out, in)
  std::vector<double> u;             // [out, rank]
  std::vector<double> s;             // [rank], descending
  std::vector<double> v;             // [rank, in] (the rows of V^T)
};

// Fails (with `error` set) on a LAPACK failure or a non-finite weight.
bool svdSplit(const std::vector<double> &w, int64_t out, int64_t in, SvdFactors &f, std::string &error);

// The columns [first, first + count) of U, rows of V and entries of S, as f32.
void factorSlice(const SvdFactors &f, int64_t first, int64_t count, std::vector<float> &u, std::vector<float> &s,
                 std::vector<float> &v);

// PEFT's effective_rank for one weight: a value in (0, 1) is a fraction of
// min(out, in) (floored), a whole number at least 1 is the rank itself.
int64_t preservedRank(double value, int64_t minDim);

} // namespace sd
