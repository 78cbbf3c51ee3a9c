// RUN: sd-opt %s --sd-peft-lokr="target-modules=a r=1 alpha=4" --sd-autodiff | FileCheck %s
// RUN: sd-opt %s --sd-peft-lokr="target-modules=a r=1 alpha=4 decompose-both=true decompose-factor=3" | FileCheck %s --check-prefix=BOTH

// LoKr: y = x Wᵀ + b + x ΔWᵀ, ΔW = kron(W1, W2) · alpha / r rebuilt each
// step. out 6 = 2·3 and in 4 = 2·2 (PEFT's factorization near the square
// root): W1 [2, 2] starts at zero, so the layer starts as it was; with r = 1
// below max(3, 2)/2, W2 [3, 2] is the product w2_a [3, 1] w2_b [1, 2]. All
// factors train, W and b stay frozen.
// CHECK:       sd.peft = {alpha = 4.000000e+00 : f64, decompose_both = false, decompose_factor = -1 : i64, factors = ["lokr_w1,lokr_w2_a,lokr_w2_b"], modules = ["a"], peft_type = "LOKR", r = 1 : i64
// CHECK-DAG:   sd.global @a.weight "frozen"
// CHECK-DAG:   sd.global @a.lokr_w1 "trainable" : tensor<2x2xf32>{{$}}
// CHECK-DAG:   sd.global @a.lokr_w2_a "trainable" : tensor<3x1xf32> = dense_resource
// CHECK-DAG:   sd.global @a.lokr_w2_b "trainable" : tensor<1x2xf32> = dense_resource
// CHECK-DAG:   sd.global @"grad/a.lokr_w1" "gradient" : tensor<2x2xf32>
// CHECK-DAG:   sd.global @"grad/a.lokr_w2_b" "gradient" : tensor<1x2xf32>
// CHECK-LABEL: func.func @eval_step
// CHECK:       %[[Y:.*]] = sd.linear %arg0, %{{.*}}, %{{.*}} {layout = "oi", module = "a"}
// CHECK:       %[[W2:.*]] = sd.linear %{{.*}}, %{{.*}}, %{{.*}} {layout = "io", module = "a.lokr_w2"} : (tensor<3x1xf32>, tensor<1x2xf32>, none) -> tensor<3x2xf32>
// CHECK:       %[[B:.*]] = sd.reshape %[[W2]], %{{.*}} : (tensor<3x2xf32>, tensor<4xi64>) -> tensor<1x3x1x2xf32>
// CHECK:       %[[A:.*]] = sd.reshape %{{.*}}, %{{.*}} : (tensor<2x2xf32>, tensor<4xi64>) -> tensor<2x1x2x1xf32>
// CHECK:       %[[K:.*]] = sd.mul %[[A]], %[[B]] {{.*}} -> tensor<2x3x2x2xf32>
// CHECK:       %[[D:.*]] = sd.reshape %[[K]], %{{.*}} -> tensor<6x4xf32>
// CHECK:       %[[S:.*]] = sd.constant dense<4.000000e+00>
// CHECK:       %[[DS:.*]] = sd.mul %[[D]], %[[S]]
// CHECK:       %[[UP:.*]] = sd.linear %arg0, %[[DS]], %{{.*}} {layout = "oi", module = "a.lokr"}
// CHECK:       %[[OUT:.*]] = sd.add %[[Y]], %[[UP]]
// CHECK:       sd.reduce_sum %[[OUT]]

// decompose-factor 3 splits out 6 as 3 x 2 (factor first, as PEFT); in 4,
// which 3 does not divide, near its square root, 2 x 2. decompose-both and
// r = 1 below max(3, 2)/2 make W1 [3, 2] a product too: w1_a starts at zero.
// BOTH:        factors = ["lokr_w1_a,lokr_w1_b,lokr_w2"]
// BOTH-DAG:    sd.global @a.lokr_w1_a "trainable" : tensor<3x1xf32>{{$}}
// BOTH-DAG:    sd.global @a.lokr_w1_b "trainable" : tensor<1x2xf32> = dense_resource
// BOTH-DAG:    sd.global @a.lokr_w2 "trainable" : tensor<2x2xf32> = dense_resource
// Here in·b + out·c = 20 < in·out = 24, so the layer applies the product
// factored, never building ΔW: x as [5, c=2, d=2] times W2ᵀ, c and b
// swapped, times (alpha/r) W1ᵀ, back to [5, a·b = 6].
// BOTH-LABEL:  func.func @eval_step
// BOTH:        %[[W1:.*]] = sd.linear %{{.*}}, %{{.*}}, %{{.*}} {layout = "io", module = "a.lokr_w1"} : (tensor<3x1xf32>, tensor<1x2xf32>, none) -> tensor<3x2xf32>
// BOTH:        %[[X:.*]] = sd.reshape %arg0, %{{.*}} -> tensor<5x2x2xf32>
// BOTH:        %[[XW2:.*]] = sd.linear %[[X]], %{{.*}}, %{{.*}} {layout = "oi", module = "a.lokr_x2"}
// BOTH:        %[[S:.*]] = sd.mul %[[W1]], %{{.*}}
// BOTH:        %[[T:.*]] = sd.transpose %[[XW2]] {perm = array<i64: 0, 2, 1>}
// BOTH:        %[[Y:.*]] = sd.linear %[[T]], %[[S]], %{{.*}} {layout = "oi", module = "a.lokr_x1"} {{.*}} -> tensor<5x2x3xf32>
// BOTH:        %[[B:.*]] = sd.transpose %[[Y]] {perm = array<i64: 0, 2, 1>} : (tensor<5x2x3xf32>) -> tensor<5x3x2xf32>
// BOTH:        %[[U:.*]] = sd.reshape %[[B]], %{{.*}} -> tensor<5x6xf32>
// BOTH:        sd.add %{{.*}}, %[[U]]
// BOTH-NOT:    sd.linear {{.*}} module = "a.lokr"}
module {
  sd.global @a.weight "trainable" : tensor<6x4xf32>
  sd.global @a.bias "trainable" : tensor<6xf32>
  func.func @eval_step(%x: tensor<5x4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %w = sd.global_load @a.weight : tensor<6x4xf32>
    %b = sd.global_load @a.bias : tensor<6xf32>
    %y = sd.linear %x, %w, %b {layout = "oi", module = "a"} : (tensor<5x4xf32>, tensor<6x4xf32>, tensor<6xf32>) -> tensor<5x6xf32>
    %axes = sd.constant dense<[0, 1]> : tensor<2xi64>
    %l = sd.reduce_sum %y, %axes {keepdims = 0 : i64} : (tensor<5x6xf32>, tensor<2xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}
