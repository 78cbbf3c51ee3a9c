// f32 2-D convolution as an implicit GEMM: the GEMM reads the input (copied
// once per tile with its zero border, split into phases when strided)
// through a table of row offsets, one per (input channel, kernel tap),
// instead of an im2col matrix nine times the input's size for a 3x3 kernel.
#pragma once
#include "conv_epilogue.h"
#include "sgemm.h"
#include "sd/ops/threadpool.h"
#include "sd/ops/window_geometry.h"
#include <vector>

namespace sd::cpu {

// Whether implicitConv2d computes this geometry (2-D).
bool implicitConvApplies(const WindowGeometry &g);

// y[b, oc] = bias[oc] + conv(x[b], w[oc]) for images [0, n), in `group`
// groups of cin / group input channels, then the epilogue. packedGroups, when
// not empty, holds each group's weight rows packed for the GEMM.
void implicitConv2d(ThreadPool *pool, const float *x, const float *w, const std::vector<PackedA> *packedGroups,
                    const float *bias, float *y, int64_t n, int64_t cin, int64_t m, int64_t group,
                    const WindowGeometry &g, const ConvEpilogue<float> &epilogue);

} // namespace sd::cpu
