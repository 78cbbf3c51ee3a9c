// RUN: sd-opt %s --sd-peft-lora="target-modules=a r=1 alpha=2 dora=true" | FileCheck %s
// RUN: sd-opt %s --sd-peft-lora="target-modules=a r=1 alpha=2 dora=true dropout=0.5" | FileCheck %s --check-prefix=DROP
// RUN: sd-opt %s --sd-peft-lora="target-modules=a r=1 alpha=2 dora=true" --sd-autodiff | FileCheck %s --check-prefix=GRAD

// DoRA: y = m / |W + s B A|_row * (x Wᵀ + s x Aᵀ Bᵀ) + b. The magnitude
// starts as W's row norms (5 and 5: f32 0x40A00000); the norm reads A and B
// through detached loads; the layer itself computes x Wᵀ, its bias added
// after the scaling.
// CHECK-DAG:   sd.global @a.lora_magnitude_vector "trainable" : tensor<2xf32>
// CHECK-LABEL: func.func @eval_step
// CHECK:       %[[W:.*]] = sd.global_load @a.weight
// CHECK:       %[[B:.*]] = sd.global_load @a.bias
// CHECK:       %[[NONE:.*]] = sd.none
// CHECK:       %[[Y:.*]] = sd.linear %arg0, %[[W]], %[[NONE]] {layout = "oi", module = "a"}
// CHECK:       %[[UP:.*]] = sd.linear %{{.*}} {layout = "oi", module = "a.lora_B"}
// CHECK:       %[[SUP:.*]] = sd.mul %[[UP]], %{{.*}}
// CHECK:       %[[M:.*]] = sd.global_load @a.lora_magnitude_vector
// CHECK:       %[[DA:.*]] = sd.global_load @a.lora_A.weight {sd.detached}
// CHECK:       %[[DB:.*]] = sd.global_load @a.lora_B.weight {sd.detached}
// CHECK:       %[[BA:.*]] = sd.linear %[[DB]], %[[DA]], %{{.*}} {layout = "io", module = "a.lora_magnitude_vector.delta"}
// CHECK:       %[[SBA:.*]] = sd.mul %[[BA]], %{{.*}}
// CHECK:       %[[FULL:.*]] = sd.add %[[W]], %[[SBA]]
// CHECK:       %[[SQ:.*]] = sd.mul %[[FULL]], %[[FULL]]
// CHECK:       %[[SUM:.*]] = sd.reduce_sum %[[SQ]], %{{.*}} {keepdims = 0 : i64} : (tensor<2x3xf32>, tensor<1xi64>) -> tensor<2xf32>
// CHECK:       %[[NORM:.*]] = sd.sqrt %[[SUM]]
// CHECK:       %[[F:.*]] = sd.div %[[M]], %[[NORM]]
// CHECK:       %[[YS:.*]] = sd.add %[[Y]], %[[SUP]]
// CHECK:       %[[SCALED:.*]] = sd.mul %[[F]], %[[YS]]
// CHECK:       %[[OUT:.*]] = sd.add %[[SCALED]], %[[B]]
// CHECK:       sd.reduce_sum %[[OUT]]
// CHECK:       a.lora_magnitude_vector: "0x040000000000A0400000A040"

// With dropout (PEFT's rule): the layer keeps x and its bias; the
// magnitude's correction and the adapter read the dropped input.
// DROP-LABEL: func.func @eval_step
// DROP:       %[[Y:.*]] = sd.linear %arg0, %[[W:.*]], %[[B:.*]] {layout = "oi", module = "a"}
// DROP:       %[[XD:.*]] = sd.seeded_dropout %arg0
// DROP:       sd.linear %[[XD]], %{{.*}} {layout = "oi", module = "a.lora_A"}
// DROP:       %[[F:.*]] = sd.div
// DROP:       %[[BASE:.*]] = sd.linear %[[XD]], %[[W]], %{{.*}} {layout = "oi", module = "a.lora_magnitude_vector.base"}
// DROP:       %[[FUP:.*]] = sd.mul %[[F]], %{{.*}}
// DROP:       %[[FM1:.*]] = sd.sub %[[F]], %{{.*}}
// DROP:       %[[CORR:.*]] = sd.mul %[[FM1]], %[[BASE]]
// DROP:       %[[D:.*]] = sd.add %[[CORR]], %[[FUP]]
// DROP:       %[[OUT:.*]] = sd.add %[[Y]], %[[D]]
// DROP:       sd.reduce_sum %[[OUT]]

// The magnitude, A and B all get gradients (A and B through the adapter only).
// GRAD-DAG:   sd.global @"grad/a.lora_magnitude_vector" "gradient" : tensor<2xf32>
// GRAD-DAG:   sd.global @"grad/a.lora_A.weight" "gradient" : tensor<1x3xf32>
// GRAD-DAG:   sd.global @"grad/a.lora_B.weight" "gradient" : tensor<2x1xf32>
module {
  sd.global @a.weight "frozen" : tensor<2x3xf32> = dense<[[3.0, 4.0, 0.0], [0.0, 0.0, 5.0]]> : tensor<2x3xf32>
  sd.global @a.bias "frozen" : tensor<2xf32> = dense<[0.5, -0.5]> : tensor<2xf32>
  func.func @eval_step(%x: tensor<4x3xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %w = sd.global_load @a.weight : tensor<2x3xf32>
    %b = sd.global_load @a.bias : tensor<2xf32>
    %y = sd.linear %x, %w, %b {layout = "oi", module = "a"} : (tensor<4x3xf32>, tensor<2x3xf32>, tensor<2xf32>) -> tensor<4x2xf32>
    %axes = sd.constant dense<[0, 1]> : tensor<2xi64>
    %l = sd.reduce_sum %y, %axes {keepdims = 0 : i64} : (tensor<4x2xf32>, tensor<2xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}
