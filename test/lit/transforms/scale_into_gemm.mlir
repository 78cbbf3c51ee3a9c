// RUN: sd-opt %s --split-input-file --sd-scale-into-gemm --sd-fold-cast-round-trips --sd-propagate-shapes | FileCheck %s

// LoRA's backward: dy * 2 rounded to bf16 for lora_B's two products, beside
// the plain rounding of dy for the base product. The products read the one
// rounding of dy and take the scale as alpha.
// CHECK-LABEL: func.func @lora_backward
//       CHECK:   %[[R:.*]] = sd.cast %arg0 {to = 16 : i64}
//   CHECK-NOT:   sd.cast
//   CHECK-NOT:   sd.mul
//       CHECK:   sd.gemm %[[R]], %arg1, %{{.*}} {alpha = 2.000000e+00 : f32, transB = 0 : i64}
//       CHECK:   sd.gemm %[[R]], %arg2, %{{.*}} {alpha = 2.000000e+00 : f32, transA = 1 : i64}
//       CHECK:   sd.gemm %[[R]], %arg3, %{{.*}} {transB = 0 : i64}
func.func @lora_backward(%dy: tensor<4x8xf32>, %b: tensor<8x2xbf16>, %xa: tensor<4x2xbf16>, %w: tensor<8x3xbf16>)
    -> (tensor<4x2xbf16>, tensor<8x2xbf16>, tensor<4x3xbf16>) attributes {sd.entry = "train_step"} {
  %s = sd.constant dense<2.0> : tensor<f32>
  %m = sd.mul %dy, %s : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %c = sd.cast %m {to = 16 : i64} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %n = sd.none
  %g0 = sd.gemm %c, %b, %n {transB = 0 : i64} : (tensor<4x8xbf16>, tensor<8x2xbf16>, none) -> tensor<4x2xbf16>
  %g1 = sd.gemm %c, %xa, %n {transA = 1 : i64} : (tensor<4x8xbf16>, tensor<4x2xbf16>, none) -> tensor<8x2xbf16>
  %r = sd.cast %dy {to = 16 : i64} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %g2 = sd.gemm %r, %w, %n {transB = 0 : i64} : (tensor<4x8xbf16>, tensor<8x3xbf16>, none) -> tensor<4x3xbf16>
  return %g0, %g1, %g2 : tensor<4x2xbf16>, tensor<8x2xbf16>, tensor<4x3xbf16>
}

// -----

// f32 (no cast), the scale first, through a reshape, into a Gemm that already
// scales (alphas multiply).
// CHECK-LABEL: func.func @f32_through_reshape
//   CHECK-NOT:   sd.mul
//       CHECK:   %[[V:.*]] = sd.reshape %arg0
//       CHECK:   sd.gemm %[[V]], %arg1, %{{.*}} {alpha = 1.000000e+00 : f32}
func.func @f32_through_reshape(%dy: tensor<2x2x8xf32>, %b: tensor<8x2xf32>) -> tensor<4x2xf32>
    attributes {sd.entry = "train_step"} {
  %s = sd.constant dense<0.25> : tensor<f32>
  %m = sd.mul %s, %dy : (tensor<f32>, tensor<2x2x8xf32>) -> tensor<2x2x8xf32>
  %shape = sd.constant dense<[4, 8]> : tensor<2xi64>
  %v = sd.reshape %m, %shape : (tensor<2x2x8xf32>, tensor<2xi64>) -> tensor<4x8xf32>
  %n = sd.none
  %g = sd.gemm %v, %b, %n {alpha = 4.0 : f32} : (tensor<4x8xf32>, tensor<8x2xf32>, none) -> tensor<4x2xf32>
  return %g : tensor<4x2xf32>
}

// -----

// Kept: a scale that is not a power of two, an f16 rounding (its subnormals
// start at 6e-5), a scaled value something besides a Gemm reads, a scale
// that is not a constant.
// CHECK-LABEL: func.func @kept
//   CHECK-COUNT-4:   sd.mul
//   CHECK-NOT:   alpha
func.func @kept(%dy: tensor<4x8xf32>, %b: tensor<8x2xbf16>, %bh: tensor<8x2xf16>, %bf: tensor<8x2xf32>,
                %t: tensor<f32>) -> (tensor<4x2xbf16>, tensor<4x2xf16>, tensor<4x2xf32>, tensor<4x8xf32>, tensor<4x2xf32>)
    attributes {sd.entry = "train_step"} {
  %n = sd.none
  %odd = sd.constant dense<1.5> : tensor<f32>
  %m0 = sd.mul %dy, %odd : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %c0 = sd.cast %m0 {to = 16 : i64} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %g0 = sd.gemm %c0, %b, %n : (tensor<4x8xbf16>, tensor<8x2xbf16>, none) -> tensor<4x2xbf16>
  %two = sd.constant dense<2.0> : tensor<f32>
  %m1 = sd.mul %dy, %two : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %c1 = sd.cast %m1 {to = 10 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf16>
  %g1 = sd.gemm %c1, %bh, %n : (tensor<4x8xf16>, tensor<8x2xf16>, none) -> tensor<4x2xf16>
  %four = sd.constant dense<4.0> : tensor<f32>
  %m2 = sd.mul %dy, %four : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %g2 = sd.gemm %m2, %bf, %n : (tensor<4x8xf32>, tensor<8x2xf32>, none) -> tensor<4x2xf32>
  %m3 = sd.mul %dy, %t : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %g3 = sd.gemm %m3, %bf, %n : (tensor<4x8xf32>, tensor<8x2xf32>, none) -> tensor<4x2xf32>
  return %g0, %g1, %g2, %m2, %g3 : tensor<4x2xbf16>, tensor<4x2xf16>, tensor<4x2xf32>, tensor<4x8xf32>, tensor<4x2xf32>
}
