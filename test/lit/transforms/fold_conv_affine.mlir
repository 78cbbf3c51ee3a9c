// RUN: sd-opt %s --split-input-file --sd-fold-conv-affine --sd-fuse-conv-epilogue --sd-propagate-shapes | FileCheck %s

// PP-LCNet's learnable affine after a Conv (scalar scale, scalar shift), then
// a Relu: the weights and bias are made at compile time (W * 2, B * 2 + 0.5),
// and the Relu joins the convolution.
// CHECK:       sd.global @conv_affine.0.weight "frozen" : tensor<2x1x1x1xf32> = dense_resource
// CHECK:       sd.global @conv_affine.0.bias "frozen" : tensor<2xf32> = dense_resource
// CHECK-LABEL: func.func @scalar_affine
//   CHECK-DAG:   %[[W:.*]] = sd.global_load @conv_affine.0.weight
//   CHECK-DAG:   %[[B:.*]] = sd.global_load @conv_affine.0.bias
//       CHECK:   %[[F:.*]] = sd.fused_conv %arg0, %[[W]], %[[B]], %{{.*}} {activation = "Relu"}
//   CHECK-NOT:   sd.mul
//       CHECK:   return %[[F]]
// The folded values: [1, 3] * 2 = [2, 6]; [0.25, -1] * 2 + 0.5 = [1, -1.5].
// CHECK: conv_affine.0.weight: "0x04000000000000400000C040"
// CHECK: conv_affine.0.bias: "0x040000000000803F0000C0BF"
func.func @scalar_affine(%x: tensor<1x1x4x4xf32>) -> tensor<1x2x4x4xf32> attributes {sd.entry = "infer"} {
  %w = sd.constant dense<[[[[1.0]]], [[[3.0]]]]> : tensor<2x1x1x1xf32>
  %b = sd.constant dense<[0.25, -1.0]> : tensor<2xf32>
  %a = sd.constant dense<2.0> : tensor<1xf32>
  %s = sd.constant dense<0.5> : tensor<1xf32>
  %c = sd.conv %x, %w, %b : (tensor<1x1x4x4xf32>, tensor<2x1x1x1xf32>, tensor<2xf32>) -> tensor<1x2x4x4xf32>
  %m = sd.mul %a, %c : (tensor<1xf32>, tensor<1x2x4x4xf32>) -> tensor<1x2x4x4xf32>
  %t = sd.add %m, %s : (tensor<1x2x4x4xf32>, tensor<1xf32>) -> tensor<1x2x4x4xf32>
  %y = sd.relu %t : (tensor<1x2x4x4xf32>) -> tensor<1x2x4x4xf32>
  return %y : tensor<1x2x4x4xf32>
}

// -----

// A per-channel shift only ([C, 1, 1]), no bias before: B = shift.
// CHECK-LABEL: func.func @channel_shift
//       CHECK:   sd.conv %arg0, %{{.*}}, %{{.*}} :
//   CHECK-NOT:   sd.add
func.func @channel_shift(%x: tensor<1x1x4x4xf32>) -> tensor<1x2x4x4xf32> attributes {sd.entry = "infer"} {
  %n = sd.none
  %w = sd.constant dense<[[[[1.0]]], [[[3.0]]]]> : tensor<2x1x1x1xf32>
  %s = sd.constant dense<[[[0.5]], [[1.5]]]> : tensor<2x1x1xf32>
  %c = sd.conv %x, %w, %n : (tensor<1x1x4x4xf32>, tensor<2x1x1x1xf32>, none) -> tensor<1x2x4x4xf32>
  %y = sd.add %c, %s : (tensor<1x2x4x4xf32>, tensor<2x1x1xf32>) -> tensor<1x2x4x4xf32>
  return %y : tensor<1x2x4x4xf32>
}

// -----

// BatchNormalization with its statistics after a bias-free Conv:
// a = scale / sqrt(var + eps) = [2, 4] / 2 = [1, 2], b = bias - mean * a =
// [0, 1] - [0.5, 1] * [1, 2] = [-0.5, -1]; W [1, 3] becomes [1, 6].
// CHECK-LABEL: func.func @batch_norm
//       CHECK:   sd.conv %arg0, %{{.*}}, %{{.*}} :
//   CHECK-NOT:   sd.batch_normalization
// CHECK: conv_affine.0.weight: "0x040000000000803F0000C040"
// CHECK: conv_affine.0.bias: "0x04000000000000BF000080BF"
func.func @batch_norm(%x: tensor<1x1x4x4xf32>) -> tensor<1x2x4x4xf32> attributes {sd.entry = "infer"} {
  %n = sd.none
  %w = sd.constant dense<[[[[1.0]]], [[[3.0]]]]> : tensor<2x1x1x1xf32>
  %scale = sd.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %bias = sd.constant dense<[0.0, 1.0]> : tensor<2xf32>
  %mean = sd.constant dense<[0.5, 1.0]> : tensor<2xf32>
  %var = sd.constant dense<[3.0, 3.0]> : tensor<2xf32>
  %c = sd.conv %x, %w, %n : (tensor<1x1x4x4xf32>, tensor<2x1x1x1xf32>, none) -> tensor<1x2x4x4xf32>
  %y = sd.batch_normalization %c, %scale, %bias, %mean, %var {epsilon = 1.0 : f32} : (tensor<1x2x4x4xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x2x4x4xf32>
  return %y : tensor<1x2x4x4xf32>
}

// -----

// Not foldable: a scale that varies over the image ([1, 1, 4, 4]), an input
// that is not a constant, and a training entry. Each keeps its multiply.
// CHECK-LABEL: func.func @spatial_scale
//       CHECK:   sd.mul
// CHECK-LABEL: func.func @runtime_scale
//       CHECK:   sd.mul
// CHECK-LABEL: func.func @training
//       CHECK:   sd.mul
func.func @spatial_scale(%x: tensor<1x1x4x4xf32>, %a: tensor<1x1x4x4xf32>) -> tensor<1x2x4x4xf32> attributes {sd.entry = "infer"} {
  %n = sd.none
  %w = sd.constant dense<[[[[1.0]]], [[[3.0]]]]> : tensor<2x1x1x1xf32>
  %c = sd.conv %x, %w, %n : (tensor<1x1x4x4xf32>, tensor<2x1x1x1xf32>, none) -> tensor<1x2x4x4xf32>
  %y = sd.mul %c, %a : (tensor<1x2x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x2x4x4xf32>
  return %y : tensor<1x2x4x4xf32>
}
func.func @runtime_scale(%x: tensor<1x1x4x4xf32>, %a: tensor<1xf32>) -> tensor<1x2x4x4xf32> attributes {sd.entry = "infer"} {
  %n = sd.none
  %w = sd.constant dense<[[[[1.0]]], [[[3.0]]]]> : tensor<2x1x1x1xf32>
  %c = sd.conv %x, %w, %n : (tensor<1x1x4x4xf32>, tensor<2x1x1x1xf32>, none) -> tensor<1x2x4x4xf32>
  %y = sd.mul %c, %a : (tensor<1x2x4x4xf32>, tensor<1xf32>) -> tensor<1x2x4x4xf32>
  return %y : tensor<1x2x4x4xf32>
}
func.func @training(%x: tensor<1x1x4x4xf32>) -> tensor<1x2x4x4xf32> attributes {sd.entry = "eval_step"} {
  %n = sd.none
  %w = sd.constant dense<[[[[1.0]]], [[[3.0]]]]> : tensor<2x1x1x1xf32>
  %a = sd.constant dense<2.0> : tensor<1xf32>
  %c = sd.conv %x, %w, %n : (tensor<1x1x4x4xf32>, tensor<2x1x1x1xf32>, none) -> tensor<1x2x4x4xf32>
  %y = sd.mul %c, %a : (tensor<1x2x4x4xf32>, tensor<1xf32>) -> tensor<1x2x4x4xf32>
  return %y : tensor<1x2x4x4xf32>
}
