// RUN: sd-opt %s --split-input-file --sd-norm-grad-sum | FileCheck %s

// A pre-norm block's backward: the residual gradient %g plus each norm's
// input gradient. Both norm gradients take %g (or the running sum) as their
// accumulate operand and the Adds go; either operand order.
// CHECK-LABEL: func.func @residual_sums
//   CHECK-NOT:   sd.add
//       CHECK:   %[[L:[a-z_0-9]+]], %{{.*}}, %{{.*}} = sd.layer_normalization_grad %arg0, %arg1, %arg2, %arg3 {axis = -1 : i64}
//       CHECK:   %[[R:[a-z_0-9]+]], %{{.*}} = sd.rms_normalization_grad %arg0, %arg1, %arg2, %[[L]] {axis = -1 : i64}
//   CHECK-NOT:   sd.add
//       CHECK:   return %[[R]],
func.func @residual_sums(%dy: tensor<4x8xf32>, %x: tensor<4x8xf32>, %w: tensor<8xf32>, %g: tensor<4x8xf32>)
    -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) attributes {sd.entry = "train_step"} {
  %dl, %dlw, %dlb = sd.layer_normalization_grad %dy, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  %s1 = sd.add %g, %dl : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %dr, %drw = sd.rms_normalization_grad %dy, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>)
  %s2 = sd.add %dr, %s1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %s2, %dlw, %dlb, %drw : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// Kept: dx read elsewhere too; the other summand computed after the norm
// gradient; a bf16 sum; a broadcast summand.
// CHECK-LABEL: func.func @kept
//       CHECK:   sd.layer_normalization_grad %arg0, %arg1, %arg2 {axis = -1 : i64}
//       CHECK:   sd.add
//       CHECK:   sd.rms_normalization_grad %arg0, %arg1, %arg2 {axis = -1 : i64}
//       CHECK:   sd.neg
//       CHECK:   sd.add
//       CHECK:   sd.rms_normalization_grad %arg4, %arg5, %arg6 {axis = -1 : i64}
//       CHECK:   sd.add
//       CHECK:   sd.layer_normalization_grad %arg0, %arg1, %arg2 {axis = -1 : i64}
//       CHECK:   sd.add
func.func @kept(%dy: tensor<4x8xf32>, %x: tensor<4x8xf32>, %w: tensor<8xf32>, %g: tensor<4x8xf32>,
                %hdy: tensor<4x8xbf16>, %hx: tensor<4x8xbf16>, %hw: tensor<8xbf16>, %hg: tensor<4x8xbf16>, %row: tensor<8xf32>)
    -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xbf16>, tensor<4x8xf32>) attributes {sd.entry = "train_step"} {
  %d1, %w1, %b1 = sd.layer_normalization_grad %dy, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  %s1 = sd.add %g, %d1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d2, %w2 = sd.rms_normalization_grad %dy, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>)
  %late = sd.neg %g : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %s2 = sd.add %late, %d2 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d3, %w3 = sd.rms_normalization_grad %hdy, %hx, %hw {axis = -1 : i64} : (tensor<4x8xbf16>, tensor<4x8xbf16>, tensor<8xbf16>) -> (tensor<4x8xbf16>, tensor<8xbf16>)
  %s3 = sd.add %hg, %d3 : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<4x8xbf16>
  %d4, %w4, %b4 = sd.layer_normalization_grad %dy, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  %s4 = sd.add %d4, %row : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  return %s1, %d1, %s2, %s3, %s4 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xbf16>, tensor<4x8xf32>
}

// -----

// dy made by Adds of widened bf16 gradients (LoRA's base and adapter
// products; q, k and v's): the norm gradients read the bf16 summands, left
// to right as the Adds added them (a tree on the right is added last), with
// no accumulate operand (none) or with one.
// CHECK-LABEL: func.func @dy_summands
//   CHECK-NOT:   sd.add
//   CHECK-NOT:   sd.cast
//       CHECK:   %[[NONE:.*]] = sd.none
//       CHECK:   sd.layer_normalization_grad %arg0, %arg4, %arg5, %[[NONE]], %arg1 {axis = -1 : i64}
//       CHECK:   sd.rms_normalization_grad %arg0, %arg4, %arg6, %arg7, %arg1, %arg2, %arg3 {axis = -1 : i64}
//       CHECK:   sd.rms_normalization_grad %arg1, %arg4, %arg6, %{{.*}}, %arg2, %arg0 {axis = -1 : i64}
//   CHECK-NOT:   sd.add
func.func @dy_summands(%a: tensor<4x8xbf16>, %b: tensor<4x8xbf16>, %c: tensor<4x8xbf16>, %d: tensor<4x8xbf16>,
                       %x: tensor<4x8xf32>, %w: tensor<8xf32>, %r: tensor<8xf32>, %g: tensor<4x8xf32>)
    -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) attributes {sd.entry = "train_step"} {
  %wa = sd.cast %a {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %wb = sd.cast %b {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %ab = sd.add %wa, %wb : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d1, %w1, %b1 = sd.layer_normalization_grad %ab, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  %wa2 = sd.cast %a {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %wb2 = sd.cast %b {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %wc = sd.cast %c {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %wd = sd.cast %d {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %s1 = sd.add %wa2, %wb2 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %s2 = sd.add %wc, %s1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %s3 = sd.add %s2, %wd : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d2, %w2 = sd.rms_normalization_grad %s3, %x, %r {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>)
  %acc = sd.add %g, %d2 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %wb3 = sd.cast %b {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %wc3 = sd.cast %c {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %wa3 = sd.cast %a {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %t1 = sd.add %wb3, %wc3 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %t2 = sd.add %wa3, %t1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d3, %w3 = sd.rms_normalization_grad %t2, %x, %r {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>)
  %acc3 = sd.add %d3, %acc : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %d1, %acc3, %acc : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// f32 summands (a plan without autocast) are read as they are.
// CHECK-LABEL: func.func @f32_summands
//       CHECK:   %[[NONE:.*]] = sd.none
//       CHECK:   sd.layer_normalization_grad %arg0, %arg2, %arg3, %[[NONE]], %arg1 {axis = -1 : i64}
//   CHECK-NOT:   sd.add
func.func @f32_summands(%p: tensor<4x8xf32>, %q: tensor<4x8xf32>, %x: tensor<4x8xf32>, %w: tensor<8xf32>)
    -> tensor<4x8xf32> attributes {sd.entry = "train_step"} {
  %pq = sd.add %p, %q : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d1, %w1, %b1 = sd.layer_normalization_grad %pq, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  return %d1 : tensor<4x8xf32>
}

// -----

// Kept: a bf16 and an f32 summand; bf16 and f16 summands; five summands;
// a sum something else reads too. A tree on both sides: the right one is
// one summand.
// CHECK-LABEL: func.func @dy_kept
//   CHECK-COUNT-4:   sd.layer_normalization_grad %{{[a-z0-9_]+}}, %arg4, %arg5 {axis = -1 : i64}
//       CHECK:   %[[R:.*]] = sd.add %arg4, %arg3
//       CHECK:   sd.layer_normalization_grad %arg3, %arg4, %arg5, %{{.*}}, %arg4, %[[R]] {axis = -1 : i64}
func.func @dy_kept(%a: tensor<4x8xbf16>, %b: tensor<4x8xbf16>, %h: tensor<4x8xf16>, %p: tensor<4x8xf32>,
                   %x: tensor<4x8xf32>, %w: tensor<8xf32>)
    -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) attributes {sd.entry = "train_step"} {
  %wa = sd.cast %a {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %mixed = sd.add %wa, %p : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d1, %w1, %b1 = sd.layer_normalization_grad %mixed, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  %wb = sd.cast %b {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %wh = sd.cast %h {to = 1 : i64} : (tensor<4x8xf16>) -> tensor<4x8xf32>
  %halves = sd.add %wb, %wh : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d2, %w2, %b2 = sd.layer_normalization_grad %halves, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  %f1 = sd.add %p, %p : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %f2 = sd.add %f1, %p : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %f3 = sd.add %f2, %p : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %f4 = sd.add %f3, %p : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d3, %w3, %b3 = sd.layer_normalization_grad %f4, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  %shared = sd.add %p, %x : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d4, %w4, %b4 = sd.layer_normalization_grad %shared, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  %l = sd.add %p, %x : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %r = sd.add %x, %p : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %both = sd.add %l, %r : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d5, %w5, %b5 = sd.layer_normalization_grad %both, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  return %d1, %d2, %d3, %d4, %d5, %shared : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// The residual gradient narrowed to bf16 for the products before the norm
// while the next norm gradient reads it in f32: the norm gradient writes the
// bf16 copy itself (narrow_type 16), one result more, and the Casts go. An
// f64 x, or a result nothing narrows, keeps its results.
// CHECK-LABEL: func.func @narrowed_copy
//       CHECK:   %[[DX:[a-z_0-9]+]], %{{.*}}, %{{.*}}, %[[H:[a-z_0-9]+]] = sd.layer_normalization_grad %arg0, %arg1, %arg2, %arg3 {axis = -1 : i64, narrow_type = 16 : i64}
//  CHECK-SAME:   -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<4x8xbf16>)
//   CHECK-NOT:   sd.cast
//       CHECK:   %[[R:[a-z_0-9]+]], %{{.*}} = sd.rms_normalization_grad %arg0, %arg1, %arg2, %[[DX]] {axis = -1 : i64}
//  CHECK-SAME:   -> (tensor<4x8xf32>, tensor<8xf32>)
//       CHECK:   sd.rms_normalization_grad %arg4, %arg5, %arg6 {axis = -1 : i64}
//  CHECK-SAME:   -> (tensor<4x8xf64>, tensor<8xf64>)
//       CHECK:   sd.cast
//       CHECK:   return %[[H]], %[[H]], %[[R]],
func.func @narrowed_copy(%dy: tensor<4x8xf32>, %x: tensor<4x8xf32>, %w: tensor<8xf32>, %g: tensor<4x8xf32>,
                         %ddy: tensor<4x8xf64>, %dx: tensor<4x8xf64>, %dw: tensor<8xf64>)
    -> (tensor<4x8xbf16>, tensor<4x8xbf16>, tensor<4x8xf32>, tensor<4x8xbf16>) attributes {sd.entry = "train_step"} {
  %d1, %w1, %b1 = sd.layer_normalization_grad %dy, %x, %w, %g {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  %h1 = sd.cast %d1 {to = 16 : i64} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %h2 = sd.cast %d1 {to = 16 : i64} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %d2, %w2 = sd.rms_normalization_grad %dy, %x, %w, %d1 {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>)
  %d3, %w3 = sd.rms_normalization_grad %ddy, %dx, %dw {axis = -1 : i64} : (tensor<4x8xf64>, tensor<4x8xf64>, tensor<8xf64>) -> (tensor<4x8xf64>, tensor<8xf64>)
  %h3 = sd.cast %d3 {to = 16 : i64} : (tensor<4x8xf64>) -> tensor<4x8xbf16>
  return %h1, %h2, %d2, %h3 : tensor<4x8xbf16>, tensor<4x8xbf16>, tensor<4x8xf32>, tensor<4x8xbf16>
}

// -----

// One widened value added to itself: two summands, the cast erased once.
// CHECK-LABEL: func.func @same_summand_twice
//   CHECK-NOT:   sd.cast
//       CHECK:   %[[NONE:.*]] = sd.none
//       CHECK:   sd.rms_normalization_grad %arg0, %arg1, %arg2, %[[NONE]], %arg0 {axis = -1 : i64}
func.func @same_summand_twice(%a: tensor<4x8xbf16>, %x: tensor<4x8xf32>, %w: tensor<8xf32>)
    -> tensor<4x8xf32> attributes {sd.entry = "train_step"} {
  %wa = sd.cast %a {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %aa = sd.add %wa, %wa : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d, %dw = sd.rms_normalization_grad %aa, %x, %w {axis = -1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>)
  return %d : tensor<4x8xf32>
}
