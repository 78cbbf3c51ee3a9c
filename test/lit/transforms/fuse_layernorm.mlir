// RUN: sd-opt %s --split-input-file --sd-fuse-layernorm --sd-propagate-shapes | FileCheck %s

// PyTorch's opset-14 export of nn.LayerNorm becomes one sd.layer_normalization.
// CHECK-LABEL: func.func @pytorch_opset14_layernorm
//       CHECK:   %[[LN:.*]] = sd.layer_normalization %arg0, %arg1, %arg2 {axis = -1 : i64, epsilon = 9.99999974E-6 : f32}
//   CHECK-NOT:   sd.reduce_mean
//   CHECK-NOT:   sd.sqrt
//       CHECK:   return %[[LN]]
func.func @pytorch_opset14_layernorm(%x: tensor<2x8xf32>, %w: tensor<8xf32>, %b: tensor<8xf32>) -> tensor<2x8xf32> {
  %ax = sd.constant dense<-1> : tensor<1xi64>
  %m = sd.reduce_mean %x, %ax : (tensor<2x8xf32>, tensor<1xi64>) -> tensor<2x1xf32>
  %d = sd.sub %x, %m : (tensor<2x8xf32>, tensor<2x1xf32>) -> tensor<2x8xf32>
  %two = sd.constant dense<2.0> : tensor<f32>
  %p = sd.pow %d, %two : (tensor<2x8xf32>, tensor<f32>) -> tensor<2x8xf32>
  %v = sd.reduce_mean %p, %ax : (tensor<2x8xf32>, tensor<1xi64>) -> tensor<2x1xf32>
  %eps = sd.constant dense<9.99999974E-6> : tensor<f32>
  %e = sd.add %v, %eps : (tensor<2x1xf32>, tensor<f32>) -> tensor<2x1xf32>
  %s = sd.sqrt %e : (tensor<2x1xf32>) -> tensor<2x1xf32>
  %n = sd.div %d, %s : (tensor<2x8xf32>, tensor<2x1xf32>) -> tensor<2x8xf32>
  %y = sd.mul %n, %w : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  %z = sd.add %y, %b : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  return %z : tensor<2x8xf32>
}

// -----

// Normalizing over another axis is not LayerNorm over the last axis: kept.
// CHECK-LABEL: func.func @first_axis
//   CHECK-NOT:   sd.layer_normalization
//       CHECK:   sd.reduce_mean
func.func @first_axis(%x: tensor<2x8xf32>, %w: tensor<8xf32>) -> tensor<2x8xf32> {
  %ax = sd.constant dense<0> : tensor<1xi64>
  %m = sd.reduce_mean %x, %ax : (tensor<2x8xf32>, tensor<1xi64>) -> tensor<1x8xf32>
  %d = sd.sub %x, %m : (tensor<2x8xf32>, tensor<1x8xf32>) -> tensor<2x8xf32>
  %p = sd.mul %d, %d : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %v = sd.reduce_mean %p, %ax : (tensor<2x8xf32>, tensor<1xi64>) -> tensor<1x8xf32>
  %eps = sd.constant dense<1.0E-5> : tensor<f32>
  %e = sd.add %v, %eps : (tensor<1x8xf32>, tensor<f32>) -> tensor<1x8xf32>
  %s = sd.sqrt %e : (tensor<1x8xf32>) -> tensor<1x8xf32>
  %n = sd.div %d, %s : (tensor<2x8xf32>, tensor<1x8xf32>) -> tensor<2x8xf32>
  %y = sd.mul %n, %w : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}
