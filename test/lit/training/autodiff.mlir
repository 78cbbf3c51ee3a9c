// RUN: sd-opt %s --sd-autodiff | FileCheck %s

// Only the trainable weight gets a gradient. The frozen first layer is a
// frozen prefix: no input gradient flows into it and it gets no
// weight-gradient GEMM; the trainable layer gets exactly one (dy^T x).
// CHECK-DAG: sd.global @"grad/w_train" "gradient" : tensor<4x4xf32>
// CHECK-DAG: sd.global @tokens_seen "scalar_state" : tensor<f32>
// CHECK-NOT: grad/w_frozen
// CHECK-LABEL: func.func @accumulate
// CHECK:       sd.reduce_sum
// CHECK:       %[[DW:.*]] = sd.gemm %{{.*}}, %{{.*}}, %{{.*}} {transA = 1 : i64}
// CHECK-NOT:   sd.gemm
// CHECK:       %[[OLD:.*]] = sd.global_load @"grad/w_train"
// CHECK:       %[[NEW:.*]] = sd.add %[[OLD]], %[[DW]]
// CHECK:       sd.global_store %[[NEW]], @"grad/w_train"
// CHECK:       sd.global_store %{{.*}}, @tokens_seen
module {
  sd.global @w_frozen "frozen" : tensor<4x4xf32>
  sd.global @w_train "trainable" : tensor<4x4xf32>
  func.func @eval_step(%x: tensor<2x4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %wf = sd.global_load @w_frozen : tensor<4x4xf32>
    %wt = sd.global_load @w_train : tensor<4x4xf32>
    %none = sd.none
    %h = sd.linear %x, %wf, %none {layout = "oi", module = "a"} : (tensor<2x4xf32>, tensor<4x4xf32>, none) -> tensor<2x4xf32>
    %y = sd.linear %h, %wt, %none {layout = "oi", module = "b"} : (tensor<2x4xf32>, tensor<4x4xf32>, none) -> tensor<2x4xf32>
    %axes = sd.constant dense<[0, 1]> : tensor<2xi64>
    %l = sd.reduce_sum %y, %axes {keepdims = 0 : i64} : (tensor<2x4xf32>, tensor<2xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}
