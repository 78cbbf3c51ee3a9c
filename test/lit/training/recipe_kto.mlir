// RUN: sd-opt %s --sd-recipe-preference="method=kto beta=0.5 undesirable-weight=2" | FileCheck %s
// RUN: sd-opt %s --sd-recipe-preference="method=kto beta=0.5 undesirable-weight=2" --sd-specialize="shapes=input_ids=4x3" --sd-propagate-shapes --sd-autodiff | FileCheck %s --check-prefix=GRAD

// KTO: each example's rows (row 2i the example, 2i+1 its KL row) scored
// under the model and the reference copy; a new `desirable` [batch] input.
// CHECK:       sd.global @"reference/head.weight" "scalar_state"
// CHECK-LABEL: func.func @eval_step
// CHECK-SAME:  %{{.*}}: tensor<?xi64> {sd.dim_params = ["batch"], sd.name = "desirable"}
// CHECK:       sd.global_load @"reference/head.weight"
// CHECK:       %[[RATIO:.*]] = sd.sub
// The KL estimate: the KL rows' mean log-ratio over counted examples,
// clamped at 0 and detached (a stop-gradient), then z = beta (ratio - KL).
// CHECK:       %[[KL:.*]] = sd.max %{{.*}}, %{{.*}} {sd.detached}
// CHECK:       %[[D:.*]] = sd.sub %{{.*}}, %[[KL]]
// CHECK:       sd.constant dense<5.000000e-01>
// CHECK:       sd.equal
// desirable 1 - sigmoid(z) = sigmoid(-z), undesirable 2 x sigmoid(z).
// CHECK:       sd.neg
// CHECK:       sd.sigmoid
// CHECK:       sd.sigmoid
// CHECK:       sd.constant dense<2.000000e+00>
// CHECK:       sd.where
// CHECK:       return
// The training entry keeps the detached KL estimate (sd-autodiff stops the
// gradient there: detached_load.mlir), and the head gets its gradient.
// GRAD-LABEL:  func.func @accumulate
// GRAD-SAME:   %{{.*}}: tensor<4xi64> {sd.dim_params = ["batch"], sd.name = "desirable"}
// GRAD:        sd.max {{.*}} {sd.detached}
// GRAD:        sd.global_store %{{.*}}, @"grad/head.weight"
module {
  sd.global @emb "frozen" : tensor<8x4xf32>
  sd.global @head.weight "trainable" : tensor<8x4xf32> = dense<1.0> : tensor<8x4xf32>
  func.func @infer(%ids: tensor<?x?xi64> {sd.name = "input_ids", sd.dim_params = ["batch", "seq"]}) -> tensor<?x?x8xf32>
      attributes {sd.entry = "infer", sd.output_names = ["logits"]} {
    %e = sd.global_load @emb : tensor<8x4xf32>
    %h = sd.gather %e, %ids : (tensor<8x4xf32>, tensor<?x?xi64>) -> tensor<?x?x4xf32>
    %w = sd.global_load @head.weight : tensor<8x4xf32>
    %none = sd.none
    %l = sd.linear %h, %w, %none {layout = "oi", module = "head"} : (tensor<?x?x4xf32>, tensor<8x4xf32>, none) -> tensor<?x?x8xf32>
    return %l : tensor<?x?x8xf32>
  }
}
