// RUN: sd-opt %s --sd-bounded-extents --split-input-file --verify-diagnostics | FileCheck %s

// NonMaxSuppression fills a prefix of its [bound, 3] result. Column gathers,
// a gather of boxes by the selected indices and elementwise arithmetic pass
// the count on; the entry returns the count as an extra result, and
// sd.output_extents records [result, count result, axis] for each output.
// CHECK-LABEL: func.func @detections
//  CHECK-SAME:   -> (tensor<6x4xf32>, tensor<6xi64>, tensor<i64>)
//  CHECK-SAME:   sd.output_extents = [array<i64: 0, 2, 0>, array<i64: 1, 2, 0>]
//       CHECK:   %[[SEL:.*]], %[[COUNT:.*]] = sd.non_max_suppression
//       CHECK:   return %{{.*}}, %{{.*}}, %[[COUNT]] : tensor<6x4xf32>, tensor<6xi64>, tensor<i64>
func.func @detections(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x2x4xf32>) -> (tensor<6x4xf32>, tensor<6xi64>)
    attributes {sd.entry = "infer", sd.output_names = ["boxes", "classes"]} {
  %max = sd.constant dense<3> : tensor<1xi64>
  %iou = sd.constant dense<0.5> : tensor<1xf32>
  %thr = sd.constant dense<0.1> : tensor<1xf32>
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %iou, %thr
      : (tensor<1x4x4xf32>, tensor<1x2x4xf32>, tensor<1xi64>, tensor<1xf32>, tensor<1xf32>) -> (tensor<6x3xi64>, tensor<i64>)
  %c1 = sd.constant dense<1> : tensor<i64>
  %c2 = sd.constant dense<2> : tensor<i64>
  %cls = sd.gather %sel, %c1 {axis = 1 : i64} : (tensor<6x3xi64>, tensor<i64>) -> tensor<6xi64>
  %idx = sd.gather %sel, %c2 {axis = 1 : i64} : (tensor<6x3xi64>, tensor<i64>) -> tensor<6xi64>
  %shape = sd.constant dense<[4, 4]> : tensor<2xi64>
  %flat = sd.reshape %boxes, %shape : (tensor<1x4x4xf32>, tensor<2xi64>) -> tensor<4x4xf32>
  %picked = sd.gather %flat, %idx {axis = 0 : i64} : (tensor<4x4xf32>, tensor<6xi64>) -> tensor<6x4xf32>
  %half = sd.constant dense<0.5> : tensor<4xf32>
  %scaled = sd.mul %picked, %half : (tensor<6x4xf32>, tensor<4xf32>) -> tensor<6x4xf32>
  return %scaled, %cls : tensor<6x4xf32>, tensor<6xi64>
}

// -----

// A reduction over the counted dim would add up the padding: refused, naming
// both nodes.
func.func @reduction_is_refused(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>) -> tensor<1xi64>
    attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %axes = sd.constant dense<0> : tensor<1xi64>
  // expected-error @+1 {{ReduceSum cannot honour the run-time count of NonMaxSuppression, which fills only part of dim 0 of its result: ReduceSum is not one of the ops that work slice by slice}}
  %s = sd.reduce_sum %sel, %axes {keepdims = 0 : i64} : (tensor<4x3xi64>, tensor<1xi64>) -> tensor<3xi64>
  %c0 = sd.constant dense<0> : tensor<1xi64>
  %r = sd.gather %s, %c0 {axis = 0 : i64} : (tensor<3xi64>, tensor<1xi64>) -> tensor<1xi64>
  return %r : tensor<1xi64>
}

// -----

// Gathering along the counted dim by other indices may read the padding.
func.func @gather_along_counted_dim_is_refused(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>)
    -> tensor<2x3xi64> attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %first = sd.constant dense<[0, 1]> : tensor<2xi64>
  // expected-error @+1 {{it gathers along the counted dim, which may read the padding}}
  %two = sd.gather %sel, %first {axis = 0 : i64} : (tensor<4x3xi64>, tensor<2xi64>) -> tensor<2x3xi64>
  return %two : tensor<2x3xi64>
}

// -----

// A reshape that merges the counted dim with another loses where the count
// applies.
func.func @merging_reshape_is_refused(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>) -> tensor<12xi64>
    attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %shape = sd.constant dense<12> : tensor<1xi64>
  // expected-error @+1 {{the reshape merges or splits the counted dim}}
  %flat = sd.reshape %sel, %shape : (tensor<4x3xi64>, tensor<1xi64>) -> tensor<12xi64>
  return %flat : tensor<12xi64>
}

// -----

// A prefix [:2] of the counted dim keeps min(count, 2) rows: the output's
// count is that minimum.
// CHECK-LABEL: func.func @prefix_of_detections
//       CHECK:   %[[SEL:.*]], %[[COUNT:.*]] = sd.non_max_suppression
//       CHECK:   %[[FIRST:.*]] = sd.slice %[[SEL]]
//       CHECK:   %[[TWO:.*]] = sd.constant dense<2> : tensor<i64>
//       CHECK:   %[[MIN:.*]] = sd.min %[[COUNT]], %[[TWO]]
//       CHECK:   return %[[FIRST]], %[[MIN]] : tensor<2x3xi64>, tensor<i64>
func.func @prefix_of_detections(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>) -> tensor<2x3xi64>
    attributes {sd.entry = "infer", sd.output_names = ["first"]} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %start = sd.constant dense<0> : tensor<1xi64>
  %end = sd.constant dense<2> : tensor<1xi64>
  %first = sd.slice %sel, %start, %end, %none, %none : (tensor<4x3xi64>, tensor<1xi64>, tensor<1xi64>, none, none) -> tensor<2x3xi64>
  return %first : tensor<2x3xi64>
}

// -----

// Any other slice of the counted dim ([1:3] here) may keep padding: refused.
func.func @offset_slice_is_refused(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>) -> tensor<2x3xi64>
    attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %start = sd.constant dense<1> : tensor<1xi64>
  %end = sd.constant dense<3> : tensor<1xi64>
  // expected-error @+1 {{it slices the counted dim other than as a prefix [:k]}}
  %mid = sd.slice %sel, %start, %end, %none, %none : (tensor<4x3xi64>, tensor<1xi64>, tensor<1xi64>, none, none) -> tensor<2x3xi64>
  return %mid : tensor<2x3xi64>
}
