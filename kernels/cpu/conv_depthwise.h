// Direct 2-D convolution for groups of one input channel (depthwise and
// channel-multiplier convs, as in MobileNet-style depthwise-separable blocks):
// im2col + GEMM would run a 1-row GEMM over a k*k-deep column matrix per
// channel, paying for the copy more than for the arithmetic.
#pragma once
#include "conv_epilogue.h"
#include "sd/ops/threadpool.h"
#include "sd/ops/window_geometry.h"

namespace sd::cpu {

// y[b, oc] = bias[oc] + sum over taps of w[oc, 0, kh, kw] * x[b, oc / mult, ...]
// for images [0, n), channels of x `cin`, output channels cin * mult; then
// the epilogue, one output plane at a time.
template <typename T>
void depthwiseConv2d(ThreadPool *pool, const T *x, const T *w, const T *bias, T *y, int64_t n, int64_t cin,
                     int64_t mult, const WindowGeometry &g, const ConvEpilogue<T> &epilogue);

} // namespace sd::cpu
