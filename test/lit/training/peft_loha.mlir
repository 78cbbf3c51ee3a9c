// RUN: sd-opt %s --sd-peft-loha="target-modules=a r=2 alpha=4" --sd-autodiff | FileCheck %s

// LoHa: y = x Wᵀ + b + x ΔWᵀ, ΔW = (w1_a w1_b) ⊙ (w2_a w2_b) · alpha / r
// rebuilt each step; the four factors train (w2_b starts at zero, so the
// layer starts as it was), W and b stay frozen.
// CHECK-DAG:   sd.global @a.weight "frozen"
// CHECK-DAG:   sd.global @a.hada_w1_a "trainable" : tensor<3x2xf32> = dense_resource
// CHECK-DAG:   sd.global @a.hada_w1_b "trainable" : tensor<2x4xf32> = dense_resource
// CHECK-DAG:   sd.global @a.hada_w2_a "trainable" : tensor<3x2xf32> = dense_resource
// CHECK-DAG:   sd.global @a.hada_w2_b "trainable" : tensor<2x4xf32>{{$}}
// CHECK-DAG:   sd.global @"grad/a.hada_w1_a" "gradient" : tensor<3x2xf32>
// CHECK-DAG:   sd.global @"grad/a.hada_w2_b" "gradient" : tensor<2x4xf32>
// CHECK-LABEL: func.func @eval_step
// CHECK:       %[[Y:.*]] = sd.linear %arg0, %{{.*}}, %{{.*}} {layout = "oi", module = "a"}
// CHECK:       %[[P1:.*]] = sd.linear %{{.*}}, %{{.*}}, %{{.*}} {layout = "io", module = "a.hada_w1"} : (tensor<3x2xf32>, tensor<2x4xf32>, none) -> tensor<3x4xf32>
// CHECK:       %[[P2:.*]] = sd.linear %{{.*}}, %{{.*}}, %{{.*}} {layout = "io", module = "a.hada_w2"}
// CHECK:       %[[H:.*]] = sd.mul %[[P1]], %[[P2]]
// CHECK:       %[[S:.*]] = sd.constant dense<2.000000e+00>
// CHECK:       %[[D:.*]] = sd.mul %[[H]], %[[S]]
// CHECK:       %[[UP:.*]] = sd.linear %arg0, %[[D]], %{{.*}} {layout = "oi", module = "a.hada"}
// CHECK:       %[[OUT:.*]] = sd.add %[[Y]], %[[UP]]
// CHECK:       sd.reduce_sum %[[OUT]]
module {
  sd.global @a.weight "trainable" : tensor<3x4xf32>
  sd.global @a.bias "trainable" : tensor<3xf32>
  func.func @eval_step(%x: tensor<5x4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %w = sd.global_load @a.weight : tensor<3x4xf32>
    %b = sd.global_load @a.bias : tensor<3xf32>
    %y = sd.linear %x, %w, %b {layout = "oi", module = "a"} : (tensor<5x4xf32>, tensor<3x4xf32>, tensor<3xf32>) -> tensor<5x3xf32>
    %axes = sd.constant dense<[0, 1]> : tensor<2xi64>
    %l = sd.reduce_sum %y, %axes {keepdims = 0 : i64} : (tensor<5x3xf32>, tensor<2xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}
