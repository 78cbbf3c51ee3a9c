// RUN: sd-opt %s --split-input-file --sd-lora-slots="max-loras=2" | FileCheck %s

// Each adapter product of an entry reads the stacks at each row's slot: the
// entry takes lora_ids [batch], A [r, in] and B [out, r] become slot stacks
// [3, in, r] and [3, r, out], and x A^T a batched product with the rows'
// gathered slots. The scale and the sum stay; max_loras joins sd.peft.
// CHECK: module attributes {sd.peft = {max_loras = 2 : i64, modules = ["q"], peft_type = "LORA"}}
// CHECK-NOT: sd.global @q.lora_A.weight
// CHECK-DAG: sd.global @q.lora_A.slots "trainable" : tensor<3x4x2xf32>
// CHECK-DAG: sd.global @q.lora_B.slots "trainable" : tensor<3x2x5xf32>
// CHECK-LABEL: func.func @decode
//  CHECK-SAME: %arg2: tensor<2xi64> {sd.name = "lora_ids"}
//       CHECK:   %[[Y:.*]] = sd.linear %arg0, {{.*}} {layout = "io", module = "q"}
//       CHECK:   %[[SA:.*]] = sd.global_load @q.lora_A.slots : tensor<3x4x2xf32>
//       CHECK:   %[[GA:.*]] = sd.gather %[[SA]], %arg2 {axis = 0 : i64} : (tensor<3x4x2xf32>, tensor<2xi64>) -> tensor<2x4x2xf32>
//       CHECK:   %[[DOWN:.*]] = sd.matmul %arg0, %[[GA]] : (tensor<2x1x4xf32>, tensor<2x4x2xf32>) -> tensor<2x1x2xf32>
//       CHECK:   %[[SB:.*]] = sd.global_load @q.lora_B.slots : tensor<3x2x5xf32>
//       CHECK:   %[[GB:.*]] = sd.gather %[[SB]], %arg2 {axis = 0 : i64} : (tensor<3x2x5xf32>, tensor<2xi64>) -> tensor<2x2x5xf32>
//       CHECK:   %[[UP:.*]] = sd.matmul %[[DOWN]], %[[GB]] : (tensor<2x1x2xf32>, tensor<2x2x5xf32>) -> tensor<2x1x5xf32>
//       CHECK:   %[[S:.*]] = sd.mul %[[UP]], %{{.*}}
//       CHECK:   sd.add %[[Y]], %[[S]]
//   CHECK-NOT:   sd.linear
module attributes {sd.peft = {modules = ["q"], peft_type = "LORA"}} {
  sd.global @w "frozen" : tensor<4x5xf32> = dense<1.0> : tensor<4x5xf32>
  sd.global @q.lora_A.weight "trainable" : tensor<2x4xf32> = dense<0.5> : tensor<2x4xf32>
  sd.global @q.lora_B.weight "trainable" : tensor<5x2xf32> = dense<0.0> : tensor<5x2xf32>
  func.func @decode(%x: tensor<2x1x4xf32>, %ids: tensor<2x1xi64> {sd.name = "input_ids"}) -> tensor<2x1x5xf32> attributes {sd.entry = "decode"} {
    %w = sd.global_load @w : tensor<4x5xf32>
    %none = sd.none
    %y = sd.linear %x, %w, %none {layout = "io", module = "q"} : (tensor<2x1x4xf32>, tensor<4x5xf32>, none) -> tensor<2x1x5xf32>
    %scale = sd.constant dense<2.0> : tensor<f32>
    %a = sd.global_load @q.lora_A.weight : tensor<2x4xf32>
    %b = sd.global_load @q.lora_B.weight : tensor<5x2xf32>
    %d = sd.linear %x, %a, %none {layout = "oi", module = "q.lora_A"} : (tensor<2x1x4xf32>, tensor<2x4xf32>, none) -> tensor<2x1x2xf32>
    %u = sd.linear %d, %b, %none {layout = "oi", module = "q.lora_B"} : (tensor<2x1x2xf32>, tensor<5x2xf32>, none) -> tensor<2x1x5xf32>
    %s = sd.mul %u, %scale : (tensor<2x1x5xf32>, tensor<f32>) -> tensor<2x1x5xf32>
    %sum = sd.add %y, %s : (tensor<2x1x5xf32>, tensor<2x1x5xf32>) -> tensor<2x1x5xf32>
    return %sum : tensor<2x1x5xf32>
  }
}

// -----

// An entry without adapter products (a training plan's apply) takes no lora_ids.
// CHECK-LABEL: func.func @apply()
//   CHECK-NOT: lora_ids
module attributes {sd.peft = {modules = ["q"], peft_type = "LORA"}} {
  sd.global @q.lora_A.weight "trainable" : tensor<2x4xf32> = dense<0.5> : tensor<2x4xf32>
  sd.global @q.lora_B.weight "trainable" : tensor<5x2xf32> = dense<0.0> : tensor<5x2xf32>
  func.func @apply() attributes {sd.entry = "apply"} {
    return
  }
}
