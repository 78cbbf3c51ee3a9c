// RUN: sd-opt %s --sd-bufferize --sd-liveness | FileCheck %s

// sd-bounded-extents' records become counted output bindings: the count
// result is no output of its own, and its buffer lives to the end like the
// outputs it counts.
// CHECK-LABEL: func.func @infer()
//       CHECK:   %[[C:.*]] = sd.buffer {live = array<i64: 0, 1>} : memref<i64>
//       CHECK:   sd.step "NonMaxSuppression"
//       CHECK:   sd.output "selected", %{{.*}} counted by %[[C]] : memref<i64> {extent_axis = 0 : i64} : memref<4x3xi64>
//   CHECK-NOT:   sd.output
func.func @infer(%boxes: tensor<1x4x4xf32> {sd.name = "boxes"}, %scores: tensor<1x1x4xf32> {sd.name = "scores"})
    -> (tensor<4x3xi64>, tensor<i64>)
    attributes {sd.entry = "infer", sd.output_names = ["selected"], sd.output_extents = [array<i64: 0, 1, 0>]} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none
      : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  return %sel, %count : tensor<4x3xi64>, tensor<i64>
}
