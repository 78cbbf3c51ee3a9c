// RUN: sd-opt %s --split-input-file --sd-fuse-attention | FileCheck %s

// PyTorch's causal self-attention: MatMul, scale, Where(mask, -inf), Softmax, MatMul.
// CHECK-LABEL: func.func @causal
//       CHECK:   %[[A:.*]] = sd.attention %arg0, %arg1, %arg2, %arg3, %{{.*}} {mask_value = 0xFF800000 : f32, scale = 2.500000e-01 : f32}
//  CHECK-SAME:     -> tensor<2x4x8x16xf32>
//   CHECK-NOT:   sd.softmax
//   CHECK-NOT:   sd.matmul
//       CHECK:   return %[[A]]
func.func @causal(%q: tensor<2x4x8x16xf32>, %kt: tensor<2x4x16x8xf32>, %v: tensor<2x4x8x16xf32>, %m: tensor<1x1x8x8xi1>) -> tensor<2x4x8x16xf32> {
  %s = sd.matmul %q, %kt : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x8x8xf32>
  %c = sd.constant dense<0.25> : tensor<f32>
  %t = sd.mul %s, %c : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %ninf = sd.constant dense<0xFF800000> : tensor<f32>
  %u = sd.where %m, %ninf, %t : (tensor<1x1x8x8xi1>, tensor<f32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %p = sd.softmax %u {axis = -1 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %y = sd.matmul %p, %v : (tensor<2x4x8x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x16xf32>
  return %y : tensor<2x4x8x16xf32>
}

// -----

// Hugging Face's orientation, Where(keep, scores, fill): the kernel's mask is Not(keep).
// CHECK-LABEL: func.func @keep_mask
//       CHECK:   %[[M:.*]] = sd.not %arg3
//       CHECK:   sd.attention %arg0, %arg1, %arg2, %[[M]], %{{.*}} {mask_value = -3.40282347E+38 : f32, scale = 1.000000e+00 : f32}
func.func @keep_mask(%q: tensor<2x8x4xf32>, %kt: tensor<2x4x8xf32>, %v: tensor<2x8x4xf32>, %keep: tensor<1x8x8xi1>) -> tensor<2x8x4xf32> {
  %s = sd.matmul %q, %kt : (tensor<2x8x4xf32>, tensor<2x4x8xf32>) -> tensor<2x8x8xf32>
  %min = sd.constant dense<-3.40282347E+38> : tensor<f32>
  %u = sd.where %keep, %s, %min : (tensor<1x8x8xi1>, tensor<2x8x8xf32>, tensor<f32>) -> tensor<2x8x8xf32>
  %p = sd.softmax %u {axis = -1 : i64} : (tensor<2x8x8xf32>) -> tensor<2x8x8xf32>
  %y = sd.matmul %p, %v : (tensor<2x8x8xf32>, tensor<2x8x4xf32>) -> tensor<2x8x4xf32>
  return %y : tensor<2x8x4xf32>
}

// -----

// No mask, the scale as a divisor: Div(s, c).
// CHECK-LABEL: func.func @unmasked_div
//       CHECK:   sd.attention %arg0, %arg1, %arg2, %{{.*}}, %{{.*}} {scale = 5.000000e-01 : f32}
func.func @unmasked_div(%q: tensor<3x8x4xf32>, %kt: tensor<3x4x6xf32>, %v: tensor<3x6x5xf32>) -> tensor<3x8x5xf32> {
  %s = sd.matmul %q, %kt : (tensor<3x8x4xf32>, tensor<3x4x6xf32>) -> tensor<3x8x6xf32>
  %c = sd.constant dense<2.0> : tensor<f32>
  %t = sd.div %s, %c : (tensor<3x8x6xf32>, tensor<f32>) -> tensor<3x8x6xf32>
  %p = sd.softmax %t {axis = 2 : i64} : (tensor<3x8x6xf32>) -> tensor<3x8x6xf32>
  %y = sd.matmul %p, %v : (tensor<3x8x6xf32>, tensor<3x6x5xf32>) -> tensor<3x8x5xf32>
  return %y : tensor<3x8x5xf32>
}

// -----

// The probabilities are also returned: nothing is fused.
// CHECK-LABEL: func.func @weights_returned
//   CHECK-NOT:   sd.attention
//       CHECK:   sd.softmax
func.func @weights_returned(%q: tensor<8x4xf32>, %kt: tensor<4x8xf32>, %v: tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x8xf32>) {
  %s = sd.matmul %q, %kt : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  %p = sd.softmax %s {axis = -1 : i64} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %y = sd.matmul %p, %v : (tensor<8x8xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  return %y, %p : tensor<8x4xf32>, tensor<8x8xf32>
}

// -----

// A softmax over another axis is not attention.
// CHECK-LABEL: func.func @other_axis
//   CHECK-NOT:   sd.attention
func.func @other_axis(%q: tensor<8x4xf32>, %kt: tensor<4x8xf32>, %v: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %s = sd.matmul %q, %kt : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  %p = sd.softmax %s {axis = 0 : i64} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %y = sd.matmul %p, %v : (tensor<8x8xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  return %y : tensor<8x4xf32>
}
