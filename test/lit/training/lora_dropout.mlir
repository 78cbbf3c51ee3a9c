// RUN: sd-opt %s --sd-peft-lora="target-modules=a,b r=2 alpha=4 dropout=0.25" --sd-autodiff --sd-training-dropout | FileCheck %s

// LoRA dropout: each adapter reads seeded_dropout(x), one stream per layer,
// keyed by the dropout_rng state. eval_step keeps no dropout; accumulate
// keeps it, its backward is the same dropout (same state value and stream)
// on the gradient (layer a's input x needs none: A's gradient reuses the
// forward mask's output), and the counter advances once, after every read.
// CHECK-DAG:   sd.global @dropout_rng "scalar_state" : tensor<4xi64>
// CHECK-LABEL: func.func @eval_step
// CHECK-NOT:   seeded_dropout
// CHECK-NOT:   dropout_rng
// CHECK-LABEL: func.func @accumulate
// CHECK:       %[[R0:.*]] = sd.global_load @dropout_rng
// CHECK:       sd.seeded_dropout %arg0, %[[R0]] {ratio = 2.500000e-01 : f32, stream = 0 : i64}
// CHECK:       %[[R1:.*]] = sd.global_load @dropout_rng
// CHECK:       %[[D1:.*]] = sd.seeded_dropout %{{.*}}, %[[R1]] {ratio = 2.500000e-01 : f32, stream = 1 : i64}
// CHECK:       sd.gemm %{{.*}}, %[[D1]], %{{.*}} {transA = 1 : i64}
// CHECK:       sd.seeded_dropout %{{.*}}, %[[R1]] {ratio = 2.500000e-01 : f32, stream = 1 : i64}
// CHECK-NOT:   sd.seeded_dropout
// CHECK:       %[[OLD:.*]] = sd.global_load @dropout_rng
// CHECK:       %[[ONE:.*]] = sd.constant dense<[0, 1, 0, 0]> : tensor<4xi64>
// CHECK:       %[[NEXT:.*]] = sd.add %[[OLD]], %[[ONE]]
// CHECK:       sd.global_store %[[NEXT]], @dropout_rng
// CHECK-NEXT:  return
module {
  sd.global @a.weight "frozen" : tensor<4x4xf32>
  sd.global @b.weight "frozen" : tensor<4x4xf32>
  func.func @eval_step(%x: tensor<2x4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %wa = sd.global_load @a.weight : tensor<4x4xf32>
    %wb = sd.global_load @b.weight : tensor<4x4xf32>
    %none = sd.none
    %h = sd.linear %x, %wa, %none {layout = "oi", module = "a"} : (tensor<2x4xf32>, tensor<4x4xf32>, none) -> tensor<2x4xf32>
    %y = sd.linear %h, %wb, %none {layout = "oi", module = "b"} : (tensor<2x4xf32>, tensor<4x4xf32>, none) -> tensor<2x4xf32>
    %axes = sd.constant dense<[0, 1]> : tensor<2xi64>
    %l = sd.reduce_sum %y, %axes {keepdims = 0 : i64} : (tensor<2x4xf32>, tensor<2xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}
