// RUN: sd-opt %s --sd-recipe-sft | FileCheck %s

// eval_step = infer + labels shifted left (last position -100) + summed
// cross-entropy over counted positions, and the count of those positions.
// CHECK-LABEL: func.func @eval_step
// CHECK-SAME:  %[[IDS:.*]]: tensor<?x?xi64> {sd.dim_params = ["batch", "seq"], sd.name = "input_ids"}
// CHECK-SAME:  %[[LABELS:.*]]: tensor<?x?xi64> {sd.dim_params = ["batch", "seq"], sd.name = "labels"}
// CHECK-SAME:  sd.entry = "eval_step"
// CHECK-SAME:  sd.output_names = ["loss_sum", "tokens"]
// CHECK:       %[[SHIFT:.*]] = sd.slice %[[LABELS]]
// CHECK:       sd.pad %[[SHIFT]]
// CHECK:       %[[LOSS:.*]] = sd.softmax_cross_entropy_loss {{.*}} {ignore_index = -100 : i64, reduction = "sum"}
// CHECK:       sd.equal
// CHECK:       sd.not
// CHECK:       %[[TOK:.*]] = sd.reduce_sum
// CHECK:       return %[[LOSS]], %[[TOK]]
// CHECK-LABEL: func.func @infer
module {
  sd.global @emb "trainable" : tensor<8x4xf32>
  func.func @infer(%ids: tensor<?x?xi64> {sd.name = "input_ids", sd.dim_params = ["batch", "seq"]}) -> tensor<?x?x8xf32>
      attributes {sd.entry = "infer", sd.output_names = ["logits"]} {
    %e = sd.global_load @emb : tensor<8x4xf32>
    %h = sd.gather %e, %ids : (tensor<8x4xf32>, tensor<?x?xi64>) -> tensor<?x?x4xf32>
    %none = sd.none
    %l = sd.linear %h, %e, %none {layout = "oi", module = "head"} : (tensor<?x?x4xf32>, tensor<8x4xf32>, none) -> tensor<?x?x8xf32>
    return %l : tensor<?x?x8xf32>
  }
}
