// NonMaxSuppression's box geometry, shared by the CPU and CUDA kernels (as
// onnx/reference computes it, in f32): boxes as min/max corners and the
// IoU test that suppresses one by another.
#pragma once
#include "sd/ops/math/host_device.h"
#include <cstdint>
#include <cstring>

namespace sd::math {

// std::min/std::max's choices (the first operand on ties and NaN), on every backend.
SD_HD float minOf(float a, float b) { return b < a ? b : a; }
SD_HD float maxOf(float a, float b) { return a < b ? b : a; }

struct Corners {
  float x0, y0, x1, y1, area;
};

// Boxes as min/max corners: [y1, x1, y2, x2] in any diagonal order, or
// [x_center, y_center, width, height] with center_point_box.
SD_HD Corners cornersOf(const float *b, bool centerPoint) {
  Corners c;
  if (centerPoint) {
    c.x0 = b[0] - b[2] / 2, c.x1 = b[0] + b[2] / 2, c.y0 = b[1] - b[3] / 2, c.y1 = b[1] + b[3] / 2;
  } else {
    c.y0 = minOf(b[0], b[2]), c.y1 = maxOf(b[0], b[2]), c.x0 = minOf(b[1], b[3]), c.x1 = maxOf(b[1], b[3]);
  }
  c.area = (c.x1 - c.x0) * (c.y1 - c.y0);
  return c;
}

// Whether a kept box `b` suppresses candidate `a`: their IoU exceeds the threshold.
SD_HD bool suppresses(const Corners &a, const Corners &b, float iouThreshold) {
  const float ix0 = maxOf(a.x0, b.x0), ix1 = minOf(a.x1, b.x1);
  if (ix1 <= ix0) return false;
  const float iy0 = maxOf(a.y0, b.y0), iy1 = minOf(a.y1, b.y1);
  if (iy1 <= iy0) return false;
  const float inter = (ix1 - ix0) * (iy1 - iy0);
  const float uni = a.area + b.area - inter;
  if (inter <= 0 || a.area <= 0 || b.area <= 0 || uni <= 0) return false;
  return inter / uni > iouThreshold;
}

// A candidate's place in NonMaxSuppression's walk as one number, so the
// CUDA kernel finds the next candidate with one max-reduction: larger scores
// first, then lower box indices (the CPU's stable sort); -0 ties +0. Every
// key is above 0. Boxes per class: below 2^32.
SD_HD uint64_t nmsWalkKey(float score, int64_t box) {
  if (score == 0.0f) score = 0.0f;
  uint32_t bits;
  memcpy(&bits, &score, sizeof bits);
  bits = bits & 0x80000000u ? ~bits : bits | 0x80000000u; // order-preserving as unsigned
  return (uint64_t(bits) << 32) | uint64_t(0xffffffffu - uint32_t(box));
}
SD_HD int64_t nmsWalkBox(uint64_t key) { return int64_t(0xffffffffu - uint32_t(key & 0xffffffffu)); }

} // namespace sd::math
