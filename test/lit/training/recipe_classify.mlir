// RUN: sd-opt %s --sd-recipe-classify="num-labels=3" | FileCheck %s
// RUN: sd-opt %s --sd-recipe-classify="num-labels=3 pooling=cls" | FileCheck %s --check-prefix=CLS
// RUN: not sd-opt %s --sd-recipe-classify 2>&1 | FileCheck %s --check-prefix=NOLABELS
// RUN: not sd-opt %s --sd-recipe-classify="num-labels=3 features-output=nope" 2>&1 | FileCheck %s --check-prefix=NOPE

// A trainable head (nn.Linear's shapes) on the hidden states pooled by the
// mean over attention_mask (clamped at 1e-9), which stays an input;
// token_type_ids becomes zeros. infer returns the class logits; eval_step
// adds one label per row and the summed cross-entropy over counted rows.
// CHECK-DAG:   sd.global @classifier.weight "trainable" : tensor<3x4xf32>
// CHECK-DAG:   sd.global @classifier.bias "trainable" : tensor<3xf32>
// CHECK-LABEL: func.func @eval_step
// CHECK-SAME:  %[[IDS:.*]]: tensor<?x?xi64> {sd.dim_params = ["batch", "seq"], sd.name = "input_ids"}
// CHECK-SAME:  %[[MASK:.*]]: tensor<?x?xi64> {sd.dim_params = ["batch", "seq"], sd.name = "attention_mask"}
// CHECK-SAME:  %[[LABELS:.*]]: tensor<?xi64> {sd.dim_params = ["batch"], sd.name = "labels"}
// CHECK-SAME:  sd.output_names = ["loss_sum", "tokens"]
// CHECK:       sd.cast %[[MASK]]
// CHECK:       sd.reduce_sum
// CHECK:       sd.max
// CHECK:       %[[POOLED:.*]] = sd.div
// CHECK:       %[[LOGITS:.*]] = sd.linear %[[POOLED]], %{{.*}}, %{{.*}} {layout = "oi", module = "classifier"} : (tensor<?x4xf32>, tensor<3x4xf32>, tensor<3xf32>) -> tensor<?x3xf32>
// CHECK:       %[[LOSS:.*]] = sd.softmax_cross_entropy_loss %[[LOGITS]], %[[LABELS]], %{{.*}} {ignore_index = -100 : i64, reduction = "sum"}
// CHECK:       return %[[LOSS]], %{{.*}} : tensor<f32>, tensor<f32>
// CHECK-LABEL: func.func @infer
// CHECK-SAME:  sd.output_names = ["logits"]
// CLS:         sd.slice
// CLS:         sd.linear {{.*}} module = "classifier"
// NOLABELS:    --recipe classify needs --num-labels N with N >= 2, got 0
// NOPE:        --features-output 'nope' is not an output of the model (the model's outputs: 'last_hidden_state')
module {
  sd.global @emb "frozen" : tensor<10x4xf32>
  func.func @infer(%ids: tensor<?x?xi64> {sd.name = "input_ids", sd.dim_params = ["batch", "seq"]},
                   %mask: tensor<?x?xi64> {sd.name = "attention_mask", sd.dim_params = ["batch", "seq"]},
                   %types: tensor<?x?xi64> {sd.name = "token_type_ids", sd.dim_params = ["batch", "seq"]})
      -> tensor<?x?x4xf32> attributes {sd.entry = "infer", sd.output_names = ["last_hidden_state"]} {
    %e = sd.global_load @emb : tensor<10x4xf32>
    %h = sd.gather %e, %ids : (tensor<10x4xf32>, tensor<?x?xi64>) -> tensor<?x?x4xf32>
    %t = sd.gather %e, %types : (tensor<10x4xf32>, tensor<?x?xi64>) -> tensor<?x?x4xf32>
    %y = sd.add %h, %t : (tensor<?x?x4xf32>, tensor<?x?x4xf32>) -> tensor<?x?x4xf32>
    return %y : tensor<?x?x4xf32>
  }
}
