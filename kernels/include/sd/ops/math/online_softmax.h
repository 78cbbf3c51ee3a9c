// A row's softmax statistics gathered in one pass (online softmax, as flash
// attention keeps them): the running max and the sum of exp(x - max),
// rescaled when the max grows. Partial statistics of a row's pieces merge in
// any fixed order, so a block of threads can split a vocabulary-wide row and
// still read it once. Shared by the CUDA loss kernels and the unit tests.
#pragma once
#include "sd/ops/math/host_device.h"
#include <cmath>

namespace sd::math {

template <typename C> struct RowStats {
  C max = C(-INFINITY), sum = C(0);

  SD_HD void add(C x) {
    if (x > max) {
      sum = sum * std::exp(max - x) + C(1);
      max = x;
    } else if (x != C(-INFINITY)) {
      sum += std::exp(x - max); // a NaN score makes the sum NaN
    }
  }
  SD_HD C scaledTo(C m) const { return sum == C(0) ? C(0) : sum * std::exp(max - m); }
  SD_HD RowStats merged(RowStats o) const {
    RowStats r;
    r.max = o.max > max ? o.max : max;
    r.sum = scaledTo(r.max) + o.scaledTo(r.max);
    return r;
  }
  // 1 / sum and max + log(sum); NaN wherever the two-pass form (max first,
  // then the sum) gives NaN: an infinite max has an exp(inf - inf) or
  // exp(-inf + inf) term.
  SD_HD C inverseSum() const { return std::isinf(max) ? C(NAN) : C(1) / sum; }
  SD_HD C shift() const { return std::isinf(max) ? C(NAN) : max + std::log(sum); }
};

} // namespace sd::math
