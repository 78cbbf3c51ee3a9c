// RUN: sd-opt %s --split-input-file --sd-form-linear | FileCheck %s

// MatMul against a weight global plus a bias add fold into one linear; the
// module name is the initializer's name without ".weight".
// CHECK-LABEL: func.func @matmul_bias_becomes_linear
//       CHECK:   %[[W:.*]] = sd.global_load @fc.weight
//       CHECK:   %[[B:.*]] = sd.global_load @fc.bias
//       CHECK:   sd.linear %{{.*}}, %[[W]], %[[B]] {layout = "io", module = "fc"{{.*}}}
//   CHECK-NOT:   sd.matmul
//   CHECK-NOT:   sd.add
sd.global @fc.weight "frozen" : tensor<4x3xf32> = dense<1.0> : tensor<4x3xf32>
sd.global @fc.bias "frozen" : tensor<3xf32> = dense<0.5> : tensor<3xf32>
func.func @matmul_bias_becomes_linear(%x: tensor<2x4xf32>) -> tensor<2x3xf32> {
  %w = sd.global_load @fc.weight : tensor<4x3xf32>
  %b = sd.global_load @fc.bias : tensor<3xf32>
  %h = sd.matmul %x, %w : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %y = sd.add %h, %b : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}

// -----

// A transposed weight gives the "oi" layout and no transpose.
// CHECK-LABEL: func.func @transposed_weight_is_oi
//       CHECK:   sd.linear {{.*}} {layout = "oi", module = "head"{{.*}}}
//   CHECK-NOT:   sd.transpose
sd.global @head.weight "frozen" : tensor<5x4xf32> = dense<1.0> : tensor<5x4xf32>
func.func @transposed_weight_is_oi(%x: tensor<3x4xf32>) -> tensor<3x5xf32> {
  %w = sd.global_load @head.weight : tensor<5x4xf32>
  %t = sd.transpose %w {perm = array<i64: 1, 0>} : (tensor<5x4xf32>) -> tensor<4x5xf32>
  %y = sd.matmul %x, %t : (tensor<3x4xf32>, tensor<4x5xf32>) -> tensor<3x5xf32>
  return %y : tensor<3x5xf32>
}

// -----

// Gemm with transB (nn.Linear on 2-D input) is an "oi" linear with its bias.
// CHECK-LABEL: func.func @gemm_transb_is_oi_linear
//       CHECK:   sd.linear {{.*}} {layout = "oi", module = "proj"{{.*}}}
sd.global @proj.weight "frozen" : tensor<3x4xf32> = dense<1.0> : tensor<3x4xf32>
sd.global @proj.bias "frozen" : tensor<3xf32> = dense<1.0> : tensor<3xf32>
func.func @gemm_transb_is_oi_linear(%x: tensor<2x4xf32>) -> tensor<2x3xf32> {
  %w = sd.global_load @proj.weight : tensor<3x4xf32>
  %b = sd.global_load @proj.bias : tensor<3xf32>
  %y = sd.gemm %x, %w, %b {transB = 1 : i64} : (tensor<2x4xf32>, tensor<3x4xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}

// -----

// Two activations multiplied together are not a linear layer.
// CHECK-LABEL: func.func @negative_activation_matmul_unchanged
//       CHECK:   sd.matmul
//   CHECK-NOT:   sd.linear
func.func @negative_activation_matmul_unchanged(%a: tensor<2x4xf32>, %b: tensor<4x3xf32>) -> tensor<2x3xf32> {
  %y = sd.matmul %a, %b : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}

// -----

// Gemm with alpha != 1 keeps its own semantics.
// CHECK-LABEL: func.func @negative_scaled_gemm_unchanged
//       CHECK:   sd.gemm
sd.global @g.weight "frozen" : tensor<4x3xf32> = dense<1.0> : tensor<4x3xf32>
func.func @negative_scaled_gemm_unchanged(%x: tensor<2x4xf32>) -> tensor<2x3xf32> {
  %w = sd.global_load @g.weight : tensor<4x3xf32>
  %n = sd.none
  %y = sd.gemm %x, %w, %n {alpha = 2.0 : f32} : (tensor<2x4xf32>, tensor<4x3xf32>, none) -> tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}

// -----

// PyTorch's eval-mode exporter reads deduplicated initializers (equal zero
// biases, tied weights) through Identity nodes: they do not hide the linear.
// CHECK-LABEL: func.func @identity_read_weight_and_bias
//       CHECK:   %[[W:.*]] = sd.global_load @blocks.1.fc.weight
//       CHECK:   %[[B:.*]] = sd.global_load @blocks.0.fc.bias
//       CHECK:   sd.linear %{{.*}}, %[[W]], %[[B]] {layout = "io", module = "blocks.1.fc"{{.*}}}
//   CHECK-NOT:   sd.gemm
sd.global @blocks.1.fc.weight "frozen" : tensor<4x3xf32> = dense<1.0> : tensor<4x3xf32>
sd.global @blocks.0.fc.bias "frozen" : tensor<3xf32> = dense<0.0> : tensor<3xf32>
func.func @identity_read_weight_and_bias(%x: tensor<2x4xf32>) -> tensor<2x3xf32> {
  %w = sd.global_load @blocks.1.fc.weight : tensor<4x3xf32>
  %b = sd.global_load @blocks.0.fc.bias : tensor<3xf32>
  %wi = sd.identity %w : (tensor<4x3xf32>) -> tensor<4x3xf32>
  %bi = sd.identity %b : (tensor<3xf32>) -> tensor<3xf32>
  %y = sd.gemm %x, %wi, %bi : (tensor<2x4xf32>, tensor<4x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}
