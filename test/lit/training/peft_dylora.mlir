// RUN: sd-opt %s --sd-peft-dylora="target-modules=a r=4 alpha=2 block-size=2" --sd-autodiff --sd-dylora-draws --sd-training-dropout --sd-optimizer | FileCheck %s

// DyLoRA: PEFT's LoRA tensors in blocks of 2 ranks, each updated only in
// steps that drew it, with its own step count.
// CHECK-DAG:   sd.global @dylora.eval_blocks "scalar_state" : tensor<f32> = dense_resource
// CHECK-DAG:   sd.global @a.lora_A.weight "trainable" {sd.block_updates = {axis = 0 : i64, drawn = "dylora.drawn/a", size = 2 : i64, steps = "dylora.steps/a"}} : tensor<4x4xf32> = dense_resource
// CHECK-DAG:   sd.global @a.lora_B.weight "trainable" {sd.block_updates = {axis = 1 : i64, drawn = "dylora.drawn/a", size = 2 : i64, steps = "dylora.steps/a"}} : tensor<3x4xf32>{{$}}
// CHECK-DAG:   sd.global @"dylora.drawn/a" "scalar_state" : tensor<2xf32>
// CHECK-DAG:   sd.global @"dylora.steps/a" "optimizer_state" : tensor<2xf32>

// Outside training no draw: the block is eval_blocks - 1.
// CHECK-LABEL: func.func @eval_step
// CHECK-NOT:   sd.seeded_random
// CHECK:       %[[EB:.*]] = sd.global_load @dylora.eval_blocks
// CHECK:       sd.sub %[[EB]]
// CHECK-NOT:   sd.seeded_random
// CHECK:       return

// Training: a draw in [0, 2) from [seed, counter] alone (rng[0:2]); the
// trained block reads A and B, the blocks below it detached copies; the
// output scaled by alpha / (block + 1); the drawn block marked.
// CHECK-LABEL: func.func @accumulate
// CHECK:       %[[RNG:.*]] = sd.global_load @dropout_rng
// CHECK:       %[[SC:.*]] = sd.slice %[[RNG]], {{.*}} -> tensor<2xi64>
// CHECK:       %[[U:.*]] = sd.seeded_random %{{.*}}, %[[SC]] {a = 0.000000e+00 : f32, b = 2.000000e+00 : f32, sd.dylora_drawn = "dylora.drawn/a", stream = 8589934592 : i64}
// CHECK:       %[[B:.*]] = sd.min
// CHECK:       %[[IDS:.*]] = sd.constant dense<[0, 0, 1, 1]> : tensor<4xi64>
// CHECK:       sd.global_load @a.lora_A.weight {sd.detached}
// CHECK:       sd.linear %arg0, %{{.*}}, %{{.*}} {layout = "oi", module = "a.lora_A"}
// CHECK:       %[[ONE:.*]] = sd.add %[[B]], %{{.*}}
// CHECK:       %[[ALPHA:.*]] = sd.constant dense<2.000000e+00>
// CHECK:       sd.div %[[ALPHA]], %[[ONE]]
// CHECK:       sd.floor %[[U]]
// CHECK:       %[[OLD:.*]] = sd.global_load @"dylora.drawn/a"
// CHECK:       %[[MARK:.*]] = sd.max %[[OLD]], %{{.*}}
// CHECK:       sd.global_store %[[MARK]], @"dylora.drawn/a"
// CHECK:       sd.global_store %{{.*}}, @dropout_rng
// CHECK:       return

// The step: block k of A (rows) and B (columns) steps with count k and is
// skipped when not drawn; the counts advance by the flags, which clear.
// CHECK-LABEL: func.func @apply
// CHECK:       %[[FLAGS:.*]] = sd.global_load @"dylora.drawn/a"
// CHECK:       %[[STEPS:.*]] = sd.global_load @"dylora.steps/a"
// CHECK:       %[[COUNTS:.*]] = sd.add %[[STEPS]], %[[FLAGS]]
// CHECK:       sd.global_store %[[COUNTS]], @"dylora.steps/a"
// CHECK:       %[[A0:.*]] = sd.slice %{{.*}} -> tensor<2x4xf32>
// CHECK:       %[[SKIP0:.*]] = sd.equal %{{.*}}, %{{.*}} : (tensor<f32>, tensor<f32>) -> tensor<i1>
// CHECK:       %[[C0:.*]] = sd.slice %[[COUNTS]]
// CHECK:       %[[N0:.*]] = sd.reshape %[[C0]]
// CHECK:       %[[P0:.*]], %{{.*}}, %{{.*}}, %{{.*}} = sd.adamw %[[A0]], %{{.*}}, %{{.*}}, %{{.*}}, %[[N0]], %arg0, %arg1, %{{.*}}, %[[SKIP0]]
// CHECK:       %[[P1:.*]], %{{.*}}, %{{.*}}, %{{.*}} = sd.adamw
// CHECK:       %[[A:.*]] = sd.concat %[[P0]], %[[P1]] {axis = 0 : i64}
// CHECK:       sd.global_store %[[A]], @a.lora_A.weight
// CHECK:       sd.adamw {{.*}} : (tensor<3x2xf32>
// CHECK:       sd.adamw {{.*}} : (tensor<3x2xf32>
// CHECK:       %[[BW:.*]] = sd.concat %{{.*}}, %{{.*}} {axis = 1 : i64}
// CHECK:       sd.global_store %[[BW]], @a.lora_B.weight
// CHECK:       %[[ZERO:.*]] = sd.expand {{.*}} -> tensor<2xf32>
// CHECK:       sd.global_store %[[ZERO]], @"dylora.drawn/a"
module {
  sd.global @a.weight "trainable" : tensor<3x4xf32>
  func.func @eval_step(%x: tensor<5x4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %w = sd.global_load @a.weight : tensor<3x4xf32>
    %n = sd.none
    %y = sd.linear %x, %w, %n {layout = "oi", module = "a"} : (tensor<5x4xf32>, tensor<3x4xf32>, none) -> tensor<5x3xf32>
    %axes = sd.constant dense<[0, 1]> : tensor<2xi64>
    %l = sd.reduce_sum %y, %axes {keepdims = 0 : i64} : (tensor<5x3xf32>, tensor<2xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}
