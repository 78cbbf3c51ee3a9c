// RUN: sd-opt %s --split-input-file --sd-fuse-rmsnorm --sd-propagate-shapes | FileCheck %s

// Hugging Face's LlamaRMSNorm as torch.onnx.export writes it: an identity
// Cast, Pow 2, ReduceMean over the last axis, Add eps, Sqrt, Div(1, s), Mul
// by x, an identity Cast, then Mul by the weight.
// CHECK-LABEL: func.func @llama_rmsnorm
//       CHECK:   %[[Y:.*]] = sd.rms_normalization %arg0, %arg1 {axis = -1 : i64, epsilon = 9.99999997E-7 : f32}
//   CHECK-NOT:   sd.sqrt
//   CHECK-NOT:   sd.pow
//       CHECK:   return %[[Y]]
func.func @llama_rmsnorm(%h: tensor<2x8xf32>, %w: tensor<8xf32>) -> tensor<2x8xf32> {
  %two = sd.constant dense<2.0> : tensor<f32>
  %eps = sd.constant dense<1.0e-6> : tensor<f32>
  %one = sd.constant dense<1.0> : tensor<f32>
  %axes = sd.constant dense<[-1]> : tensor<1xi64>
  %x = sd.cast %h {to = 1 : i64} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %p = sd.pow %x, %two : (tensor<2x8xf32>, tensor<f32>) -> tensor<2x8xf32>
  %m = sd.reduce_mean %p, %axes {keepdims = 1 : i64} : (tensor<2x8xf32>, tensor<1xi64>) -> tensor<2x1xf32>
  %a = sd.add %m, %eps : (tensor<2x1xf32>, tensor<f32>) -> tensor<2x1xf32>
  %s = sd.sqrt %a : (tensor<2x1xf32>) -> tensor<2x1xf32>
  %r = sd.div %one, %s : (tensor<f32>, tensor<2x1xf32>) -> tensor<2x1xf32>
  %n = sd.mul %x, %r : (tensor<2x8xf32>, tensor<2x1xf32>) -> tensor<2x8xf32>
  %c = sd.cast %n {to = 1 : i64} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %y = sd.mul %w, %c : (tensor<8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}

// -----

// x * x, Reciprocal, scale on the right.
// CHECK-LABEL: func.func @reciprocal_form
//       CHECK:   sd.rms_normalization %arg0, %arg1
//   CHECK-NOT:   sd.reciprocal
func.func @reciprocal_form(%x: tensor<4xf32>, %w: tensor<4xf32>) -> tensor<4xf32> {
  %eps = sd.constant dense<1.0e-5> : tensor<f32>
  %axes = sd.constant dense<[-1]> : tensor<1xi64>
  %p = sd.mul %x, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %m = sd.reduce_mean %p, %axes {keepdims = 1 : i64} : (tensor<4xf32>, tensor<1xi64>) -> tensor<1xf32>
  %a = sd.add %m, %eps : (tensor<1xf32>, tensor<f32>) -> tensor<1xf32>
  %s = sd.sqrt %a : (tensor<1xf32>) -> tensor<1xf32>
  %r = sd.reciprocal %s : (tensor<1xf32>) -> tensor<1xf32>
  %n = sd.mul %x, %r : (tensor<4xf32>, tensor<1xf32>) -> tensor<4xf32>
  %y = sd.mul %n, %w : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

// A mean over another axis is not RMSNorm: left alone.
// CHECK-LABEL: func.func @other_axis
//   CHECK-NOT:   sd.rms_normalization
func.func @other_axis(%x: tensor<2x8xf32>, %w: tensor<8xf32>) -> tensor<2x8xf32> {
  %two = sd.constant dense<2.0> : tensor<f32>
  %eps = sd.constant dense<1.0e-6> : tensor<f32>
  %one = sd.constant dense<1.0> : tensor<f32>
  %axes = sd.constant dense<[0]> : tensor<1xi64>
  %p = sd.pow %x, %two : (tensor<2x8xf32>, tensor<f32>) -> tensor<2x8xf32>
  %m = sd.reduce_mean %p, %axes {keepdims = 1 : i64} : (tensor<2x8xf32>, tensor<1xi64>) -> tensor<1x8xf32>
  %a = sd.add %m, %eps : (tensor<1x8xf32>, tensor<f32>) -> tensor<1x8xf32>
  %s = sd.sqrt %a : (tensor<1x8xf32>) -> tensor<1x8xf32>
  %r = sd.div %one, %s : (tensor<f32>, tensor<1x8xf32>) -> tensor<1x8xf32>
  %n = sd.mul %x, %r : (tensor<2x8xf32>, tensor<1x8xf32>) -> tensor<2x8xf32>
  %y = sd.mul %w, %n : (tensor<8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}
