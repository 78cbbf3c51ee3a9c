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
