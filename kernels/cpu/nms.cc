// CPU kernel of NonMaxSuppression, with onnx/reference's semantics: per batch
// and class, candidates above the score threshold in descending score order
// (ties: lower box index first), each kept unless its IoU with a kept box
// exceeds the threshold. Rows go to the plan's bounded result in batch, class,
// rank order; the rest is zero-filled (valid indices for any Gather that
// follows) and the count result says how many rows are real. The box
// geometry is shared with CUDA (sd/ops/math/box_overlap.h).
#include "cpu_util.h"
#include "sd/ops/math/box_overlap.h"
#include <algorithm>
#include <numeric>
#include <vector>

namespace sd::cpu {
namespace {

using math::Corners;
using math::cornersOf;
using math::suppresses;

// A scalar optional operand; an absent or empty one keeps the default.
template <typename T> T scalarOr(const KernelContext &c, size_t i, T dflt) {
  if (!c.hasInput(i) || c.inputs[i].numElements() == 0) return dflt;
  return c.inputs[i].as<T>()[0];
}

Status NonMaxSuppressionKernel(const KernelContext &c) {
  const TensorView &boxes = c.inputs[0], &scores = c.inputs[1];
  const TensorView &selected = c.outputs[0], &count = c.outputs[1];
  int64_t batches = scores.dims[0], classes = scores.dims[1], n = scores.dims[2];
  int64_t perClass = std::max<int64_t>(scalarOr<int64_t>(c, 2, 0), 0);
  float iou = scalarOr<float>(c, 3, 0.f);
  bool hasScoreThreshold = c.hasInput(4) && c.inputs[4].numElements() > 0;
  float scoreThreshold = scalarOr<float>(c, 4, 0.f);
  bool centerPoint = c.attrs.getInt("center_point_box", 0) != 0;
  int64_t capacity = selected.dims[0];
  int64_t *out = selected.as<int64_t>();
  int64_t rows = 0;
  std::vector<Corners> corners(static_cast<size_t>(n));
  std::vector<int64_t> order, kept;
  for (int64_t b = 0; b < batches && perClass > 0; ++b) {
    for (int64_t i = 0; i < n; ++i) corners[size_t(i)] = cornersOf(boxes.as<float>() + (b * n + i) * 4, centerPoint);
    for (int64_t k = 0; k < classes; ++k) {
      const float *s = scores.as<float>() + (b * classes + k) * n;
      order.clear();
      for (int64_t i = 0; i < n; ++i)
        if (!hasScoreThreshold || s[i] > scoreThreshold) order.push_back(i);
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return s[x] > s[y]; });
      kept.clear();
      for (int64_t i : order) {
        if (int64_t(kept.size()) >= perClass) break;
        bool keep = std::none_of(kept.begin(), kept.end(),
                                 [&](int64_t j) { return suppresses(corners[size_t(i)], corners[size_t(j)], iou); });
        if (!keep) continue;
        if (rows >= capacity)
          return sdError("NonMaxSuppression selects more than the ", capacity,
                         " boxes the plan holds (max_output_boxes_per_class changed after compilation?)");
        kept.push_back(i);
        out[rows * 3] = b, out[rows * 3 + 1] = k, out[rows * 3 + 2] = i;
        ++rows;
      }
    }
  }
  std::fill(out + rows * 3, out + capacity * 3, int64_t(0));
  count.as<int64_t>()[0] = rows;
  return Status::ok();
}

} // namespace

void registerNonMaxSuppressionKernels() {
  registerCpuKernel("NonMaxSuppression", NonMaxSuppressionKernel, {DType::F32});
}

} // namespace sd::cpu
