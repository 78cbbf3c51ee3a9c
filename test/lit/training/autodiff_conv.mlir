// RUN: sd-opt %s --sd-autodiff | FileCheck %s

// A frozen conv stem, eval-mode BatchNorm with trainable scale and bias,
// max pooling, a trainable conv and global average pooling. The trainable
// conv gets the only weight-gradient contraction, the stem gets no input
// gradient (one conv_transpose: into the pool), and the BatchNorm running
// statistics, though marked trainable, receive no gradient and are frozen.
// CHECK-DAG: sd.global @bn_mean "frozen"
// CHECK-DAG: sd.global @bn_var "frozen"
// CHECK-DAG: sd.global @"grad/head" "gradient" : tensor<2x4x3x3xf32>
// CHECK-DAG: sd.global @"grad/bn_scale" "gradient" : tensor<4xf32>
// CHECK-DAG: sd.global @"grad/bn_bias" "gradient" : tensor<4xf32>
// CHECK-NOT: grad/stem
// CHECK-NOT: grad/bn_mean
// CHECK-LABEL: func.func @accumulate
// CHECK:       %[[DP:.*]] = sd.average_pool_grad
// CHECK:       %[[DX:.*]] = sd.conv_transpose %[[DP]], {{.*}}output_padding = array<i64: 1, 1>
// CHECK-SAME:  -> tensor<1x4x4x4xf32>
// CHECK:       sd.conv_grad_weight %[[DP]]
// CHECK-SAME:  -> tensor<2x4x3x3xf32>
// CHECK:       sd.max_pool_grad %[[DX]]
// CHECK-NOT:   sd.conv_transpose
// CHECK-NOT:   sd.conv_grad_weight
// CHECK:       sd.global_store %{{.*}}, @tokens_seen
module {
  sd.global @stem "frozen" : tensor<4x1x3x3xf32>
  sd.global @bn_scale "trainable" : tensor<4xf32>
  sd.global @bn_bias "trainable" : tensor<4xf32>
  sd.global @bn_mean "trainable" : tensor<4xf32>
  sd.global @bn_var "trainable" : tensor<4xf32>
  sd.global @head "trainable" : tensor<2x4x3x3xf32>
  func.func @eval_step(%x: tensor<1x1x8x8xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %none = sd.none
    %ws = sd.global_load @stem : tensor<4x1x3x3xf32>
    %c1 = sd.conv %x, %ws, %none {pads = array<i64: 1, 1, 1, 1>} : (tensor<1x1x8x8xf32>, tensor<4x1x3x3xf32>, none) -> tensor<1x4x8x8xf32>
    %s = sd.global_load @bn_scale : tensor<4xf32>
    %b = sd.global_load @bn_bias : tensor<4xf32>
    %m = sd.global_load @bn_mean : tensor<4xf32>
    %v = sd.global_load @bn_var : tensor<4xf32>
    %n = sd.batch_normalization %c1, %s, %b, %m, %v : (tensor<1x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x4x8x8xf32>
    %p = sd.max_pool %n {kernel_shape = array<i64: 2, 2>, strides = array<i64: 2, 2>} : (tensor<1x4x8x8xf32>) -> tensor<1x4x4x4xf32>
    %wh = sd.global_load @head : tensor<2x4x3x3xf32>
    %c2 = sd.conv %p, %wh, %none {strides = array<i64: 2, 2>, pads = array<i64: 1, 1, 1, 1>} : (tensor<1x4x4x4xf32>, tensor<2x4x3x3xf32>, none) -> tensor<1x2x2x2xf32>
    %g = sd.global_average_pool %c2 : (tensor<1x2x2x2xf32>) -> tensor<1x2x1x1xf32>
    %axes = sd.constant dense<[0, 1, 2, 3]> : tensor<4xi64>
    %l = sd.reduce_sum %g, %axes {keepdims = 0 : i64} : (tensor<1x2x1x1xf32>, tensor<4xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}
