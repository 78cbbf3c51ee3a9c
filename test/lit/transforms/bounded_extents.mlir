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

// A reduction over the counted dim sees the padding replaced by its neutral
// element first: zeros for a sum (the selected rows' index < count). The sum
// is then no longer counted.
// CHECK-LABEL: func.func @sum_over_counted_dim
//       CHECK:   %[[SEL:.*]], %[[COUNT:.*]] = sd.non_max_suppression
//       CHECK:   %[[INDEX:.*]] = sd.constant dense<{{\[\[}}0], [1], [2], [3]]> : tensor<4x1xi64>
//       CHECK:   %[[KEPT:.*]] = sd.less %[[INDEX]], %[[COUNT]] : (tensor<4x1xi64>, tensor<i64>) -> tensor<4x1xi1>
//       CHECK:   %[[ZERO:.*]] = sd.constant dense<0> : tensor<i64>
//       CHECK:   %[[MASKED:.*]] = sd.where %[[KEPT]], %[[SEL]], %[[ZERO]]
//       CHECK:   sd.reduce_sum %[[MASKED]]
//   CHECK-NOT:   sd.output_extents
func.func @sum_over_counted_dim(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>) -> tensor<3xi64>
    attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %axes = sd.constant dense<0> : tensor<1xi64>
  %s = sd.reduce_sum %sel, %axes {keepdims = 0 : i64} : (tensor<4x3xi64>, tensor<1xi64>) -> tensor<3xi64>
  return %s : tensor<3xi64>
}

// -----

// A mean over the counted dim (and another) is the masked sum over count
// times the other reduced dims, as ONNX Runtime divides.
// CHECK-LABEL: func.func @mean_over_counted_dim
//       CHECK:   %[[SEL:.*]], %[[COUNT:.*]] = sd.non_max_suppression
//       CHECK:   %[[MASKED:.*]] = sd.where
//       CHECK:   %[[SUM:.*]] = sd.reduce_sum %[[MASKED]], %{{.*}} {keepdims = 0 : i64}
//       CHECK:   %[[THREE:.*]] = sd.constant dense<3> : tensor<i64>
//       CHECK:   %[[N:.*]] = sd.mul %[[COUNT]], %[[THREE]]
//       CHECK:   %[[NF:.*]] = sd.cast %[[N]] {to = 1 : i64} : (tensor<i64>) -> tensor<f32>
//       CHECK:   %[[MEAN:.*]] = sd.div %[[SUM]], %[[NF]]
//       CHECK:   return %[[MEAN]] : tensor<f32>
//   CHECK-NOT:   sd.reduce_mean
func.func @mean_over_counted_dim(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>) -> tensor<f32>
    attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %f = sd.cast %sel {to = 1 : i64} : (tensor<4x3xi64>) -> tensor<4x3xf32>
  %m = sd.reduce_mean %f, %none {keepdims = 0 : i64} : (tensor<4x3xf32>, none) -> tensor<f32>
  return %m : tensor<f32>
}

// -----

// A Shape of a counted value is its run-time extents: the count where the
// bound was.
// CHECK-LABEL: func.func @shape_of_counted
//       CHECK:   %[[SEL:.*]], %[[COUNT:.*]] = sd.non_max_suppression
//       CHECK:   %[[ROWS:.*]] = sd.reshape %[[COUNT]], %{{.*}} : (tensor<i64>, tensor<1xi64>) -> tensor<1xi64>
//       CHECK:   %[[COLS:.*]] = sd.constant dense<3> : tensor<1xi64>
//       CHECK:   %[[SHAPE:.*]] = sd.concat %[[ROWS]], %[[COLS]] {axis = 0 : i64}
//       CHECK:   return %[[SHAPE]] : tensor<2xi64>
func.func @shape_of_counted(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>) -> tensor<2xi64>
    attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %shape = sd.shape %sel : (tensor<4x3xi64>) -> tensor<2xi64>
  return %shape : tensor<2xi64>
}

// -----

// Softmax along the counted dim: the padding becomes -inf, which adds
// nothing to the sums; the result stays counted.
// CHECK-LABEL: func.func @softmax_along_counted_dim
//  CHECK-SAME:   sd.output_extents = [array<i64: 0, 1, 0>]
//       CHECK:   %[[NEG:.*]] = sd.constant dense<0xFF800000> : tensor<f32>
//       CHECK:   %[[MASKED:.*]] = sd.where %{{.*}}, %{{.*}}, %[[NEG]]
//       CHECK:   sd.softmax %[[MASKED]] {axis = 0 : i64}
func.func @softmax_along_counted_dim(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>) -> tensor<4x3xf32>
    attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %f = sd.cast %sel {to = 1 : i64} : (tensor<4x3xi64>) -> tensor<4x3xf32>
  %p = sd.softmax %f {axis = 0 : i64} : (tensor<4x3xf32>) -> tensor<4x3xf32>
  return %p : tensor<4x3xf32>
}

// -----

// A product over the rows keeps them counted; contracting the counted dim
// (A^T A) masks it with zeros, and the result is no longer counted.
// CHECK-LABEL: func.func @products
//  CHECK-SAME:   -> (tensor<4x2xf32>, tensor<3x3xf32>, tensor<i64>)
//  CHECK-SAME:   sd.output_extents = [array<i64: 0, 2, 0>]
//       CHECK:   sd.matmul %{{.*}}, %{{.*}} : (tensor<4x3xf32>, tensor<3x2xf32>)
//       CHECK:   %[[MASKED:.*]] = sd.where
//       CHECK:   sd.gemm %[[MASKED]], %[[MASKED]], %{{.*}} {transA = 1 : i64}
func.func @products(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>, %w: tensor<3x2xf32>) -> (tensor<4x2xf32>, tensor<3x3xf32>)
    attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %f = sd.cast %sel {to = 1 : i64} : (tensor<4x3xi64>) -> tensor<4x3xf32>
  %rows = sd.matmul %f, %w : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<4x2xf32>
  %gram = sd.gemm %f, %f, %none {transA = 1 : i64} : (tensor<4x3xf32>, tensor<4x3xf32>, none) -> tensor<3x3xf32>
  return %rows, %gram : tensor<4x2xf32>, tensor<3x3xf32>
}

// -----

// A normalization over the counted dim would mix the padding into its
// statistics: refused, naming both nodes.
func.func @normalization_over_counted_dim_is_refused(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>,
    %scale: tensor<4x3xf32>) -> tensor<4x3xf32> attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %f = sd.cast %sel {to = 1 : i64} : (tensor<4x3xi64>) -> tensor<4x3xf32>
  // expected-error @+1 {{LayerNormalization cannot honour the run-time count of NonMaxSuppression, which fills only part of dim 0 of its result: it normalizes over the counted dim}}
  %y = sd.layer_normalization %f, %scale, %none {axis = 0 : i64} : (tensor<4x3xf32>, tensor<4x3xf32>, none) -> tensor<4x3xf32>
  return %y : tensor<4x3xf32>
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

// A reshape that merges the counted dim with the dims after it keeps the
// real elements a prefix: the count grows by their size.
// CHECK-LABEL: func.func @merging_reshape
//       CHECK:   %[[SEL:.*]], %[[COUNT:.*]] = sd.non_max_suppression
//       CHECK:   %[[FLAT:.*]] = sd.reshape %[[SEL]]
//       CHECK:   %[[THREE:.*]] = sd.constant dense<3> : tensor<i64>
//       CHECK:   %[[N:.*]] = sd.mul %[[COUNT]], %[[THREE]]
//       CHECK:   return %[[FLAT]], %[[N]] : tensor<12xi64>, tensor<i64>
func.func @merging_reshape(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>) -> tensor<12xi64>
    attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %shape = sd.constant dense<12> : tensor<1xi64>
  %flat = sd.reshape %sel, %shape : (tensor<4x3xi64>, tensor<1xi64>) -> tensor<12xi64>
  return %flat : tensor<12xi64>
}

// -----

// A reshape that splits the counted dim loses where the count applies.
func.func @splitting_reshape_is_refused(%boxes: tensor<1x4x4xf32>, %scores: tensor<1x1x4xf32>) -> tensor<2x6xi64>
    attributes {sd.entry = "infer"} {
  %max = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %sel, %count = sd.non_max_suppression %boxes, %scores, %max, %none, %none : (tensor<1x4x4xf32>, tensor<1x1x4xf32>, tensor<1xi64>, none, none) -> (tensor<4x3xi64>, tensor<i64>)
  %shape = sd.constant dense<[2, 6]> : tensor<2xi64>
  // expected-error @+1 {{the reshape splits the counted dim or merges it with the dims before it}}
  %split = sd.reshape %sel, %shape : (tensor<4x3xi64>, tensor<2xi64>) -> tensor<2x6xi64>
  return %split : tensor<2x6xi64>
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
