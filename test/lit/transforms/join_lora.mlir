// RUN: sd-opt %s --split-input-file --sd-join-lora | FileCheck %s

// LoRA on q and v of a joined q|k|v (PEFT's default for Llama): one adapter
// on the whole projection. The A's stacked [2 + 2, in]; the block-diagonal
// B: q's B in q's rows and the first two rank columns beside zeros, zero
// rows for k, v's B in v's rows and the last two columns; the scaled
// product added before the Split, whose parts are what the adapters' sums
// were.
// CHECK-LABEL: func.func @q_and_v
//       CHECK:   %[[Y:.*]] = sd.linear %arg0, {{.*}} {layout = "io", module = "q+k+v"}
//       CHECK:   %[[BQ:.*]] = sd.global_load @q.lora_B.weight
//       CHECK:   %[[ZQ:.*]] = sd.expand %{{.*}}, %{{.*}} : (tensor<f32>, tensor<2xi64>) -> tensor<2x2xf32>
//       CHECK:   sd.concat %[[BQ]], %[[ZQ]] {axis = 1 : i64} : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x4xf32>
//       CHECK:   sd.expand %{{.*}}, %{{.*}} : (tensor<f32>, tensor<2xi64>) -> tensor<2x4xf32>
//       CHECK:   %[[ZV:.*]] = sd.expand %{{.*}}, %{{.*}} : (tensor<f32>, tensor<2xi64>) -> tensor<1x2xf32>
//       CHECK:   %[[BV:.*]] = sd.global_load @v.lora_B.weight
//       CHECK:   sd.concat %[[ZV]], %[[BV]] {axis = 1 : i64} : (tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<1x4xf32>
//       CHECK:   %[[A:.*]] = sd.concat %{{.*}}, %{{.*}} {axis = 0 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
//       CHECK:   %[[DOWN:.*]] = sd.linear %arg0, %[[A]], %{{.*}} {layout = "oi", module = "q+k+v.lora_A"} : (tensor<3x4xf32>, tensor<4x4xf32>, none) -> tensor<3x4xf32>
//       CHECK:   %[[B:.*]] = sd.concat {{.*}} {axis = 0 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<1x4xf32>) -> tensor<5x4xf32>
//       CHECK:   %[[UP:.*]] = sd.linear %[[DOWN]], %[[B]], %{{.*}} {layout = "oi", module = "q+k+v.lora_B"} : (tensor<3x4xf32>, tensor<5x4xf32>, none) -> tensor<3x5xf32>
//       CHECK:   %[[SCALED:.*]] = sd.mul %[[UP]], %{{.*}}
//       CHECK:   %[[SUM:.*]] = sd.add %[[Y]], %[[SCALED]]
//       CHECK:   %[[S:.*]]:3 = sd.split %[[SUM]], %{{.*}} {axis = 1 : i64}
//   CHECK-NOT:   sd.linear
//   CHECK-NOT:   sd.add
//   CHECK-NOT:   sd.global_load
//       CHECK:   return %[[S]]#0, %[[S]]#1, %[[S]]#2
module {
  sd.global @w "frozen" : tensor<4x5xf32> = dense<1.0> : tensor<4x5xf32>
  sd.global @q.lora_A.weight "trainable" : tensor<2x4xf32> = dense<0.5> : tensor<2x4xf32>
  sd.global @q.lora_B.weight "trainable" : tensor<2x2xf32> = dense<0.0> : tensor<2x2xf32>
  sd.global @v.lora_A.weight "trainable" : tensor<2x4xf32> = dense<0.5> : tensor<2x4xf32>
  sd.global @v.lora_B.weight "trainable" : tensor<1x2xf32> = dense<0.0> : tensor<1x2xf32>
  func.func @q_and_v(%x: tensor<3x4xf32>) -> (tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x1xf32>) attributes {sd.entry = "train_step"} {
    %w = sd.global_load @w : tensor<4x5xf32>
    %none = sd.none
    %y = sd.linear %x, %w, %none {layout = "io", module = "q+k+v"} : (tensor<3x4xf32>, tensor<4x5xf32>, none) -> tensor<3x5xf32>
    %sizes = sd.constant dense<[2, 2, 1]> : tensor<3xi64>
    %q, %k, %v = sd.split %y, %sizes {axis = 1 : i64} : (tensor<3x5xf32>, tensor<3xi64>) -> (tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x1xf32>)
    %scale = sd.constant dense<2.0> : tensor<f32>
    %aq = sd.global_load @q.lora_A.weight : tensor<2x4xf32>
    %bq = sd.global_load @q.lora_B.weight : tensor<2x2xf32>
    %dq = sd.linear %x, %aq, %none {layout = "oi", module = "q.lora_A"} : (tensor<3x4xf32>, tensor<2x4xf32>, none) -> tensor<3x2xf32>
    %uq = sd.linear %dq, %bq, %none {layout = "oi", module = "q.lora_B"} : (tensor<3x2xf32>, tensor<2x2xf32>, none) -> tensor<3x2xf32>
    %sq = sd.mul %uq, %scale : (tensor<3x2xf32>, tensor<f32>) -> tensor<3x2xf32>
    %q2 = sd.add %q, %sq : (tensor<3x2xf32>, tensor<3x2xf32>) -> tensor<3x2xf32>
    %av = sd.global_load @v.lora_A.weight : tensor<2x4xf32>
    %bv = sd.global_load @v.lora_B.weight : tensor<1x2xf32>
    %dv = sd.linear %x, %av, %none {layout = "oi", module = "v.lora_A"} : (tensor<3x4xf32>, tensor<2x4xf32>, none) -> tensor<3x2xf32>
    %uv = sd.linear %dv, %bv, %none {layout = "oi", module = "v.lora_B"} : (tensor<3x2xf32>, tensor<1x2xf32>, none) -> tensor<3x1xf32>
    %sv = sd.mul %uv, %scale : (tensor<3x1xf32>, tensor<f32>) -> tensor<3x1xf32>
    %v2 = sd.add %sv, %v : (tensor<3x1xf32>, tensor<3x1xf32>) -> tensor<3x1xf32>
    return %q2, %k, %v2 : tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x1xf32>
  }
}

// -----

// Adapters with different scales (one joined adapter has one scale) stay
// as they are.
// CHECK-LABEL: func.func @kept
//       CHECK:   sd.split %{{.*}}, %{{.*}} {axis = 1 : i64} : (tensor<3x4xf32>
//       CHECK:   module = "q.lora_A"
//       CHECK:   module = "k.lora_A"
module {
  sd.global @w "frozen" : tensor<4x4xf32> = dense<1.0> : tensor<4x4xf32>
  sd.global @q.lora_A.weight "trainable" : tensor<2x4xf32> = dense<0.5> : tensor<2x4xf32>
  sd.global @q.lora_B.weight "trainable" : tensor<2x2xf32> = dense<0.0> : tensor<2x2xf32>
  sd.global @k.lora_A.weight "trainable" : tensor<2x4xf32> = dense<0.5> : tensor<2x4xf32>
  sd.global @k.lora_B.weight "trainable" : tensor<2x2xf32> = dense<0.0> : tensor<2x2xf32>
  func.func @kept(%x: tensor<3x4xf32>) -> (tensor<3x2xf32>, tensor<3x2xf32>) attributes {sd.entry = "train_step"} {
    %w = sd.global_load @w : tensor<4x4xf32>
    %none = sd.none
    %y = sd.linear %x, %w, %none {layout = "io", module = "q+k"} : (tensor<3x4xf32>, tensor<4x4xf32>, none) -> tensor<3x4xf32>
    %sizes = sd.constant dense<[2, 2]> : tensor<2xi64>
    %q, %k = sd.split %y, %sizes {axis = 1 : i64} : (tensor<3x4xf32>, tensor<2xi64>) -> (tensor<3x2xf32>, tensor<3x2xf32>)
    %two = sd.constant dense<2.0> : tensor<f32>
    %four = sd.constant dense<4.0> : tensor<f32>
    %aq = sd.global_load @q.lora_A.weight : tensor<2x4xf32>
    %bq = sd.global_load @q.lora_B.weight : tensor<2x2xf32>
    %dq = sd.linear %x, %aq, %none {layout = "oi", module = "q.lora_A"} : (tensor<3x4xf32>, tensor<2x4xf32>, none) -> tensor<3x2xf32>
    %uq = sd.linear %dq, %bq, %none {layout = "oi", module = "q.lora_B"} : (tensor<3x2xf32>, tensor<2x2xf32>, none) -> tensor<3x2xf32>
    %sq = sd.mul %uq, %two : (tensor<3x2xf32>, tensor<f32>) -> tensor<3x2xf32>
    %q2 = sd.add %q, %sq : (tensor<3x2xf32>, tensor<3x2xf32>) -> tensor<3x2xf32>
    %ak = sd.global_load @k.lora_A.weight : tensor<2x4xf32>
    %bk = sd.global_load @k.lora_B.weight : tensor<2x2xf32>
    %dk = sd.linear %x, %ak, %none {layout = "oi", module = "k.lora_A"} : (tensor<3x4xf32>, tensor<2x4xf32>, none) -> tensor<3x2xf32>
    %uk = sd.linear %dk, %bk, %none {layout = "oi", module = "k.lora_B"} : (tensor<3x2xf32>, tensor<2x2xf32>, none) -> tensor<3x2xf32>
    %sk = sd.mul %uk, %four : (tensor<3x2xf32>, tensor<f32>) -> tensor<3x2xf32>
    %k2 = sd.add %k, %sk : (tensor<3x2xf32>, tensor<3x2xf32>) -> tensor<3x2xf32>
    return %q2, %k2 : tensor<3x2xf32>, tensor<3x2xf32>
  }
}
